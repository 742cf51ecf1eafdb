"""Audit: the physical floor and the analytical prediction applied to results measured elsewhere.

A paper's table, a vendor's benchmark or last year's cluster reports tokens/s per fabric; nothing
there says whether the traffic could have crossed the fabric named. ``pytest-fabric audit FILE.csv``
reads such a table and, per row, turns tokens/s into a step time and sets it against the floor
(``floor.py``): the bytes the sharding must move across each node's link, over the link's rate.
A step shorter than that is impossible: the run did not use that link. For rows that differ only
in the fabric it also sets the measured penalty of the slower fabric against the one
``comparison.py`` expects, with the compute throughput fitted to the faster fabric's step.

Plain standard library; the CLI (``cli.py``) only prints what this module returns.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .floor import DEFAULT_RATE_TOLERANCE, SHARDINGS, Floor, floor_for
from ..core.models import MODELS, ModelSpec
from .comparison import predict_comparison
from .step_model import BYTES_PER_DTYPE, JobShape

__all__ = ["AuditError", "AuditRow", "REQUIRED", "OPTIONAL", "audit", "read_rows", "table_lines"]

REQUIRED = ("model", "nodes", "gpus_per_node", "batch", "seq", "fabric", "link_gbit", "tokens_per_s")
OPTIONAL = ("sharding", "activation_checkpointing", "dtype")

# What tables call the sharding modes (FSDP1's enum names, torchtitan's, DeepSpeed's stages).
_SHARDING_NAMES = {
    "full": "full", "full_shard": "full", "fsdp": "full", "fsdp2": "full", "zero3": "full",
    "no-reshard": "no-reshard", "shard_grad_op": "no-reshard", "zero2": "no-reshard",
    "hybrid": "hybrid", "hybrid_shard": "hybrid", "hsdp": "hybrid",
}
_TRUE = ("1", "true", "yes", "on", "full")
_FALSE = ("", "0", "false", "no", "off", "none")
# Hugging Face model_type -> the catalog's architecture whose parameter count it shares.
_ARCH = {"qwen2": "qwen2", "llama": "llama", "mistral": "llama"}
_CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class AuditError(ValueError):
    """Input the audit cannot use: one line naming the row and the column."""


@dataclass(frozen=True)
class AuditRow:
    """One row of the table: what it states, and what the floor makes of it."""

    row: int  # 1-based, the header not counted
    inputs: dict[str, str]  # the row's cells, as written (other columns, such as a source, included)
    spec: ModelSpec
    nodes: int
    gpus_per_node: int
    batch: int
    seq: int
    fabric: str
    link_gbit: float
    tokens_per_s: float
    sharding: str = "full"
    activation_checkpointing: bool = False
    dtype: str = "bf16"
    floor: Floor | None = None
    # Set on the slower row of a pair (same shape, another fabric): see ``Penalty``.
    penalty: Penalty | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.nodes * self.gpus_per_node * self.batch * self.seq

    @property
    def step_s(self) -> float:
        return self.tokens_per_step / self.tokens_per_s

    @property
    def implied_gbit(self) -> float:
        return self.floor.implied_gbit(self.step_s) if self.floor else 0.0

    @property
    def plausible(self) -> bool:
        return self.floor is None or not self.floor.impossible(self.step_s)

    @property
    def job(self) -> JobShape:
        return JobShape(self.spec, self.nodes, self.gpus_per_node, self.batch, self.seq, self.dtype,
                        activation_checkpointing=self.activation_checkpointing)

    @property
    def shape(self) -> tuple[JobShape, str]:
        """What must be equal for two rows to differ only by fabric: the job and its sharding."""
        return self.job, self.sharding

    @property
    def reason(self) -> str:
        if self.nodes == 1:
            return "one node: nothing crosses the fabric"
        share = self.implied_gbit / self.link_gbit
        if self.plausible:
            return f"needs {share:.0%} of the link"
        return (f"{self.step_s:.3g} s/step needs >= {self.implied_gbit:.3g} Gbit/s per node across the fabric, "
                f"{share:.1f}x {self.fabric}'s {self.link_gbit:g} Gbit/s link: this traffic did not cross {self.fabric}")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.inputs)
        data.update(row=self.row, plausible=self.plausible, reason=self.reason, measured_step_s=self.step_s,
                    floor_step_s=self.floor.step_s if self.floor else 0.0, implied_gbit_per_node=self.implied_gbit,
                    floor_bytes_per_node=self.floor.bytes if self.floor else 0.0)
        if self.penalty:
            data["penalty"] = self.penalty.to_json()
        return data


@dataclass(frozen=True)
class Penalty:
    """The slower fabric's loss against the faster one at the same shape: measured vs predicted."""

    against: str  # the faster fabric
    against_row: int
    measured: float  # 1 - slow tokens/s / fast tokens/s
    predicted: float | None  # None: the model cannot say (``why``)
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"against": self.against, "against_row": self.against_row, "measured": self.measured,
                "predicted": self.predicted, **({"unavailable": self.why} if self.why else {})}

    def text(self) -> str:
        predicted = f"{self.predicted * 100:+.1f}%" if self.predicted is not None else f"unavailable ({self.why})"
        return f"measured {self.measured * 100:+.1f}%, predicted {predicted}"


# -- reading -----------------------------------------------------------------------------------

def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows as dicts; AuditError when the file or its header cannot be used."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    except UnicodeDecodeError:
        raise AuditError(f"{path}: not a UTF-8 text CSV file") from None
    except csv.Error as exc:
        raise AuditError(f"{path}: not a readable CSV file ({exc})") from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise AuditError(f"{path}: missing column(s) {', '.join(missing)}; the header needs "
                         f"{','.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})")
    if not rows:
        raise AuditError(f"{path}: no rows under the header")
    return rows


def _cell_error(row: int, column: str, message: str) -> AuditError:
    return AuditError(f"row {row}, column {column}: {message}")


def _positive(cells: Mapping[str, str], row: int, column: str, integer: bool) -> float:
    text = cells.get(column, "")
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise _cell_error(row, column, f"{text!r} is not {kind}") from None
    if not 0 < value < math.inf:
        raise _cell_error(row, column, f"{text!r} must be positive")
    return value


def _model(text: str, row: int, base: Path) -> ModelSpec:
    if text in MODELS:
        return MODELS[text]
    candidates = [p for p in (Path(text), base / text) if p.suffix == ".json" or p.is_dir()]
    path = next((p / "config.json" if p.is_dir() else p for p in candidates
                 if (p / "config.json" if p.is_dir() else p).is_file()), None)
    if path is None:
        raise _cell_error(row, "model", f"unknown model {text!r}: give a catalog name ({', '.join(MODELS)}) or "
                                        f"the path of a Hugging Face config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _cell_error(row, "model", f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise _cell_error(row, "model", f"{path}: not a JSON object")
    arch = _ARCH.get(str(config.get("model_type", "")))
    if arch is None:
        raise _cell_error(row, "model", f"{path}: model_type {config.get('model_type')!r} is not a dense decoder "
                                        f"the audit can count ({', '.join(_ARCH)})")
    missing = [k for k in _CONFIG_KEYS if not isinstance(config.get(k), int)]
    if missing:
        raise _cell_error(row, "model", f"{path}: config has no integer {', '.join(missing)}")
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    return ModelSpec(str(config.get("_name_or_path") or path.parent.name or path.stem), arch, config,
                     f"from {path}")


def parse_row(cells: Mapping[str, str], row: int, base: Path = Path(".")) -> AuditRow:
    """One CSV row, checked; AuditError naming the row and the column otherwise."""
    if not cells.get("model"):
        raise _cell_error(row, "model", "empty")
    if not cells.get("fabric"):
        raise _cell_error(row, "fabric", "empty")
    spec = _model(cells["model"], row, base)
    sharding = _SHARDING_NAMES.get(cells.get("sharding", "").lower() or "full")
    if sharding is None:
        raise _cell_error(row, "sharding", f"{cells['sharding']!r} is not one of {', '.join(SHARDINGS)}")
    checkpointing = cells.get("activation_checkpointing", "").lower()
    if checkpointing not in _TRUE + _FALSE:
        raise _cell_error(row, "activation_checkpointing", f"{cells['activation_checkpointing']!r} is not true or false")
    dtype = cells.get("dtype", "").lower() or "bf16"
    if dtype not in BYTES_PER_DTYPE:
        raise _cell_error(row, "dtype", f"{cells['dtype']!r} is not one of {', '.join(BYTES_PER_DTYPE)}")
    return AuditRow(
        row=row, inputs=dict(cells), spec=spec,
        nodes=int(_positive(cells, row, "nodes", True)), gpus_per_node=int(_positive(cells, row, "gpus_per_node", True)),
        batch=int(_positive(cells, row, "batch", True)), seq=int(_positive(cells, row, "seq", True)),
        fabric=cells["fabric"], link_gbit=_positive(cells, row, "link_gbit", False),
        tokens_per_s=_positive(cells, row, "tokens_per_s", False), sharding=sharding,
        activation_checkpointing=checkpointing in _TRUE, dtype=dtype)


# -- judging -----------------------------------------------------------------------------------

def _with_floor(r: AuditRow, tolerance: float) -> AuditRow:
    b = BYTES_PER_DTYPE[r.dtype]
    floor = floor_for(r.spec, r.nodes, r.link_gbit, param_bytes=b, grad_bytes=b, sharding=r.sharding,
                      tolerance=tolerance)
    return replace(r, floor=floor)


def _penalty(slow: AuditRow, fast: AuditRow) -> Penalty:
    measured = 1 - slow.tokens_per_s / fast.tokens_per_s
    if slow.link_gbit == fast.link_gbit:
        return Penalty(fast.fabric, fast.row, measured, 0.0, "")
    if slow.sharding != "full":
        return Penalty(fast.fabric, fast.row, measured, None, "the model predicts full shard only")
    if not fast.plausible:
        return Penalty(fast.fabric, fast.row, measured, None, f"{fast.fabric}'s row is itself impossible")
    try:
        p = predict_comparison(fast.job, rates={fast.fabric: fast.link_gbit, slow.fabric: slow.link_gbit},
                               fast_step_s=fast.step_s)
    except ValueError as exc:
        return Penalty(fast.fabric, fast.row, measured, None, str(exc))
    return Penalty(fast.fabric, fast.row, measured, p.slowdown)


def audit(rows: Iterable[Mapping[str, str]], base: Path = Path("."),
          tolerance: float = DEFAULT_RATE_TOLERANCE) -> list[AuditRow]:
    """Every row checked against its floor; the slower rows of each shape paired with its fastest."""
    judged = [_with_floor(parse_row(cells, i, base), tolerance) for i, cells in enumerate(rows, start=1)]
    groups: dict[tuple, list[AuditRow]] = {}
    for r in judged:
        groups.setdefault(r.shape, []).append(r)
    out = {r.row: r for r in judged}
    for group in groups.values():
        fast = max(group, key=lambda r: r.link_gbit)
        for r in group:
            if r is not fast and r.fabric != fast.fabric and r.nodes > 1:
                out[r.row] = replace(r, penalty=_penalty(r, fast))
    return [out[r.row] for r in judged]


# -- showing -----------------------------------------------------------------------------------

def table_lines(rows: list[AuditRow]) -> list[str]:
    """The readable table, the reasons for impossible rows, the penalties, and a one-line verdict."""
    head = ("row", "model", "nodes x GPUs", "fabric", "link Gbit/s", "tokens/s", "measured step", "floor step",
            "needs Gbit/s/node", "verdict")
    body = [(str(r.row), r.spec.name, f"{r.nodes} x {r.gpus_per_node}", r.fabric, f"{r.link_gbit:g}",
             f"{r.tokens_per_s:,.0f}", f"{r.step_s:.3f} s", f"{r.floor.step_s:.3f} s" if r.nodes > 1 else "-",
             f"{r.implied_gbit:.1f}" if r.nodes > 1 else "-", "plausible" if r.plausible else "IMPOSSIBLE") for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(c.rjust(w) if i not in (1, 3, 9) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
             .rstrip() for cells in (head, *body)]
    impossible = [r for r in rows if not r.plausible]
    if impossible:
        lines += ["", "impossible:"] + [f"  row {r.row} ({r.spec.name}, {r.nodes} nodes, {r.fabric}): {r.reason}"
                                         for r in impossible]
    pairs = [r for r in rows if r.penalty]
    if pairs:
        lines += ["", "fabric penalty at the same shape (slowdown: 1 - slow tokens/s / fast tokens/s; predicted with "
                      "the compute throughput fitted to the faster row's step):"]
        lines += [f"  row {r.row} {r.fabric} vs row {r.penalty.against_row} {r.penalty.against} ({r.spec.name}, "
                  f"{r.nodes} nodes): {r.penalty.text()}" for r in pairs]
    tolerance = rows[0].floor.tolerance if rows and rows[0].floor else DEFAULT_RATE_TOLERANCE
    lines += ["", f"{len(rows) - len(impossible)} of {len(rows)} row(s) plausible, {len(impossible)} impossible "
                  f"(impossible: the step needs more than the link's rate + {tolerance:.0%})"]
    return lines
