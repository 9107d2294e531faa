"""Sphinx extension of the documentation site: pages generated from the code's own tables.

Directives:

- ``api-reference MODULE``: an autodoc entry for every public name of MODULE
  (``public_names``); used by the API reference pages (reStructuredText).
- ``setter-status``: the ``poptorch_lite.Options`` setters that differ from PopTorch
  (``poptorch_lite/options/status.py``).
- ``option-status``: the ``popart_backend.SessionOptions`` fields that differ from PopART
  (``popart_backend/options/checks.py``).
- ``unsupported-ops``: the ai.onnx op types no opset can use (``getUnsupportedOperations``).
- ``runnable``: Python code that runs while the docs build; the page shows the code and what it
  printed, and the build fails when the code raises or warns. The blocks of one page share one
  namespace, in page order.

The docstrings autodoc renders lose their developer-only references (section marks, feature ids,
issue numbers): ``strip_citations``.

tests/docs/ imports ``public_names`` and ``differing_names`` from here, so the tests and the
pages agree on what "public" and "differs" mean.
"""

from __future__ import annotations

import contextlib
import io
import re
import traceback
import types
import warnings
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

# --------------------------------------------------------------------------------------------
# What the tests share with the pages
# --------------------------------------------------------------------------------------------

#: Public modules documented besides the packages' top levels (PopTorch's ``poptorch.optim``,
#: PopART's ``popart.custom``).
API_MODULES = {
    "popart_backend": ("popart_backend", "popart_backend.custom"),
    "poptorch_lite": ("poptorch_lite", "poptorch_lite.optim"),
}


def public_names(module_name: str) -> list[str]:
    """The public names of a module: its ``__all__`` when it has one, else every name of ``dir``
    without a leading underscore, less submodules and ``from __future__`` features."""
    module = __import__(module_name, fromlist=["_"])
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    out = []
    for name in names:
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) or type(value).__name__ == "_Feature":
            continue
        if module_name == "poptorch_lite.optim" and not (
                isinstance(value, type) and value.__module__.startswith("poptorch_lite")):
            continue  # helpers and torch re-exports of the optimizer module
        out.append(name)
    return sorted(out)


def differing_setters() -> dict[str, tuple[str, str]]:
    """poptorch_lite.Options setter -> (status, what happens) for every setter not built as in
    PopTorch: no effect, refused, deprecated, or handed to a SessionOptions field that is not
    built in both session kinds."""
    from popart_backend.options.checks import BuildState, option_status
    from poptorch_lite.options.status import SETTER_STATUS, SetterState

    out = {}
    for name, status in SETTER_STATUS.items():
        if status.state is SetterState.BUILT:
            continue
        if status.state is SetterState.BACKEND:
            field = status.note
            inf, tr = option_status(field, False), option_status(field, True)
            if inf.state is BuildState.BUILT and tr.state is BuildState.BUILT:
                continue
            parts = [f"{kind}: {s.state.value}" + (f" ({s.note})" if s.note else "")
                     for kind, s in (("inference", inf), ("training", tr))]
            out[name] = (f"through SessionOptions.{field}",
                         "; ".join(parts) if inf != tr else parts[0].split(": ", 1)[1])
        else:
            out[name] = (status.state.value, status.note)
    return out


def differing_options() -> dict[str, tuple[str, str, str, str]]:
    """SessionOptions field -> (inference state, inference note, training state, training note)
    for every field that is not built in both session kinds."""
    from popart_backend.options.checks import OPTION_STATUS, BuildState, option_status

    out = {}
    for name in OPTION_STATUS:
        inf, tr = option_status(name, False), option_status(name, True)
        if inf.state is BuildState.BUILT and tr.state is BuildState.BUILT:
            continue
        out[name] = (inf.state.value, inf.note, tr.state.value, tr.note)
    return out


def unsupported_ops() -> list[str]:
    """ai.onnx op types some opset from 6 to the installed onnx package's cannot use."""
    import onnx.defs

    import popart_backend

    names: set[str] = set()
    for opset in range(6, onnx.defs.onnx_opset_version() + 1):
        names.update(popart_backend.getUnsupportedOperations(opset))
    return sorted(names)


def differing_names() -> set[str]:
    """Every name the migration page must list."""
    return set(differing_setters()) | set(differing_options()) | set(unsupported_ops())


# --------------------------------------------------------------------------------------------
# Docstrings
# --------------------------------------------------------------------------------------------

_CITATION = r"(?:spec\s*§\s*[\d.]+\w*|§\s?\d[\d.]*\w*|\b[FP]\d{1,3}\b|issues?\s*#\d+|#\d+)"
_PAREN = re.compile(r"\s*\((?:[^()]*?" + _CITATION + r")[^()]*\)")
_BARE = re.compile(r"(?:,\s*)?" + _CITATION + r"(?:\s*,)?")


def strip_citations(text: str) -> str:
    """``text`` without developer-only citations: parentheses citing one go whole, bare ones
    alone."""
    text = _PAREN.sub("", text)
    return _BARE.sub("", text)


def _clean_docstring(app, what, name, obj, options, lines):
    for i, line in enumerate(lines):
        lines[i] = strip_citations(line)


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _cell(content) -> nodes.entry:
    entry = nodes.entry()
    para = nodes.paragraph()
    if isinstance(content, nodes.Node):
        para += content
    else:
        para += nodes.Text(str(content))
    entry += para
    return entry


def _table(headers: list[str], rows: list[list], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["generated-table"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    row = nodes.row()
    for header in headers:
        row += _cell(header)
    head += row
    group += head
    body = nodes.tbody()
    for cells in rows:
        row = nodes.row()
        for content in cells:
            row += _cell(content)
        body += row
    group += body
    return table


class SetterStatusDirective(SphinxDirective):
    """The Options setters whose status is not "built" (no effect, refused, deprecated, or
    handed to a SessionOptions field)."""

    def run(self):
        rows = [[nodes.literal(text=f"Options.{name}"), state, strip_citations(meaning)]
                for name, (state, meaning) in sorted(differing_setters().items())]
        return [_table(["setter", "status", "what happens here"], rows, [30, 20, 50])]


class OptionStatusDirective(SphinxDirective):
    """The SessionOptions fields that are not built in inference or in training. ``:training:``
    lists those built in training sessions (no effect in inference only), the default the
    rest."""

    option_spec: ClassVar[dict] = {"training": directives.flag}

    def run(self):
        rows = []
        built_in_training = "training" in self.options
        for name, (inf, inf_note, tr, tr_note) in sorted(differing_options().items()):
            if (tr == "built") is not built_in_training:
                continue
            if built_in_training:
                rows.append([nodes.literal(text=name), strip_citations(inf_note)])
                continue
            if (inf, inf_note) == (tr, tr_note):
                status, why = inf, inf_note
            else:
                status = f"inference: {inf}; training: {tr}"
                why = "; ".join(f"{kind}: {note}" for kind, note in
                                (("inference", inf_note), ("training", tr_note)) if note)
            rows.append([nodes.literal(text=name), status, strip_citations(why)])
        if built_in_training:
            return [_table(["SessionOptions field", "why it has no effect in inference"], rows,
                           [35, 65])]
        return [_table(["SessionOptions field", "status", "why"], rows, [30, 20, 50])]


class UnsupportedOpsDirective(SphinxDirective):
    def run(self):
        names = unsupported_ops()
        para = nodes.paragraph()
        if not names:
            para += nodes.Text("None: every ai.onnx op type of every opset the installed onnx "
                               "package defines resolves to an implementation.")
            return [para]
        para += nodes.Text("Op types some ai.onnx opset cannot use: ")
        for i, name in enumerate(names):
            if i:
                para += nodes.Text(", ")
            para += nodes.literal(text=name)
        para += nodes.Text(".")
        return [para]


# --------------------------------------------------------------------------------------------
# API reference
# --------------------------------------------------------------------------------------------


#: Classes listed without their members: the Builder's opset classes have one method per op
#: (the supported operations page lists them) and would make the page huge and slow to build.
_NO_MEMBERS = re.compile(r"Ai\w*Opset\d+$")


def _autodoc_directive(module_name: str, name: str, also: dict[int, str]) -> list[str]:
    module = __import__(module_name, fromlist=["_"])
    value = getattr(module, name)
    full = f"{module_name}.{name}"
    if id(value) in also:  # the same object is documented under another name
        return [f".. py:data:: {name}", "",
                f"   The same object as :py:obj:`{also[id(value)]}`.", ""]
    if isinstance(value, type):
        if _NO_MEMBERS.match(name):
            return [f".. autoclass:: {full}", "",
                    "   One method per operator of this opset: see :doc:`supported_ops`.", ""]
        return [f".. autoclass:: {full}", "   :members:", ""]
    if callable(value):
        return [f".. autofunction:: {full}", ""]
    return [f".. autodata:: {full}", "   :annotation:", ""]


class ApiReferenceDirective(SphinxDirective):
    """Autodoc entries for every public name of a module, classes first."""

    required_arguments = 1
    option_spec: ClassVar[dict] = {"same-as": directives.unchanged}

    def run(self):
        module_name = self.arguments[0]
        module = __import__(module_name, fromlist=["_"])
        names = public_names(module_name)
        also: dict[int, str] = {}
        if "same-as" in self.options:  # names documented on another page or section
            other_name = self.options["same-as"]
            other = __import__(other_name, fromlist=["_"])
            also = {id(getattr(other, n)): f"{other_name}.{n}" for n in public_names(other_name)
                    if isinstance(getattr(other, n), type) or callable(getattr(other, n))}
        kinds = {"classes": [], "functions": [], "data": []}
        for name in names:
            value = getattr(module, name)
            kind = ("classes" if isinstance(value, type)
                    else "functions" if callable(value) else "data")
            kinds[kind].append(name)
        lines = [f".. currentmodule:: {module_name}", ""]
        for kind, title in (("classes", "Classes"), ("functions", "Functions"),
                            ("data", "Other names")):
            if not kinds[kind]:
                continue
            lines += [f".. rubric:: {title}", ""]
            for name in kinds[kind]:
                lines += _autodoc_directive(module_name, name, also)
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=f"<api-reference {module_name}>"),
                                self.content_offset, container)
        return container.children


# --------------------------------------------------------------------------------------------
# Runnable examples
# --------------------------------------------------------------------------------------------


class RunnableDirective(SphinxDirective):
    """Run the block's Python code now; show it and its printed output."""

    has_content = True
    option_spec: ClassVar[dict] = {"hide-output": directives.flag}

    def run(self):
        code = "\n".join(self.content)
        namespaces = self.env.temp_data.setdefault("runnable_namespaces", {})
        namespace = namespaces.setdefault(self.env.docname, {"__name__": "__docs__"})
        out = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            try:
                # The page's own example code, run as the reader would run it.
                exec(compile(code, f"<{self.env.docname} example>", "exec"), namespace)  # noqa: S102
            except Exception:  # noqa: BLE001 - any failure fails the build (-W)
                raise self.error(f"this example no longer runs:\n{code}\n\n"
                                 f"{traceback.format_exc()}") from None
        shown = [w for w in caught if issubclass(w.category, UserWarning)]
        if shown:
            raise self.error(f"this example warns ({shown[0].category.__name__}: "
                             f"{shown[0].message}):\n{code}")
        block = nodes.literal_block(code, code, language="python")
        result = [block]
        printed = out.getvalue().rstrip()
        if printed and "hide-output" not in self.options:
            para = nodes.paragraph()
            para += nodes.emphasis(text="Output (produced when these docs were built):")
            result += [para, nodes.literal_block(printed, printed, language="text")]
        return result


def _forget_namespaces(app, env, docname):
    env.temp_data.get("runnable_namespaces", {}).pop(docname, None)


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")  # api-reference emits autodoc directives
    app.add_directive("api-reference", ApiReferenceDirective)
    app.add_directive("setter-status", SetterStatusDirective)
    app.add_directive("option-status", OptionStatusDirective)
    app.add_directive("unsupported-ops", UnsupportedOpsDirective)
    app.add_directive("runnable", RunnableDirective)
    app.connect("autodoc-process-docstring", _clean_docstring)
    app.connect("env-purge-doc", _forget_namespaces)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
