"""The documentation site builds with warnings as errors, renders every page, runs its examples,
documents every public name, and lists every option and name the code's own tables mark as
behaving differently from PopTorch / PopART."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")
pytest.importorskip("furo")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import popsim_docs

# Citations users cannot follow: spec sections, feature ids, issue numbers. (A bare "§3" is
# allowed: device_model.md numbers its own sections.)
INTERNAL = re.compile(r"spec §|\b[FP]\d{1,3}\b|issues? #\d")


def _sphinx(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-E", "-b", "html", *extra, str(source),
         str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = _sphinx(DOCS, out)
    assert result.returncode == 0, f"sphinx -W failed:\n{result.stderr[-6000:]}"
    return out


def _sources() -> list[str]:
    return sorted(p.relative_to(DOCS).with_suffix("").as_posix()
                  for p in [*DOCS.glob("*.md"), *DOCS.glob("*.rst")])


def _text(page: Path) -> str:
    """The visible text of the page's article (no navigation, scripts or tags)."""
    source = page.read_text()
    article = re.search(r"<article[^>]*>(.*?)</article>", source, re.DOTALL)
    body = article.group(1) if article else source
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_every_page_renders(site):
    pages = _sources()
    assert {"index", "getting_started", "guide_poptorch", "guide_popart", "migration",
            "device_model", "performance", "security", "api_popart", "api_poptorch",
            "architecture", "training", "options", "patterns", "supported_ops"} <= set(pages)
    for page in pages:
        rendered = site / f"{page}.html"
        assert rendered.is_file(), page
        assert "<h1>" in rendered.read_text(), page
    index = (site / "index.html").read_text()
    for page in pages:
        if page != "index":
            assert f'href="{page}.html"' in index, f"{page} is not linked from the index"


def test_api_reference_documents_every_public_name(site):
    for package, modules in popsim_docs.API_MODULES.items():
        page = (site / f"api_{package.split('_')[0]}.html").read_text()
        for module in modules:
            names = popsim_docs.public_names(module)
            assert names, module
            missing = [n for n in names if f'id="{module}.{n}"' not in page]
            assert missing == [], f"{module}: not in the API reference: {missing}"


def test_public_names_cover_the_packages():
    """The reference's notion of "public" is the packages' own: every name a user can import
    from the top level that is not a submodule."""
    import popart_backend
    import poptorch_lite

    for package in (popart_backend, poptorch_lite):
        listed = set(popsim_docs.public_names(package.__name__))
        expected = {n for n in dir(package) if not n.startswith("_")
                    and type(getattr(package, n)).__name__ not in ("module", "_Feature")}
        assert listed == expected
    assert {"InferenceSession", "TrainingSession", "SessionOptions", "Builder"} <= set(
        popsim_docs.public_names("popart_backend"))
    assert {"trainingModel", "inferenceModel", "Options", "DataLoader"} <= set(
        popsim_docs.public_names("poptorch_lite"))


def test_migration_page_lists_every_differing_name(site):
    page = (site / "migration.html").read_text()
    setters = popsim_docs.differing_setters()
    options = popsim_docs.differing_options()
    assert setters and options  # the tables are read, not empty by accident
    missing = [f"Options.{n}" for n in setters
               if f'<span class="pre">Options.{n}</span>' not in page]
    missing += [n for n in options if f'<span class="pre">{n}</span>' not in page]
    missing += [n for n in popsim_docs.unsupported_ops()
                if f'<span class="pre">{n}</span>' not in page]
    assert missing == []


def test_differing_names_follow_the_status_tables():
    """A setter or option counts as differing exactly when its status is not built."""
    from popart_backend.options.checks import OPTION_STATUS, BuildState, option_status
    from poptorch_lite.options.status import SETTER_STATUS, SetterState

    for name, status in SETTER_STATUS.items():
        if status.state in (SetterState.NO_EFFECT, SetterState.REFUSED, SetterState.DEPRECATED):
            assert name in popsim_docs.differing_setters(), name
        if status.state is SetterState.BUILT:
            assert name not in popsim_docs.differing_setters(), name
    for name in OPTION_STATUS:
        built = all(option_status(name, t).state is BuildState.BUILT for t in (False, True))
        assert (name in popsim_docs.differing_options()) is (not built), name


def test_examples_ran_during_the_build(site):
    for page in ("getting_started", "guide_poptorch", "guide_popart"):
        text = _text(site / f"{page}.html")
        assert "Output (produced when these docs were built)" in text, page
    assert "estimates" in _text(site / "getting_started.html")


def test_pages_cite_no_internal_references(site):
    found = {}
    for page in _sources():
        hits = INTERNAL.findall(_text(site / f"{page}.html"))
        if hits:
            found[page] = hits[:5]
    assert found == {}


def test_strip_citations():
    assert popsim_docs.strip_citations("Run it (spec §6.2, F12).") == "Run it."
    assert popsim_docs.strip_citations("cycles (issue #3) of a run") == "cycles of a run"
    assert popsim_docs.strip_citations("plain (text) stays") == "plain (text) stays"


def test_an_example_that_fails_fails_the_build(tmp_path):
    """A page whose example raises (or warns) cannot build."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS / '_ext')!r})\n"
        "extensions = ['myst_parser', 'popsim_docs']\n")
    (source / "index.md").write_text("# Page\n\n```{runnable}\nprint(1 + 1)\n```\n")
    assert _sphinx(source, tmp_path / "ok").returncode == 0
    (source / "index.md").write_text("# Page\n\n```{runnable}\nraise ValueError('stale')\n```\n")
    failed = _sphinx(source, tmp_path / "raises")
    assert failed.returncode != 0 and "stale" in failed.stderr
    (source / "index.md").write_text(
        "# Page\n\n```{runnable}\nimport warnings\nwarnings.warn('dropped samples')\n```\n")
    warned = _sphinx(source, tmp_path / "warns")
    assert warned.returncode != 0 and "dropped samples" in warned.stderr
