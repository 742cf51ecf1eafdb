"""What else happened on a node while a step ran: the signals that explain a slow step.

Timing noise on shared machines is additive and one-sided (Chen & Revels 2016): something else
took the CPU (another process on the rank's cores, the hypervisor's steal), or the GPU slowed its
clocks (thermal or power brake). A slow step with such a cause says nothing about the fabric, so
it is measured, not only endured: every rank samples its node before and after each step, the
samples travel to every rank in one small all-reduce outside the timed region, and
``disturbance`` decides, the same way on every rank, whether the step is set aside.

CPU runs (the emulated and local clusters pin each node's ranks to their own cores):

- ``steal``: the hypervisor's steal time on the node's cores (``/proc/stat``, column 8);
- ``foreign``: the cores' busy time (user + nice + system in ``/proc/stat``) less the run time
  of this launch's own ranks on them (``/proc/self/task/*/schedstat``, nanoseconds): CPU time
  other processes took from the ranks. Nodes pinned to the same cores (more emulated nodes than
  cores) are one group: every rank of the launch on those cores is subtracted (``core_mask``).

``/proc/stat`` counts in clock ticks (10 ms at the usual USER_HZ of 100), so a step's figure is
only good to about two ticks; the rule's thresholds sit above that.

Every run: the bytes each node's fabric link moved during the step, read by the node's first rank
from the kernel's counters (``LinkCounters``: the interfaces ``GLOO_SOCKET_IFNAME`` or
``NCCL_SOCKET_IFNAME`` name, ``/sys/class/net/<if>/statistics``; the HCAs ``NCCL_IB_HCA`` names,
``/sys/class/infiniband/<hca>/ports/<port>/counters``, in 4-byte units): what the step really sent
and received across nodes, set against the traffic model's count (``physics/floor.py``).

GPU runs: NVML's SM clock and clock-throttle reasons (through ``pynvml`` when it is installed;
otherwise nothing is recorded and no GPU step is set aside), and the GPU's busy share: NVML's
utilization (the share of its last sample period, 1/6 to 1 s, in which a kernel ran), read right
after each step; the least busy GPU's figure is the step's. ``hostbound.py`` judges it.

The rule (``disturbance``), documented in the README: a step is disturbed when, on any group of
cores, steal or foreign CPU time exceeds ``CPU_SHARE`` (10%) of the step's time on those cores and
at least ``MIN_TICKS`` clock ticks; or when any GPU reports a thermal or hardware slowdown or a
power brake. (A software power cap is the normal state of a busy GPU and does not count.) Nothing
here judges the machine's own speed: a slower phase of the whole machine moves both sides of a
round, which the paired rounds cancel (``deciding/rounds.py``).

Standard library only: the harness imports the rule and the names without torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A step is set aside when other work took more than this share of its cores' time...
CPU_SHARE = 0.10
# ... and at least this many clock ticks of it (below, /proc/stat's resolution cannot tell).
MIN_TICKS = 3

try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not Linux
    CLK_TCK = 100

# NVML clock-throttle reason bits (nvml.h, nvmlClocksEventReason*) and their names.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that make a step slower for reasons outside the job.
DISTURBING_THROTTLE = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

# Per rank and step, the numbers every rank contributes to the step's all-reduce (in this order).
FIELDS = ("step_s", "own_run_s", "cores_busy_s", "cores_steal_s", "cores", "sm_clock_mhz",
          "throttle_mask", "core_mask", "gpu_busy",  # gpu_busy: a fraction, -1 where unknown
          "link_tx_bytes", "link_rx_bytes",  # the node's fabric link, by its first rank; -1: unknown
          "main_cpu_s")  # the CPU time of the rank's main (compute) thread in the step


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass(frozen=True)
class CpuSample:
    busy_s: float  # user + nice + system time of the watched cores, cumulative
    steal_s: float  # steal time of the watched cores, cumulative
    own_run_s: float  # run time of this process's threads, cumulative
    link_tx: float = -1.0  # bytes the node's fabric link sent, cumulative (-1: not read here)
    link_rx: float = -1.0
    main_cpu_s: float = 0.0  # CPU time of the thread that samples (the rank's main thread), cumulative


class LinkCounters:
    """The kernel's byte counters of the node's fabric link: the network interfaces the rank
    program's sockets use (``GLOO_SOCKET_IFNAME``, else ``NCCL_SOCKET_IFNAME``: NCCL's syntax, a
    comma-separated list of name prefixes, ``=`` for an exact name, ``^`` to exclude) and the
    InfiniBand HCAs NCCL uses (``NCCL_IB_HCA``, ``mlx5_0:1,mlx5_1``). ``open`` finds them; None where
    none is named or found (nothing is recorded then)."""

    def __init__(self, files: list[tuple[str, str, int]]) -> None:
        self.files = files  # (path, "tx" or "rx", bytes per unit)

    @classmethod
    def open(cls, environ: Mapping[str, str], root: str = "/sys/class") -> LinkCounters | None:
        files: list[tuple[str, str, int]] = []
        spec = environ.get("GLOO_SOCKET_IFNAME") or environ.get("NCCL_SOCKET_IFNAME") or ""
        names = _listed(spec, _entries(f"{root}/net"))
        for name in names:
            files += [(f"{root}/net/{name}/statistics/tx_bytes", "tx", 1), (f"{root}/net/{name}/statistics/rx_bytes", "rx", 1)]
        hcas = environ.get("NCCL_IB_HCA", "")
        for hca in _listed(",".join(h.split(":")[0] for h in hcas.split(",")), _entries(f"{root}/infiniband")):
            for port in _entries(f"{root}/infiniband/{hca}/ports"):
                base = f"{root}/infiniband/{hca}/ports/{port}/counters"
                files += [(f"{base}/port_xmit_data", "tx", 4), (f"{base}/port_rcv_data", "rx", 4)]
        files = [f for f in files if os.path.exists(f[0])]
        return cls(files) if files else None

    def read(self) -> tuple[float, float]:
        """(bytes sent, bytes received), cumulative; (-1, -1) where a counter cannot be read."""
        out = {"tx": 0.0, "rx": 0.0}
        try:
            for path, direction, unit in self.files:
                with open(path) as f:
                    out[direction] += int(f.read().strip()) * unit
        except (OSError, ValueError):
            return -1.0, -1.0
        return out["tx"], out["rx"]


def _entries(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _listed(spec: str, present: Sequence[str]) -> list[str]:
    """The entries of ``present`` a NCCL-style list selects: prefixes, ``=`` exact names, ``^`` exclusions."""
    spec = spec.strip()
    if not spec:
        return []
    exclude = spec.startswith("^")
    exact = spec.lstrip("^").startswith("=")
    wanted = [w.strip() for w in spec.lstrip("^").lstrip("=").split(",") if w.strip()]
    chosen = [e for e in present if any(e == w if exact else e.startswith(w) for w in wanted)]
    return [e for e in present if e not in chosen and e != "lo"] if exclude else chosen


def _own_run_s() -> float:
    """Run time of every thread of this process, in seconds (schedstat: nanoseconds)."""
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            continue
    if total:
        return total / 1e9
    t = os.times()
    return t.user + t.system


class NodeSampler:
    """Samples this rank's cores and its own run time (CPU side) and its GPU (NVML), cheaply."""

    def __init__(self, gpu_index: int | None = None, link: LinkCounters | None = None) -> None:
        try:
            self.cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cores = list(range(os.cpu_count() or 1))
        self._names = {f"cpu{c}" for c in self.cores}
        # The cores as a bit mask (exact in a float64 up to core 52; beyond, the count still works).
        self.core_mask = float(sum(1 << c for c in self.cores if c < 53))
        self._nvml = _Nvml.open(gpu_index) if gpu_index is not None else None
        self.link = link  # the node's fabric counters, read by its first rank only

    def cpu(self) -> CpuSample:
        busy = steal = 0
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if not line.startswith("cpu"):
                        break
                    parts = line.split()
                    if parts[0] in self._names:
                        values = [int(x) for x in parts[1:9]]
                        busy += values[0] + values[1] + values[2]
                        steal += values[7] if len(values) > 7 else 0
        except (OSError, ValueError):
            pass
        link = self.link.read() if self.link else (-1.0, -1.0)
        return CpuSample(busy / CLK_TCK, steal / CLK_TCK, _own_run_s(), *link, time.thread_time())

    def gpu(self) -> tuple[float, int]:
        """(SM clock in MHz, throttle-reason mask) of this rank's GPU; (0, 0) when unknown."""
        return self._nvml.read() if self._nvml else (0.0, 0)

    def gpu_health(self) -> dict[str, int]:
        """This rank's GPU's temperature and uncorrected ECC count (``_Nvml.health``); {} when unknown."""
        return self._nvml.health() if self._nvml else {}

    def gpu_busy(self) -> float:
        """The share of NVML's last sample period this rank's GPU ran a kernel; -1 when unknown."""
        return self._nvml.busy() if self._nvml else -1.0

    def step_row(self, step_s: float, before: CpuSample, after: CpuSample) -> list[float]:
        """This rank's contribution to the step's all-reduce, in ``FIELDS`` order."""
        clock, mask = self.gpu()
        link = ([after.link_tx - before.link_tx, after.link_rx - before.link_rx] if min(before.link_tx, after.link_tx) >= 0
                else [-1.0, -1.0])
        return [step_s, max(0.0, after.own_run_s - before.own_run_s), max(0.0, after.busy_s - before.busy_s),
                max(0.0, after.steal_s - before.steal_s), float(len(self.cores)), clock, float(mask),
                self.core_mask, self.gpu_busy(), *link, max(0.0, after.main_cpu_s - before.main_cpu_s)]


class _Nvml:
    """NVML through pynvml (nvidia-ml-py), if installed: best effort, never fails a run."""

    def __init__(self, pynvml, handle) -> None:  # noqa: ANN001
        self._pynvml = pynvml
        self._handle = handle

    @classmethod
    def open(cls, index: int) -> _Nvml | None:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        except Exception:  # noqa: BLE001 - no pynvml, no driver: no GPU signals
            return None

    def read(self) -> tuple[float, int]:
        try:
            clock = float(self._pynvml.nvmlDeviceGetClockInfo(self._handle, self._pynvml.NVML_CLOCK_SM))
            mask = int(self._pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(self._handle))
            return clock, mask
        except Exception:  # noqa: BLE001
            return 0.0, 0

    def health(self) -> dict[str, int]:
        """The GPU's temperature (C) and its uncorrected ECC errors since the driver loaded (volatile
        count), where NVML gives them; XID events need an NVML event set held for the whole run and
        are left to the node check (``nvidia-smi``'s and the kernel's logs)."""
        out: dict[str, int] = {}
        nv = self._pynvml
        for name, read in (("temperature_c", lambda: nv.nvmlDeviceGetTemperature(self._handle, nv.NVML_TEMPERATURE_GPU)),
                           ("ecc_uncorrected", lambda: nv.nvmlDeviceGetTotalEccErrors(
                               self._handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))):
            try:
                out[name] = int(read())
            except Exception:  # noqa: BLE001 - not supported on this GPU (no ECC), no driver
                continue
        return out

    def busy(self) -> float:
        try:
            return float(self._pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100.0
        except Exception:  # noqa: BLE001
            return -1.0


@dataclass(frozen=True)
class StepView:
    """One step as every rank sees it after the all-reduce: the slowest node's figures."""

    step_s: float  # the slowest rank's time
    steal_s: float  # the steal of the node whose cores lost the largest share to steal
    foreign_s: float  # the foreign CPU time of the node whose cores lost the largest share to it
    cores: int  # cores of the node with that foreign time
    sm_clock_mhz: float | None  # the lowest SM clock of any GPU; None on CPU runs
    throttle: list[str]  # every throttle reason any GPU reported
    steal_cores: int = 1  # cores of the node with that steal
    gpu_busy: float | None = None  # the least busy GPU's busy share (NVML); None: unknown (CPU, no pynvml)
    # Bytes the busiest node's fabric link sent and received in the step; None: no counter known.
    link_tx_bytes: float | None = None
    link_rx_bytes: float | None = None
    # Every rank's own figures, by global rank: the step as its timer saw it (the slowest rank's
    # compute shows as the others' wait) and its main thread's CPU time in the step (its own work, on CPU:
    # the collectives' waits, and gloo's transport threads that poll while a peer is late, are not in it).
    rank_step_s: tuple[float, ...] = ()
    rank_cpu_s: tuple[float, ...] = ()
    # ...and its GPU's SM clock (MHz, 0: unknown) and clock-throttle reasons (NVML bit mask).
    rank_sm_clock_mhz: tuple[float, ...] = ()
    rank_throttle_mask: tuple[int, ...] = ()


def combine(rows: Sequence[Sequence[float]], local_world_size: int) -> StepView:
    """Every rank's row of one step (``FIELDS``) -> the step as a whole.

    Ranks ``k * local_world_size ...`` share node ``k`` and its cores (torchrun numbers them so):
    the first of them speaks for the cores. Nodes whose cores overlap (an emulated cluster with more
    nodes than cores pins several nodes to one core) are one group of cores: the group's foreign
    time is its cores' busy time less the run time of *every* rank of this launch on them, so the
    launch's own ranks on other nodes are never "other processes".
    """
    lws = max(1, local_world_size)
    step_s = max(r[0] for r in rows)
    nodes = [rows[start:start + lws] for start in range(0, len(rows), lws)]
    masks = [int(node[0][7]) if len(node[0]) > 7 else 0 for node in nodes]
    # Groups of nodes sharing cores (union of overlapping masks; a node without a mask is alone).
    groups: list[tuple[int, list[int]]] = []
    for i, mask in enumerate(masks):
        joined = [g for g in groups if mask and g[0] & mask]
        members, union = [i], mask
        for g in joined:
            groups.remove(g)
            members += g[1]
            union |= g[0]
        groups.append((union, members))
    # Per group (cpu seconds, cores); the worst group is the one that lost the largest share of its
    # cores' time, since the rule's budget is a share of the cores' own time.
    foreign, steal = (0.0, 1), (0.0, 1)
    for union, members in groups:
        speaking: dict[int, Sequence[float]] = {}  # one node speaks for each distinct core set
        for i in members:
            speaking.setdefault(masks[i] or -1 - i, nodes[i][0])
        busy = sum(first[2] for first in speaking.values())
        group_steal = sum(first[3] for first in speaking.values())
        cores = bin(union).count("1") if union else max(1, int(nodes[members[0]][0][4]))
        own = sum(r[1] for i in members for r in nodes[i])
        group_foreign = max(0.0, busy - own)
        if group_foreign / cores > foreign[0] / foreign[1]:
            foreign = (group_foreign, cores)
        if group_steal / cores > steal[0] / steal[1]:
            steal = (group_steal, cores)
    clocks = [r[5] for r in rows if r[5] > 0]
    mask = 0
    for r in rows:
        mask |= int(r[6])
    busy = [r[8] for r in rows if len(r) > 8 and r[8] >= 0]
    tx = [node[0][9] for node in nodes if len(node[0]) > 10 and node[0][9] >= 0]
    rx = [node[0][10] for node in nodes if len(node[0]) > 10 and node[0][10] >= 0]
    return StepView(step_s, steal[0], foreign[0], foreign[1], min(clocks) if clocks else None, throttle_names(mask),
                    steal_cores=steal[1], gpu_busy=min(busy) if busy else None,
                    link_tx_bytes=max(tx) if tx else None, link_rx_bytes=max(rx) if rx else None,
                    rank_step_s=tuple(r[0] for r in rows), rank_cpu_s=tuple(r[11] if len(r) > 11 else r[1] for r in rows),
                    rank_sm_clock_mhz=tuple(r[5] for r in rows), rank_throttle_mask=tuple(int(r[6]) for r in rows))


def gpu_per_rank(measured: Sequence[StepView]) -> dict[str, list[list[float]] | list[list[int]]]:
    """Every rank's SM clock and throttle mask per measured step (``StepSignals`` fields), where
    NVML gave any GPU's clock; {} otherwise (a CPU run, no pynvml)."""
    if not any(c > 0 for v in measured for c in v.rank_sm_clock_mhz):
        return {}
    return {"rank_sm_clock_mhz": [list(v.rank_sm_clock_mhz) for v in measured],
            "rank_throttle_mask": [list(v.rank_throttle_mask) for v in measured]}


def disturbance(view: StepView) -> str:
    """Why ``view``'s step is set aside ("" when it is not): the rule in the module docstring."""
    if _took_too_much(view.steal_s, view.step_s, view.steal_cores):
        return f"cpu steal {view.steal_s * 1000:.0f} ms"
    if _took_too_much(view.foreign_s, view.step_s, view.cores):
        return f"other processes {view.foreign_s * 1000:.0f} ms on the node's cores"
    bad = [t for t in view.throttle if t in DISTURBING_THROTTLE]
    if bad:
        return "gpu " + ", ".join(bad)
    return ""


def _took_too_much(cpu_s: float, step_s: float, cores: int) -> bool:
    """More than ``CPU_SHARE`` of the step's time on ``cores`` cores, and at least ``MIN_TICKS``
    clock ticks (a hair of tolerance: tick counts turned into seconds and subtracted are not exact)."""
    return cpu_s > CPU_SHARE * step_s * max(1, cores) and cpu_s * CLK_TCK >= MIN_TICKS - 1e-6


def judge_launch(views: Sequence[StepView]) -> list[str]:
    """The rule applied to every step of a launch."""
    return [disturbance(v) for v in views]
