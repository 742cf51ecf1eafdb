"""What a night ran on, and whether two nights ran on the same: the set-up identity read from a
session's store records (cluster, hosts, device, versions, shapes) and the differences between two
that make comparing their numbers dubious. Split out of ``nights.py``; both names stay importable
there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.case import BANDWIDTH
from ..core.models import MFU_CONVENTION

def identity_from_records(records: Mapping[str, Any]) -> dict[str, Any]:
    """What the store's records say about the set-up: cluster, hosts, device, versions.

    The widest training launch speaks for the run (it saw every host); a bandwidth launch stands in
    when nothing was trained. Values nobody recorded are left out rather than set to None.
    """
    launched = [r for r in records.values() if isinstance(r, dict) and isinstance(r.get("result"), dict)]
    if not launched:
        return {}
    training = [r for r in launched if r.get("case", {}).get("model") != BANDWIDTH] or launched
    widest = max(training, key=lambda r: r["result"].get("world_size", 0))
    r = widest["result"]
    identity: dict[str, Any] = {
        "cluster_kind": widest.get("cluster"),
        "cluster": r.get("cluster"),
        "nodes": max(int(rec.get("case", {}).get("nodes", 0)) for rec in launched),
        "hosts": sorted(hosts) if isinstance(hosts := r.get("hosts"), list) else None,
        "gpus_per_node": r.get("local_world_size"),
        "device": r.get("device"),
        "dtype": r.get("dtype"),
        "gpu": r.get("gpu"),
        "attention": r.get("attention"),
        "versions": {k: v for k, v in (r.get("versions") or {}).items() if v},
        # how the cases' MFU counts FLOPs, where anything was trained
        "mfu_convention": MFU_CONVENTION if widest.get("case", {}).get("model") != BANDWIDTH else None,
        # tokens per GPU per step decide compute per step: two nights with other shapes measure other things
        "shapes": {rec["case"]["model"]: f"{rec['result']['batch_size']} x {rec['result']['seq_len']}"
                   for rec in training if "batch_size" in rec["result"] and "seq_len" in rec["result"]},
    }
    return {k: v for k, v in identity.items() if v not in (None, "", {})}


_COMPARED = (
    ("cluster_kind", "cluster kind"),
    ("nodes", "node count"),
    ("gpus_per_node", "GPUs per node"),
    ("device", "device"),
    ("dtype", "dtype"),
    ("gpu", "GPU"),
    ("versions.torch", "torch version"),
    ("versions.nccl", "NCCL version"),
    ("versions.cuda", "CUDA version"),
    ("versions.backend", "collective backend"),
    ("versions.transformers", "transformers version"),
)


def _lookup(identity: Mapping[str, Any], dotted: str) -> Any:
    value: Any = identity
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def identity_mismatch(a: Mapping[str, Any], b: Mapping[str, Any], labels: tuple[str, str] = ("a", "b")) -> list[str]:
    """Readable lines for each difference that makes comparing the two runs' numbers dubious.

    A fact only one side recorded is not a difference: older files lack some fields.
    """
    la, lb = labels
    lines = []
    for key, what in _COMPARED:
        va, vb = _lookup(a, key), _lookup(b, key)
        if va is not None and vb is not None and str(va) != str(vb):
            lines.append(f"{what} differs: {va} ({la}) vs {vb} ({lb})")
    sa, sb = a.get("shapes") or {}, b.get("shapes") or {}
    for model in sorted(set(sa) & set(sb)):
        if sa[model] != sb[model]:
            lines.append(f"{model} batch x sequence differs: {sa[model]} ({la}) vs {sb[model]} ({lb})")
    ha, hb = a.get("hosts"), b.get("hosts")
    if isinstance(ha, list) and isinstance(hb, list) and set(ha) != set(hb):
        only_a, only_b = sorted(set(ha) - set(hb)), sorted(set(hb) - set(ha))
        lines.append("hosts differ: " + "; ".join(
            part for part in (f"only in {la}: {', '.join(only_a)}" if only_a else "",
                              f"only in {lb}: {', '.join(only_b)}" if only_b else "") if part))
    return lines
