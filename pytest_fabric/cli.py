"""The ``pytest-fabric`` command: what the catalogs hold, and cleanup after a killed run."""

from __future__ import annotations

import argparse
import sys

from .fabrics import FABRICS
from .models import MODELS


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-fabric", description="Interconnect fabric comparisons as tests. "
                                     "Run the comparisons with: pytest suites/ --nodes N")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the model catalog").set_defaults(func=_models)
    sub.add_parser("fabrics", help="list the fabric presets").set_defaults(func=_fabrics)
    sub.add_parser("cleanup", help="remove network namespaces left by a killed run").set_defaults(func=_cleanup)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
