"""Units of data and rate, defined once: every Mbit/Gbit/byte conversion in the package goes through here.

Rates: fabrics are declared in Mbit/s (the emulated ``tc tbf`` rate) and shown in Gbit/s; collectives
measure GB/s (bytes) and are shown in Gbit/s. Sizes: MiB (payloads), GiB (memory). Decimal prefixes
for rates (as NCCL and ``tc`` use them), binary ones for sizes in memory.

A leaf (standard library only): the rank programs and the launchers use it too. Each function keeps
the arithmetic order its callers had, so the figures stay bit for bit what they were.
"""

from __future__ import annotations

BITS_PER_BYTE = 8
MBIT_PER_GBIT = 1000
GIGA = 1e9
MEGA = 1e6
MIB = 2**20
GIB = 2**30


def mbit_to_gbit(mbit: float) -> float:
    """Mbit/s -> Gbit/s (``400`` -> ``0.4``)."""
    return mbit / MBIT_PER_GBIT


def gbyte_to_gbit(gbyte_per_s: float) -> float:
    """GB/s -> Gbit/s."""
    return gbyte_per_s * BITS_PER_BYTE


def gbit_to_bytes_per_s(gbit: float) -> float:
    """Gbit/s -> bytes/s."""
    return gbit * GIGA / BITS_PER_BYTE


def mbit_to_bytes_per_s(mbit: float) -> float:
    """Mbit/s -> bytes/s."""
    return mbit * MEGA / BITS_PER_BYTE


def gbyte_per_s(nbytes: float, seconds: float) -> float:
    """GB/s of ``nbytes`` moved in ``seconds``."""
    return nbytes / seconds / GIGA


def gbit_per_s(nbytes: float, seconds: float) -> float:
    """Gbit/s of ``nbytes`` moved in ``seconds``."""
    return nbytes * BITS_PER_BYTE / seconds / GIGA


def transfer_s(nbytes: float, gbit: float) -> float:
    """Seconds ``nbytes`` take at ``gbit`` Gbit/s."""
    return nbytes * BITS_PER_BYTE / (gbit * GIGA)
