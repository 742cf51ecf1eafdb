"""The ``pytest-fabric`` command: the catalogs, cleanup after a killed run, and what comes after a
night: reports, merged JUnit, trends, baselines, predictions before anything is measured, and
audits of results measured elsewhere.

Bad input ends in one line on stderr and exit status 2, never a traceback: these commands run in
CI jobs whose logs a person skims.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .core.fabrics import FABRICS
from .physics.floor import DEFAULT_RATE_TOLERANCE
from .core.models import MODELS

if TYPE_CHECKING:
    from .reporting.report_document import Written


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (status 2), pointing at --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _UserError(Exception):
    """Input the command cannot use; the message is the whole story."""


def _models(_: argparse.Namespace) -> int:
    for m in MODELS.values():
        total, _non_embedding = m.param_count()
        shape = f"{m.batch_size} x {m.seq_len}"
        size = f"{total / 1e9:.2f} B" if total >= 1e9 else f"{total / 1e6:.2f} M"
        print(f"{m.name:14} {m.arch:6} {size:>9} params  batch x seq {shape:9}  {m.description}")
    return 0


def _fabrics(_: argparse.Namespace) -> int:
    for f in FABRICS.values():
        env = " ".join(f"{k}={v}" for k, v in f.nccl_env.items())
        print(f"{f.name:5} {f.description:32} emulated {f.emulated_mbit:>6g} Mbit/s  NCCL: {env}")
    return 0


def _cleanup(_: argparse.Namespace) -> int:
    from .cluster.emulated import sweep_stale_namespaces

    removed = sweep_stale_namespaces()
    print(f"removed {len(removed)} stale namespace(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


# -- after the night ---------------------------------------------------------------------------

def _load(paths: Sequence[str]):
    from .history.night_files import load_results

    return [load_results(p) for p in paths]


def _per_fabric(option: str, items: Sequence[str], meaning: str, example: str) -> dict[str, float]:
    """``NAME=NUMBER`` items of one option -> {fabric: number} (``fabrics.fabric_value``)."""
    from .core.fabrics import fabric_value

    values = {}
    for item in items:
        try:
            fabric, value = fabric_value(item)
        except ValueError:
            raise _UserError(f"{option} {item!r}: write {meaning}, e.g. {example}") from None
        values[fabric] = value
    return values


def _prices(items: Sequence[str]) -> dict[str, float]:
    return _per_fabric("--price", items, "FABRIC=USD_PER_GPU_HOUR with a positive price", "ib=3.50")


def _output_dir(path: str, option: str) -> Path:
    """A directory the command may write into (made if missing); checked before any work."""
    out = Path(path)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise _UserError(f"{option} {path}: {blocker} is a file; give a directory (made if missing)")
    return out


def _output_file(path: str, what: str) -> str:
    """A file path the command may write (replacing a file there); checked before any work."""
    out = Path(path)
    if out.is_dir():
        raise _UserError(f"{what} {path} is a directory; give a file path such as {out / 'out'}")
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise _UserError(f"{what} {path}: {blocker} is a file, not a directory; give another path")
    return path


def _print_written(written: Written) -> None:
    for note in written.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {written.markdown}")
    print(f"wrote {written.html}")
    if written.plots:
        print(f"wrote {len(written.plots)} plot(s) in {written.plots[0].parent}")


def _report(args: argparse.Namespace) -> int:
    from .reporting.htmlreport import write_report

    prices = _prices(args.price)
    output = _output_dir(args.output, "-o")
    _print_written(write_report(_load(args.inputs), output, prices))
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .history.junit import merge_junit

    testcases = merge_junit(args.inputs, _output_file(args.out, "OUT"))
    print(f"wrote {args.out}: {testcases} testcase(s) from {len(args.inputs)} file(s)")
    return 0


def _trend(args: argparse.Namespace) -> int:
    from .reporting.trend import write_trend

    if len(args.nights) < 2:
        raise _UserError("a trend needs at least two nights; give two or more results files")
    output = _output_dir(args.output, "-o")
    _print_written(write_trend(_load(args.nights), output))
    return 0


def _baseline(args: argparse.Namespace) -> int:
    from .history.baselines import build_baseline, save_baseline

    _output_file(args.out, "OUT")
    baseline = build_baseline(_load(args.nights), _launch_costs(args.nights))
    if not baseline["cases"]:
        raise _UserError("the nights hold no training measurements to make a baseline from")
    save_baseline(args.out, baseline)
    for warning in baseline["warnings"]:
        print(f"warning: set-up differs: {warning}", file=sys.stderr)
    for cid, c in baseline["cases"].items():
        dropped = [n["night"] for n in c["nights"] if not n["kept"]]
        print(f"{cid}: {c['center']:.1f} tokens/s +- {c['spread']:.1f} over {c['kept']} night(s)"
              + (f"; dropped as outlier(s): {', '.join(dropped)}" if dropped else ""))
    costs = baseline["launch_costs"]
    print(f"wrote {args.out} from {len(args.nights)} night(s)"
          + (f"; launch costs of {len(costs)} configuration(s) kept for the plan of later nights" if costs else ""))
    return 0


def _launch_costs(paths: Sequence[str]) -> dict[str, list[float]]:
    """The launch wall times of every input that keeps them (``baselines.launch_costs``; JUnit keeps
    none), per launched configuration."""
    from .history.baselines import launch_costs
    from .history.night_model import ResultsError

    costs: dict[str, list[float]] = {}
    for path in paths:
        try:
            kept = launch_costs(path)
        except ResultsError:
            continue
        for cid, times in kept.items():
            costs.setdefault(cid, []).extend(times)
    return costs


def _predict(args: argparse.Namespace) -> int:
    from .core.models import get_model
    from .physics.step_model import JobShape, predict_penalty

    if args.model not in MODELS:
        raise _UserError(f"--model {args.model!r}: unknown model; known models: {', '.join(MODELS)}")
    for name in ("nodes", "gpus_per_node", "batch", "seq"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise _UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("fast_gbit", "slow_gbit", "flops_per_gpu"):
        if not getattr(args, name) > 0:
            raise _UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    spec = get_model(args.model)
    p = predict_penalty(JobShape(spec, args.nodes, args.gpus_per_node, args.batch, args.seq),
                        flops_per_s=args.flops_per_gpu, fast_gbit=args.fast_gbit, slow_gbit=args.slow_gbit)
    batch, seq = args.batch or spec.batch_size, args.seq or spec.seq_len
    print(f"{spec.name} on {args.nodes} node(s) x {args.gpus_per_node} GPU(s), batch {batch} x seq {seq} per GPU, "
          f"{args.flops_per_gpu / 1e12:g} TFLOP/s per GPU")
    for name, gbit, pred in (("fast", args.fast_gbit, p.fast), ("slow", args.slow_gbit, p.slow)):
        print(f"{name} fabric ({gbit:g} Gbit/s per node): step {pred.step_s * 1000:.1f} ms, "
              f"{pred.tokens_per_s:.1f} tokens/s, {pred.tokens_per_s_per_gpu:.1f} tokens/s/GPU "
              f"(compute {pred.compute_s * 1000:.1f} ms, transfer {pred.traffic_s * 1000:.1f} ms, {pred.bound}-bound)")
    print(f"penalty: slow/fast tokens/s = {p.ratio:.3f} ({p.slowdown * 100:.1f}% fewer tokens/s): {p.label}")
    print(p.message)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from .history.calibration import configurations, study, study_lines
    from .history.night_files import load_records

    gbit = _per_fabric("--gbit", args.gbit, "FABRIC=GBIT with a positive rate per node", "eth=100")
    efficiency = None
    if args.link_efficiency != "fit":
        try:
            efficiency = float(args.link_efficiency)
        except ValueError:
            efficiency = -1.0
        if not 0 < efficiency <= 1:
            raise _UserError(f"--link-efficiency must be in (0, 1] or 'fit', got {args.link_efficiency!r}")
    records = {}
    for i, path in enumerate(args.inputs):
        records.update({f"{i}:{key}": record for key, record in load_records(path).items()})
    configs, notes = configurations(records, gbit)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not configs:
        raise _UserError("the inputs hold no usable training launches to calibrate on")
    print(f"pytest-fabric calibrate: {len(args.inputs)} file(s)")
    for line in study_lines(study(configs, efficiency)):
        print(line)
    return 0


def _audit(args: argparse.Namespace) -> int:
    import json

    from .physics.audit import audit, read_rows, table_lines

    if not 0 <= args.tolerance < 1:
        raise _UserError(f"--tolerance must be a fraction in [0, 1), got {args.tolerance:g}")
    rows = audit(read_rows(args.file), Path(args.file).resolve().parent, args.tolerance)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        print(f"pytest-fabric audit: {args.file}")
        for line in table_lines(rows):
            print(line)
    return 0 if all(r.plausible for r in rows) else 1


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="pytest-fabric", description="Interconnect fabric comparisons as tests. "
                     "Run the comparisons with: pytest suites/ --nodes N")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the model catalog").set_defaults(func=_models)
    sub.add_parser("fabrics", help="list the fabric presets").set_defaults(func=_fabrics)
    sub.add_parser("cleanup", help="remove network namespaces left by a killed run").set_defaults(func=_cleanup)

    report = sub.add_parser("report", help="Markdown and HTML report (tables, plots, cost) of one night",
                            description="INPUT: results JSON (--fabric-save), a session's measurements.json, "
                            "a baseline, or JUnit XML; several inputs are parts of one night (a case in "
                            "several takes the last one's values).")
    report.add_argument("inputs", nargs="+", metavar="INPUT")
    report.add_argument("-o", "--output", default="fabric-report", metavar="DIR",
                        help="directory for report.md, report.html and plots/ (default: fabric-report)")
    report.add_argument("--price", action="append", default=[], metavar="FABRIC=USD_PER_GPU_HOUR",
                        help="price of a GPU-hour on a fabric; repeat per fabric (adds $/M tokens, break-even)")
    report.set_defaults(func=_report)

    merge = sub.add_parser("merge", help="merge several JUnit files of one nightly into one")
    merge.add_argument("out", metavar="OUT")
    merge.add_argument("inputs", nargs="+", metavar="IN")
    merge.set_defaults(func=_merge)

    trend = sub.add_parser("trend", help="tokens/s per case over several saved nights (table and plots)")
    trend.add_argument("nights", nargs="+", metavar="NIGHT.json")
    trend.add_argument("-o", "--output", default="fabric-trend", metavar="DIR",
                       help="directory for trend.md, trend.html and plots/ (default: fabric-trend)")
    trend.set_defaults(func=_trend)

    baseline = sub.add_parser("baseline", help="combine saved nights into a baseline, dropping outlier nights")
    baseline.add_argument("out", metavar="OUT")
    baseline.add_argument("nights", nargs="+", metavar="NIGHT")
    baseline.set_defaults(func=_baseline)

    predict = sub.add_parser("predict", help="predicted step time, tokens/s and slow-fabric penalty (no launch)")
    predict.add_argument("--model", required=True, help=f"one of: {', '.join(MODELS)}")
    predict.add_argument("--nodes", type=int, required=True)
    predict.add_argument("--gpus-per-node", type=int, default=1)
    predict.add_argument("--batch", type=int, help="micro-batch per GPU (default: the model's)")
    predict.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    predict.add_argument("--fast-gbit", type=_number, required=True,
                         help="the fast fabric: one node's aggregate NIC rate, Gbit/s")
    predict.add_argument("--slow-gbit", type=_number, required=True, help="the slow fabric, Gbit/s per node")
    predict.add_argument("--flops-per-gpu", type=_number, required=True,
                         help="FLOP/s one GPU achieves (not the datasheet peak), e.g. 4e14")
    predict.set_defaults(func=_predict)

    calibrate = sub.add_parser(
        "calibrate", help="the model's error on measured runs: predicted vs measured step, tokens/s, fabric penalty",
        description="INPUT: results JSON (--fabric-save) or a session's measurements.json; several are pooled. "
                    "Link rates: the emulated rate on the emulated cluster, else the fabric's nominal rate or --gbit.")
    calibrate.add_argument("inputs", nargs="+", metavar="INPUT")
    calibrate.add_argument("--link-efficiency", default="0.9", metavar="E",
                           help="fraction of the link rate a collective reaches, or 'fit' (default 0.9)")
    calibrate.add_argument("--gbit", action="append", default=[], metavar="FABRIC=GBIT",
                           help="link rate per node of a fabric on a real cluster (default: its nominal rate)")
    calibrate.set_defaults(func=_calibrate)

    audit = sub.add_parser(
        "audit", help="the physical floor and the prediction applied to a table of results measured elsewhere",
        description="FILE: a CSV with columns model,nodes,gpus_per_node,batch,seq,fabric,link_gbit,tokens_per_s "
                    "(optional: sharding full|no-reshard|hybrid, activation_checkpointing, dtype bf16|fp16|fp32). "
                    "model: a catalog name or the path of a Hugging Face config.json. Exit status 1 when a row is "
                    "impossible (its step needs more than its link can carry), 2 on bad input.")
    audit.add_argument("file", metavar="FILE.csv")
    audit.add_argument("--json", action="store_true", help="a JSON list of rows (input columns, plausible, figures)")
    audit.add_argument("--tolerance", type=_number, default=DEFAULT_RATE_TOLERANCE,
                       help="how far a step may appear to beat the link rate before it is impossible "
                            f"(default {DEFAULT_RATE_TOLERANCE:.2f})")
    audit.set_defaults(func=_audit)

    args = parser.parse_args(argv)
    from .history.night_model import ResultsError

    try:
        return args.func(args)
    except (_UserError, ResultsError) as exc:
        print(f"pytest-fabric {args.command}: error: {exc}", file=sys.stderr)
    except ValueError as exc:  # what predict and the baseline reject, with their own message
        print(f"pytest-fabric {args.command}: error: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"pytest-fabric {args.command}: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
