"""``Report.to_html(path)``: one self-contained HTML page with the profile's plots.

The plots are drawn by matplotlib into SVG and inlined in the page, so it needs no network,
no script and no file beside it: memory per IPU by category (stacked bars), memory per tile of
each IPU, live activation bytes over the schedule, and the timeline of one step per IPU (the
spans of the Chrome trace, report/trace.py: a pipelined step shows its cycle table, each IPU's
stages, copies and syncs per cycle). Tables give the summary numbers and the largest
tensors; the summary text of ``getSummaryReport()`` closes the page.

matplotlib is imported here only, when a page is written, so importing ``popart_backend``
stays fast.
"""

from __future__ import annotations

import html
import io
import re

import numpy as np

from ..device.analysis import DeviceModel
from ..device.memory import CATEGORIES, IpuMemory, format_bytes
from ..files import write_text_atomic
from .summary import summary_text
from .trace import HOST_TRACK, LINK_TRACK, chrome_trace

__all__ = ["html_report", "live_bytes_curve", "timeline_spans", "write_html"]

# One colour per memory category (by its place in CATEGORIES, so a new category gets one too)
# and per timeline span kind, stable across plots.
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#d37295", "#8cd17d", "#b6992d",
            "#499894", "#79706e")
_SPAN_COLOURS = {"op": "#4e79a7", "stage": "#76b7b2", "fragment": "#a0cbe8", "link": "#f28e2b",
                 "copy": "#ffbe7d", "host": "#59a14f", "sync": "#bab0ac"}
# A limit line (capacity, tile SRAM) is drawn only when it is within this factor of the data,
# so a nearly empty IPU's bars are not squashed to the axis; the title gives the figure instead.
_LIMIT_SCALE = 4.0
_TOP_TENSORS = 15
_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def write_html(model: DeviceModel, path, runs: int = 0) -> None:
    """Write the page of ``model`` (``runs``: the runs profiled so far) to ``path``."""
    write_text_atomic(path, html_report(model, runs))


def html_report(model: DeviceModel, runs: int = 0) -> str:
    """The page of ``model`` as a string."""
    esc = html.escape
    figures = [
        ("Memory per IPU", _memory_per_ipu(model)),
        ("Memory per tile", _memory_per_tile(model)),
        ("Live activations over the schedule", _liveness(model)),
        ("Timeline of one step", _timeline(model)),
    ]
    sections = []
    for n, (title, svg) in enumerate(figures):
        sections.append(f'<section class="plot" id="plot-{n}"><h2>{esc(title)}</h2>\n'
                        f"{_scoped_svg(svg, f'f{n}-')}</section>")
    return _PAGE.format(
        title=esc(f"Profile: {model.device}"),
        numbers=_numbers_table(model, runs),
        plots="\n".join(sections),
        tensors=_tensor_table(model),
        summary=esc(summary_text(model, runs)),
    )


# --- figures ----------------------------------------------------------------------------------


def _unit(max_bytes: float) -> tuple[str, int]:
    for name, size in _UNITS:
        if max_bytes >= size:
            return name, size
    return "B", 1


def _new_figure(width: float, height: float):
    from matplotlib.figure import Figure  # imported on first use: see module docstring

    return Figure(figsize=(width, height), layout="constrained")


def _to_svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    # A fixed hash salt and no date keep the SVG (and the page) the same for the same model.
    with matplotlib.rc_context({"svg.hashsalt": "popart-report", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    # The RDF metadata block (creator, links) says nothing to a reader of the page.
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)
    return text[text.index("<svg"):]


def _scoped_svg(svg: str, prefix: str) -> str:
    """Prefix every id (and reference to one) so several inline SVGs cannot clash."""
    svg = re.sub(r'\bid="', f'id="{prefix}', svg)
    svg = re.sub(r'url\(#', f"url(#{prefix}", svg)
    return re.sub(r'href="#', f'href="#{prefix}', svg)


def _limit_line(ax, value: float, peak: float, scale: int, label: str) -> bool:
    if peak > 0 and value / peak > _LIMIT_SCALE:
        return False
    ax.axhline(value / scale, color="#d62728", linestyle="--", linewidth=1, label=label)
    return True


def _memory_per_ipu(model: DeviceModel) -> str:
    ipus = model.memory.ipus
    totals = [m.total_bytes for m in ipus]
    unit, scale = _unit(max(totals, default=0))
    fig = _new_figure(7.5, 3.8)
    ax = fig.add_subplot()
    x = np.arange(len(ipus))
    bottom = np.zeros(len(ipus))
    for cat in CATEGORIES:
        values = np.array([m.categories.get(cat, 0) for m in ipus], dtype=float) / scale
        if values.any():
            ax.bar(x, values, bottom=bottom, width=0.6, label=cat,
                   color=_PALETTE[CATEGORIES.index(cat) % len(_PALETTE)])
            bottom += values
    capacity = ipus[0].capacity_bytes if ipus else 0
    shown = _limit_line(ax, capacity, max(totals, default=0), scale,
                        f"capacity {format_bytes(capacity)}")
    ax.set_xticks(x, [f"IPU {m.ipu}" + ("" if m.fits else "\n(out of memory)") for m in ipus])
    ax.set_ylabel(f"{unit} at the peak")
    title = "Always-live data + code + activation peak, per IPU"
    if not shown:
        title += f" (capacity {format_bytes(capacity)} each)"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _to_svg(fig)


def _memory_per_tile(model: DeviceModel) -> str:
    from matplotlib.ticker import MaxNLocator

    ipus = model.memory.ipus
    peak = max((m.worst_tile_bytes for m in ipus), default=0)
    unit, scale = _unit(peak)
    fig = _new_figure(7.5, 1.0 + 1.6 * max(1, len(ipus)))
    axes = fig.subplots(max(1, len(ipus)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, m in zip(axes, ipus):
        tiles = np.arange(m.num_tiles)
        values = m.tile_peak_bytes / scale
        if m.num_tiles <= 64:
            ax.bar(tiles, values, width=0.8, color="#4e79a7")
        else:
            ax.plot(tiles, values, color="#4e79a7", linewidth=0.8)
            ax.fill_between(tiles, values, color="#4e79a7", alpha=0.3)
        shown = _limit_line(ax, m.tile_bytes, peak, scale,
                            f"tile SRAM {format_bytes(m.tile_bytes)}")
        ax.set_ylabel(unit)
        ax.set_title(f"IPU {m.ipu}: fullest tile {m.worst_tile} "
                     f"{format_bytes(m.worst_tile_bytes)}"
                     + ("" if shown else f" of {format_bytes(m.tile_bytes)}"), fontsize=9)
        if shown:
            ax.legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("tile")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return _to_svg(fig)


def live_bytes_curve(m: IpuMemory, length: int) -> np.ndarray:
    """Bytes live over the schedule on IPU ``m`` (activations and the transient on-chip
    buffers of off-chip tensors) at each of ``length`` positions."""
    delta = np.zeros(length + 1, dtype=np.int64)
    for t in m.tensors:
        if t.start is not None and t.start < length:
            delta[t.start] += t.num_bytes
            delta[min(t.end, length - 1) + 1] -= t.num_bytes
    return np.cumsum(delta[:-1])


def _schedule_length(model: DeviceModel) -> int:
    ends = [t.end for m in model.memory.ipus for t in m.tensors if t.end is not None]
    positions = [o.position for o in model.cycles.ops]
    return max([*ends, *positions, -1]) + 1


def _liveness(model: DeviceModel) -> str:
    from matplotlib.ticker import MaxNLocator

    length = _schedule_length(model)
    curves = [(m, live_bytes_curve(m, length)) for m in model.memory.ipus]
    peak = max((int(c.max()) for _, c in curves if len(c)), default=0)
    unit, scale = _unit(peak)
    fig = _new_figure(7.5, 3.4)
    ax = fig.add_subplot()
    for m, curve in curves:
        if len(curve):
            # Position i is the interval [i, i + 1) so a one-op schedule still shows a step.
            ax.stairs(curve / scale, np.arange(length + 1), linewidth=1.2,
                      label=f"IPU {m.ipu} (peak {format_bytes(int(curve.max()))})")
            if m.peak_position is not None:
                ax.axvline(m.peak_position, color="#888888", linewidth=0.5, linestyle=":")
    ax.set_xlabel("schedule position (op index)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"live activations ({unit})")
    ax.set_title("Activations (and on-chip buffers of off-chip tensors) live at each op; "
                 "always-live data not included", fontsize=9)
    if curves:
        ax.legend(fontsize=8)
    return _to_svg(fig)


def timeline_spans(model: DeviceModel) -> tuple[dict[int, str],
                                                 dict[int, dict[str, list[tuple[float, float]]]]]:
    """The spans the timeline plot draws, from the Chrome trace of ``model`` (report/trace.py):
    (track id -> track name, track id -> span category -> [(start µs, length µs)])."""
    names: dict[int, str] = {}
    spans: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for e in chrome_trace(model)["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e["ph"] == "X":
            spans.setdefault(e["tid"], {}).setdefault(e["cat"], []).append((e["ts"], e["dur"]))
    return names, spans


def _timeline(model: DeviceModel) -> str:
    names, spans = timeline_spans(model)
    ipus = sorted(t for t in spans if t not in (HOST_TRACK, LINK_TRACK))
    tracks = [t for t in (HOST_TRACK, LINK_TRACK) if t in spans] + ipus
    fig = _new_figure(7.5, 1.2 + 0.45 * max(1, len(tracks)))
    ax = fig.add_subplot()
    used = set()
    for row, track in enumerate(tracks):
        for cat, items in spans[track].items():
            ax.broken_barh(items, (row - 0.35, 0.7), facecolors=_SPAN_COLOURS.get(cat, "#999999"),
                           edgecolor="white", linewidth=0.3,
                           label=None if cat in used else cat,
                           rasterized=len(items) > 2000)
            used.add(cat)
    ax.set_yticks(range(len(tracks)), [names.get(t, str(t)) for t in tracks])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (µs)")
    c = model.cycles
    if c.pipeline is not None:
        p = c.pipeline
        how = (f"pipeline cycle table ({p.fill_count} fill + {p.main_count} main + "
               f"{p.flush_count} flush per run): each IPU's stages, copies and the sync")
    else:
        how = "first micro-batch op by op, later ones as blocks"
    ax.set_title(f"One step: {c.step_cycles} cycles ({c.step_seconds * 1e6:.2f} µs)\n{how}",
                 fontsize=9)
    if used:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _to_svg(fig)


# --- tables -----------------------------------------------------------------------------------


def _row(cells, header: bool = False) -> str:
    tag = "th" if header else "td"
    return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + "</tr>"


def _numbers_table(model: DeviceModel, runs: int) -> str:
    c = model.cycles
    b = c.batch
    rows = [
        ("device", model.device),
        ("tiles per IPU", f"{model.spec.num_tiles} x {format_bytes(model.spec.tile_bytes)}"),
        ("fits", "yes" if model.memory.fits else "NO (out of memory)"),
        ("cycles per step", f"{c.step_cycles}"),
        ("time per step", f"{c.step_seconds * 1e3:.4f} ms"),
        ("throughput", f"{c.samples_per_second:.1f} samples/s ({b.samples_per_step} per step)"),
        ("batches per step / accumulation / replicas",
         f"{b.batches_per_step} / {b.accumulation_factor} / {b.replication_factor}"),
        ("utilisation", f"{100 * c.utilisation():.2f}% of the f32 AMP peak"),
        ("runs profiled", f"{runs}"),
    ]
    ipu_rows = [
        (f"IPU {m.ipu}", f"{format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} "
                         f"({100 * m.utilisation:.1f}%), fullest tile {m.worst_tile}: "
                         f"{format_bytes(m.worst_tile_bytes)}"
                         + (f"; off-chip {format_bytes(m.streaming_bytes)}"
                            if m.streaming_bytes else "")
                         + ("" if m.fits else " OUT OF MEMORY"))
        for m in model.memory.ipus
    ]
    return ('<table class="numbers">' + "".join(_row(r) for r in rows + ipu_rows)
            + "</table>")


def _tensor_table(model: DeviceModel) -> str:
    tensors = sorted((t for m in model.memory.ipus for t in m.tensors),
                     key=lambda t: (-t.num_bytes, t.ipu, t.id))[:_TOP_TENSORS]
    rows = [_row(("tensor", "type", "bytes", "category", "IPU", "tiles", "live"), header=True)]
    for t in tensors:
        live = "always" if t.start is None else f"{t.start}..{t.end}"
        rows.append(_row((t.id, t.info, format_bytes(t.num_bytes), t.category, t.ipu,
                          f"{t.first_tile}+{t.num_tiles}", live)))
    return '<table class="tensors">' + "".join(rows) + "</table>"


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 60em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.1em; margin-top: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
th {{ background: #f0f0f0; }}
section.plot svg {{ max-width: 100%; height: auto; }}
pre {{ background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>Simulated IPU: memory and cycles come from the device model (docs/device_model.md), not
from hardware.</p>
{numbers}
{plots}
<h2>Largest tensors</h2>
{tensors}
<h2>Summary report</h2>
<pre>{summary}</pre>
</body>
</html>
"""
