"""``python -m popart_backend`` / ``popart-sim``: will this ONNX model fit, and how fast is a step?

The tool compiles the model for an offline (compile-only) simulated device with the given IPU
count, tiles, IPU version, batch settings and options, and prints whether every IPU's SRAM holds
it, the memory per IPU by category, the estimated cycles and time of one step and the
throughput. Nothing is run: the numbers come from the memory and cycle models
(docs/device_model.md). ``--html`` writes the report page and ``--dot-dir`` the Graphviz files
of the IR at each check point.

Exit status: 0 when the model fits, 1 when it does not, 2 for a usage error or a model or option
the simulator rejects (the message says why).

Example::

    popart-sim bert.onnx --ipus 4 --input-shape input_ids=1,128 --html bert.html
"""

from __future__ import annotations

import argparse
import ast
import enum
import sys
from pathlib import Path

import onnx

# The tool drives the public API as a PopART script would. Importing it lazily would not make
# --help faster: this module is part of the package, which is loaded before it.
import popart_backend as popart

from .device.memory import format_bytes

__all__ = ["main"]

FITS, DOES_NOT_FIT, ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="popart-sim",
        description="Compile an ONNX model for the simulated IPU and report whether it fits, "
                    "the memory per IPU, the estimated step time and the throughput.",
    )
    p.add_argument("model", help="ONNX file (external data next to it is read)")
    dev = p.add_argument_group("device")
    dev.add_argument("--ipus", type=int, default=1,
                     help="IPUs per replica (default 1); more than 1 splits the model")
    dev.add_argument("--tiles-per-ipu", type=int, default=0,
                     help="tiles per IPU (default: the whole chip)")
    dev.add_argument("--ipu-version", default="ipu2", choices=("ipu1", "ipu2", "ipu21"),
                     help="IPU architecture (default ipu2, the Mk2 GC200)")
    batch = p.add_argument_group("batch")
    batch.add_argument("--batches-per-step", type=int, default=1, metavar="N",
                       help="micro-batches (or weight updates) per run() (default 1)")
    batch.add_argument("--replicas", type=int, default=1, metavar="N",
                       help="replicated graphs (default 1)")
    batch.add_argument("--accumulation", type=int, default=1, metavar="N",
                       help="gradient accumulation factor (training only, default 1)")
    batch.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                       help="shape of an input with dynamic dims, e.g. input_ids=8,128 "
                            "(repeatable)")
    mode = p.add_argument_group("model split and training")
    mode.add_argument("--virtual-graph-mode", choices=("off", "manual", "auto"),
                      help="how ops are placed on IPUs (default: auto with --ipus > 1, else off; "
                           "manual reads the model's virtualGraph annotations)")
    mode.add_argument("--pipeline", action="store_true",
                      help="pipeline the IPUs (enablePipelining)")
    mode.add_argument("--loss", metavar="TENSOR",
                      help="train: the id of the model's scalar loss (default: inference)")
    mode.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd",
                      help="optimizer when training (default sgd; its state counts in memory)")
    mode.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                      help="any SessionOptions field, e.g. autoRecomputation=Standard or "
                           "enableOutlining=False (repeatable)")
    out = p.add_argument_group("output")
    out.add_argument("--html", metavar="PATH", help="write the HTML report here")
    out.add_argument("--dot-dir", metavar="DIR",
                     help="write Graphviz files of the IR (FWD0 ... FINAL) into DIR")
    out.add_argument("--top", type=int, default=5, help="largest tensors listed per IPU")
    return p


class UsageError(Exception):
    """A bad command-line value; main() prints it and exits with status 2."""


def main(argv: list[str] | None = None) -> int:
    """Run the tool; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        session = _session(args)
    except (UsageError, popart.popart_exception) as e:
        print(f"popart-sim: error: {e}", file=sys.stderr)
        return ERROR
    fits, failure = True, None
    try:
        session.prepareDevice(loadEngine=False)
    except popart.OutOfMemoryException as e:
        fits, failure = False, str(e)
    except popart.popart_exception as e:
        print(f"popart-sim: error: {e}", file=sys.stderr)
        return ERROR
    report = session.getReport()
    print(_describe(args, report, fits))
    if failure is not None:
        print("\n" + failure)
    if args.html:
        report.to_html(args.html)
        print(f"\nHTML report: {args.html}")
    if args.dot_dir:
        files = sorted(Path(args.dot_dir).glob("*.dot"))
        print(f"DOT files: {len(files)} in {args.dot_dir}")
    return FITS if fits else DOES_NOT_FIT


def _session(args):
    for name in ("ipus", "batches_per_step", "replicas", "accumulation"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not "
                             f"{getattr(args, name)}.")
    if args.accumulation > 1 and args.loss is None:
        raise UsageError("--accumulation needs training: name the loss with --loss TENSOR.")
    path = Path(args.model)
    if not path.is_file():
        raise UsageError(f"no ONNX file at '{args.model}'.")
    proto = onnx.load(str(path), load_external_data=False)
    outputs = [o.name for o in proto.graph.output]
    shapes = _input_shapes(proto, args.input_shape)

    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    mode = args.virtual_graph_mode or ("auto" if args.ipus > 1 else "off")
    opts.virtualGraphMode = {"off": popart.VirtualGraphMode.Off,
                             "manual": popart.VirtualGraphMode.Manual,
                             "auto": popart.VirtualGraphMode.Auto}[mode]
    opts.enablePipelining = args.pipeline
    if args.replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = args.replicas
    if args.accumulation > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = args.accumulation
    if args.dot_dir:
        Path(args.dot_dir).mkdir(parents=True, exist_ok=True)
        opts.logDir = str(args.dot_dir)
        opts.dotChecks = {popart.DotCheck.All}
    for item in args.option:
        _set_option(opts, item)

    device = popart.DeviceManager().createOfflineIPUDevice({
        "numIPUs": args.ipus * args.replicas,
        "tilesPerIPU": args.tiles_per_ipu,
        "ipuVersion": args.ipu_version,
    })
    art = popart.AnchorReturnType("All")
    if args.loss is None:
        flow = popart.DataFlow(args.batches_per_step, {o: art for o in outputs})
        return popart.InferenceSession(str(path), flow, device, inputShapeInfo=shapes,
                                       userOptions=opts, name=path.stem)
    flow = popart.DataFlow(args.batches_per_step, {args.loss: art})
    optimizer = {
        "sgd": lambda: popart.SGD({"defaultLearningRate": (0.01, False)}),
        "momentum": lambda: popart.SGD({"defaultLearningRate": (0.01, False),
                                        "defaultMomentum": (0.9, False)}),
        "adam": lambda: popart.Adam({"defaultLearningRate": (1e-3, False)}),
    }[args.optimizer]()
    return popart.TrainingSession(str(path), flow, args.loss, optimizer, device,
                                  inputShapeInfo=shapes, userOptions=opts, name=path.stem)


def _input_shapes(proto: onnx.ModelProto, items: list[str]):
    shapes = popart.InputShapeInfo()
    inputs = {i.name: i for i in proto.graph.input}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--input-shape '{item}': write NAME=DIMS, e.g. x=8,128.")
        if name not in inputs:
            raise UsageError(f"--input-shape: the model has no input '{name}'; its inputs are "
                             f"{', '.join(sorted(inputs))}.")
        try:
            shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise UsageError(f"--input-shape '{item}': dims must be integers separated by "
                             f"commas, e.g. {name}=8,128.") from None
        elem = inputs[name].type.tensor_type.elem_type
        shapes.add(name, popart.TensorInfo(onnx.TensorProto.DataType.Name(elem), shape))
    return shapes


def _set_option(opts, item: str) -> None:
    """``NAME=VALUE`` onto SessionOptions: enum members by name, other values as Python
    literals (True, 3, 0.5, [..], {..}), anything else as a string."""
    name, sep, text = item.partition("=")
    if not sep:
        raise UsageError(f"--option '{item}': write NAME=VALUE, e.g. autoRecomputation=Standard.")
    current = getattr(opts, name, None)
    if isinstance(current, enum.Enum):
        enum_type = type(current)
        member = text.split(".")[-1]
        if member not in enum_type.__members__:
            raise UsageError(f"--option {name}: '{text}' is not a {enum_type.__name__}; use one "
                             f"of {', '.join(enum_type.__members__)}.")
        value = enum_type[member]
    else:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
    setattr(opts, name, value)  # SessionOptions checks the name and the type


def _describe(args, report, fits: bool) -> str:
    model = report.model
    spec, c, b = model.spec, model.cycles, model.cycles.batch
    lines = [
        f"Model: {args.model}",
        f"Device: {args.ipus * args.replicas} x {spec.name} ({args.replicas} replica(s) of "
        f"{args.ipus} IPU(s)), {spec.num_tiles} tiles x {format_bytes(spec.tile_bytes)} per IPU",
        f"Batch: {b.samples_per_micro_batch} sample(s) per micro-batch, batches per step "
        f"{b.batches_per_step}, accumulation {b.accumulation_factor}, replicas "
        f"{b.replication_factor} -> {b.samples_per_step} samples per step",
        f"Fits: {'yes' if fits else 'NO (out of memory)'}",
        "Memory per IPU (one replica):",
    ]
    for m in model.memory.ipus:
        lines.append(
            f"  IPU {m.ipu}: {format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} "
            f"({100 * m.utilisation:.1f}%), fullest tile {m.worst_tile}: "
            f"{format_bytes(m.worst_tile_bytes)} of {format_bytes(m.tile_bytes)}"
            + ("" if m.fits else "  OUT OF MEMORY"))
        lines.append("    " + ", ".join(f"{k} {format_bytes(v)}"
                                        for k, v in m.categories.items() if v))
        for t in m.largest(args.top):
            lines.append(f"    {t.id} {t.info}: {format_bytes(t.num_bytes)} ({t.category})")
    lines += [
        f"Step: {c.step_cycles} cycles = {c.step_seconds * 1e3:.4f} ms at "
        f"{spec.clock_hz / 1e9:.2f} GHz",
        f"Throughput: {c.samples_per_second:.1f} samples/s",
    ]
    return "\n".join(lines)
