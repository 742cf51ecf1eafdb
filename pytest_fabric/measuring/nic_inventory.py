"""What one node of a fabric has (``NicInventory``: how many NICs, how fast), and the ini's
``fabric_inventory`` lines that declare it (``parse_inventory``). ``nccl_evidence.check_transport``
holds NCCL's ports against it; ``preflight.inventory`` reads it from a node's sysfs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NicInventory:
    """What one node of a fabric has: how many NICs (HCA ports, EFA devices) and how fast each is.

    From the ini (``fabric_inventory``: ``ib.nics = 8``, ``ib.gbit_per_nic = 400``) or from a node's
    sysfs (``preflight.inventory``). None: not known, so not judged.
    """

    nics: int | None = None
    gbit_per_nic: float | None = None
    source: str = "ini fabric_inventory"


_INVENTORY_KEYS = {"nics": int, "gbit_per_nic": float}


def parse_inventory(lines: Iterable[str], fabrics: Iterable[str]) -> dict[str, NicInventory]:
    """The ini's ``fabric_inventory`` lines (``ib.nics = 8``, ``ib.gbit_per_nic = 400``) by fabric.

    Raises ValueError naming the line and how to write it.
    """
    known = list(fabrics)
    values: dict[str, dict[str, Any]] = {}
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        target, sep, value = (x.strip() for x in line.partition("="))
        fabric, _, key = target.partition(".")
        try:
            number = _INVENTORY_KEYS[key](value) if sep and fabric in known else None
        except (KeyError, ValueError):
            number = None
        if number is None or not 0 < number < float("inf"):
            raise ValueError(f"fabric inventory {line!r}: write 'FABRIC.nics = N' or 'FABRIC.gbit_per_nic = GBIT' "
                             f"with a positive number and FABRIC one of {', '.join(known)} (e.g. 'ib.nics = 8')")
        values.setdefault(fabric, {})[key] = number
    return {name: NicInventory(**v) for name, v in values.items()}
