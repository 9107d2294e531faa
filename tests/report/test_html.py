"""``Report.to_html`` (spec §4.7, F55; issue #6 item 6): a self-contained page whose plots
render in headless Chromium.

The browser test needs the Debian packages ``chromium`` and ``chromium-driver`` (``.ci/run``
installs them). Without them it is skipped on a developer machine and fails under CI
(``CI=true``), so a missing install step cannot hide behind a green run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.memory import PLANNER_TEMPORARIES, REMOTE_BUFFERS
from popart_backend.report.html import html_report, live_bytes_curve

CHROMIUM = "/usr/bin/chromium"
# Plots are matplotlib SVGs; each must hold drawn shapes and take room on the page.
N_PLOTS = 4
_PLOT_COLOUR = (0x4E, 0x79, 0xA7)  # weights / op spans / tile bars (report/html.py)


def _session():
    """A 2-layer training model split over 2 IPUs of 16 tiles, profiled, after one run."""
    rng = np.random.default_rng(0)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 32]), "x")
    with builder.virtualGraph(0):
        w0 = builder.addInitializedInputTensor(rng.standard_normal((32, 64)).astype(np.float32))
        h = builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w0])])
    with builder.virtualGraph(1):
        w1 = builder.addInitializedInputTensor(rng.standard_normal((64, 8)).astype(np.float32))
        y = builder.aiOnnx.matmul([h, w1])
        loss = builder.aiGraphcore.l1loss([y], 0.1)
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 16})
    session = popart.TrainingSession(
        builder.getModelProto(), popart.DataFlow(2, {loss: popart.AnchorReturnType("All")}),
        loss, popart.SGD({"defaultLearningRate": (0.01, False),
                          "defaultMomentum": (0.9, False)}),
        device, userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": rng.standard_normal((2, 4, 32)).astype(np.float32)},
                                anchors))
    return session


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    report = _session().getReport()
    path = tmp / "report.html"
    report.to_html(path)
    return report, path


def test_page_is_self_contained(report_page):
    report, path = report_page
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == N_PLOTS
    # Nothing is fetched: no scripts, stylesheets, images or frames, and the only URLs are the
    # SVG namespaces (names, not fetched).
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    urls = set(re.findall(r"https?://[^\"' )<]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "inline SVG ids must not clash"
    # The numbers and tables come from the same model as the JSON report.
    data = report.to_dict()
    assert f"{data['execution']['cyclesPerStep']}" in page
    for ipu in data["compilation"]["ipus"]:
        assert f"IPU {ipu['ipu']}" in page
        assert ipu["largestTensors"][0]["id"] in page
    # Same model, same page (fixed SVG hash salt, no date).
    assert html_report(report.model, report.runs) == page


def test_liveness_curve_matches_memory_model(report_page):
    """The plotted live bytes peak at what the memory model finds live at its peak, per IPU."""
    report, _ = report_page
    length = max(o.position for o in report.model.cycles.ops) + 1
    assert len(report.model.memory.ipus) == 2
    for m in report.model.memory.ipus:
        curve = live_bytes_curve(m, length)
        peak = (m.categories["activations"] + m.categories[REMOTE_BUFFERS]
                + m.categories[PLANNER_TEMPORARIES])
        assert curve.min() >= 0 and peak > 0
        assert int(curve.max()) == peak
        assert int(curve[m.peak_position]) == peak


# Appended to a copy of the page: records, per inline SVG, its laid-out size and how many
# drawn shapes it holds, in an element --dump-dom prints.
_PROBE = """<script>
const plots = [...document.querySelectorAll('section.plot svg')].map(svg => {
  const box = svg.getBoundingClientRect();
  const shapes = svg.querySelectorAll('path, use, rect, image');
  let drawn = 0;
  for (const s of shapes) { const b = s.getBBox(); if (b.width > 0 || b.height > 0) drawn++; }
  return {width: box.width, height: box.height, shapes: shapes.length, drawn: drawn};
});
const out = document.createElement('pre');
out.id = 'render-probe';
out.textContent = JSON.stringify(plots);
document.body.appendChild(out);
</script>"""


def _chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    if not os.path.exists(CHROMIUM) and not shutil.which("chromium"):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed: .ci/run must install the Debian packages "
                        "'chromium' and 'chromium-driver'")
        pytest.skip("chromium is not installed (apt-get install chromium chromium-driver)")
    exe = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--no-default-browser-check", "--mute-audio",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    return result


def test_plots_render_in_headless_chromium(report_page, tmp_path):
    _, path = report_page
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                      encoding="utf-8")
    dom = _chromium(tmp_path, "--dump-dom", probed.as_uri()).stdout
    found = re.search(r'<pre id="render-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run; DOM starts with: {dom[:500]}"
    plots = json.loads(found.group(1).replace("&quot;", '"'))
    assert len(plots) == N_PLOTS
    for n, plot in enumerate(plots):
        assert plot["width"] > 200 and plot["height"] > 100, (n, plot)
        assert plot["drawn"] >= 10, (n, plot)


def test_screenshot_shows_the_plots(report_page, tmp_path):
    """The painted page holds the plots' colour over a large area, not a blank page."""
    from PIL import Image

    _, path = report_page
    shot = tmp_path / "page.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,3200", path.as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    plot_coloured = np.all(np.abs(pixels.astype(int) - _PLOT_COLOUR) <= 8, axis=1).sum()
    non_white = np.any(pixels < 240, axis=1).sum()
    assert plot_coloured > 2000, plot_coloured
    assert non_white > 0.05 * len(pixels), non_white
