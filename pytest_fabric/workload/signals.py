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
  cores) are one group: every rank of the launch on those cores is subtracted (``core_mask``);
- ``probe``: a fixed Python loop timed after the step (``cpu_probe``): the vCPU's speed level,
  judged only on steps whose ranks kept their cores busy (``cpu_busy``, ``PROBE_BUSY_SHARE``).

``/proc/stat`` counts in clock ticks (10 ms at the usual USER_HZ of 100), so a step's figure is
only good to about two ticks; the rule's thresholds sit above that.

GPU runs: NVML's SM clock and clock-throttle reasons (through ``pynvml`` when it is installed;
otherwise nothing is recorded and no GPU step is set aside), and the GPU's busy share: NVML's
utilization (the share of its last sample period, 1/6 to 1 s, in which a kernel ran), read right
after each step; the least busy GPU's figure is the step's. ``hostbound.py`` judges it.

The rule (``disturbance``), documented in the README: a step is disturbed when, on any group of
cores, steal or foreign CPU time exceeds ``CPU_SHARE`` (10%) of the step's time on those cores and
at least ``MIN_TICKS`` clock ticks; when its probe (a busy step's) ran ``PROBE_SLOWDOWN`` (30%)
slower than the launch's median busy-step probe and the step itself ran ``STEP_CORROBORATION`` (5%)
longer than the launch's median step; or when any GPU reports a thermal or hardware
slowdown or a power brake. (A software power cap is the normal state of a busy GPU and does not
count.) A slow phase of the whole launch (``slow_phase``) is judged by the harness against the
fastest probe of the same configuration's launches in the session.

Standard library only: the harness imports the rule and the names without torch.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
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
FIELDS = ("step_s", "own_run_s", "cores_busy_s", "cores_steal_s", "cores", "probe_s", "sm_clock_mhz",
          "throttle_mask", "core_mask", "gpu_busy")  # gpu_busy: a fraction, -1 where unknown

# A step whose CPU probe took this much longer than the launch's typical (median) probe ran on a
# slowed CPU. The median, not the fastest: a vCPU here runs slower for a while after it idles, so a
# communication-bound launch, whose ranks wait on the network every step, probes slow on most
# steps; that is the job's own pattern, paid by every launch of it, not a disturbance.
PROBE_SLOWDOWN = 0.30
# A whole launch ran in another phase of the machine when its typical probe is this much slower than
# its configuration's usual one this session (or as much faster: ``slow_phase``): a speed level that
# lasts minutes moves every step of a launch alike, so no step stands out from its own launch.
PHASE_SLOWDOWN = 0.15

_PROBE_LOOPS = 4000


def cpu_probe() -> float:
    """The CPU probe: a fixed small kernel, timed after each step (outside the step's timing).

    On the VMs this project runs on, a vCPU's speed flips between levels (seen: 0.14 vs 0.24 ms for
    this loop, for seconds to minutes) without any steal time being reported; the probe shows which
    speed a step ran at. A plain Python loop on the calling thread, the best of five runs (about
    0.7 ms in all): a torch matmul here would use the intra-op thread pool, whose workers wake slowly
    after the step's collectives; the best of five drops a single interrupt, while a slowed vCPU
    slows all five.
    """
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x = 0
        for i in range(_PROBE_LOOPS):
            x += i * i
        best = min(best, time.perf_counter() - start)
    return best


def slow_phase(probes: Sequence[float], reference_s: float, cpu_busy: Sequence[float | None] = (),
               usual_s: float = 0.0) -> float:
    """How far from its configuration's usual speed a whole launch ran, as a fraction of its probe
    time: 0.18 ran 18% slow; -0.3 ran fast (its probes took 30% less); 0.0 within ``PHASE_SLOWDOWN``
    either way, or when fewer than 3 steps were busy enough for their probe to say anything
    (``probe_judged``: a communication-bound launch idles every step, and its probes read that).

    ``usual_s`` (results since 2026-11-26): the lower median of the typical probes of the
    configuration's launches when this one ran, against this launch's typical probe
    (``launch_probe``). Typical against usual, both ways: on a vCPU whose speed flips between two
    levels for minutes (probes of 0.16-0.18 ms and of 0.23-0.27 ms, here), the fastest probe of a
    launch is a rare reading whose odds grow with the launch's length (a 60 s launch caught 0.16
    ms where its typical was 0.26), and a launch that ran at the other level than its
    configuration usually does, faster or slower, is not the configuration's usual launch.
    Without it (older results): the launch's fastest probe against ``reference_s``, the fastest of
    its configuration's launches then, slower only."""
    if usual_s > 0:
        speed = launch_probe(probes, cpu_busy)
        off = speed / usual_s - 1.0 if speed else 0.0
        return off if abs(math.log1p(off)) > math.log1p(PHASE_SLOWDOWN) else 0.0
    fastest = fastest_probe(probes, cpu_busy)
    if not fastest or reference_s <= 0:
        return 0.0
    slower = fastest / reference_s - 1.0
    return slower if slower > PHASE_SLOWDOWN else 0.0


def _judged(probes: Sequence[float], cpu_busy: Sequence[float | None]) -> list[float]:
    busy = list(cpu_busy) if cpu_busy else [None] * len(probes)
    return [p for p, b in zip(probes, busy) if probe_judged(p, b)]


def launch_probe(probes: Sequence[float], cpu_busy: Sequence[float | None] = ()) -> float:
    """A launch's CPU speed: its ``typical_probe``; 0.0 with fewer than 3 judged probes (a launch
    whose steps idled says nothing of the machine's speed). Unknown busy shares count as busy."""
    busy = list(cpu_busy) if cpu_busy else [None] * len(probes)
    return typical_probe(probes, busy) if len(_judged(probes, busy)) >= 3 else 0.0


def usual_probe(speeds: Sequence[float]) -> float:
    """A configuration's usual CPU probe: the lower median of its launches' ``launch_probe``s (the
    ``usual_s`` of ``slow_phase``)."""
    return statistics.median_low(speeds)


def fastest_probe(probes: Sequence[float], cpu_busy: Sequence[float | None] = ()) -> float:
    """A launch's fastest judged CPU probe (``probe_judged``); 0.0 with fewer than 3 judged: the
    rule of results kept before ``usual_s`` (``slow_phase``)."""
    judged = _judged(probes, cpu_busy)
    return min(judged) if len(judged) >= 3 else 0.0


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass(frozen=True)
class CpuSample:
    busy_s: float  # user + nice + system time of the watched cores, cumulative
    steal_s: float  # steal time of the watched cores, cumulative
    own_run_s: float  # run time of this process's threads, cumulative


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

    def __init__(self, gpu_index: int | None = None) -> None:
        try:
            self.cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cores = list(range(os.cpu_count() or 1))
        self._names = {f"cpu{c}" for c in self.cores}
        # The cores as a bit mask (exact in a float64 up to core 52; beyond, the count still works).
        self.core_mask = float(sum(1 << c for c in self.cores if c < 53))
        self._nvml = _Nvml.open(gpu_index) if gpu_index is not None else None

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
        return CpuSample(busy / CLK_TCK, steal / CLK_TCK, _own_run_s())

    def gpu(self) -> tuple[float, int]:
        """(SM clock in MHz, throttle-reason mask) of this rank's GPU; (0, 0) when unknown."""
        return self._nvml.read() if self._nvml else (0.0, 0)

    def gpu_busy(self) -> float:
        """The share of NVML's last sample period this rank's GPU ran a kernel; -1 when unknown."""
        return self._nvml.busy() if self._nvml else -1.0

    def step_row(self, step_s: float, before: CpuSample, after: CpuSample, probe_s: float = 0.0) -> list[float]:
        """This rank's contribution to the step's all-reduce, in ``FIELDS`` order."""
        clock, mask = self.gpu()
        return [step_s, max(0.0, after.own_run_s - before.own_run_s), max(0.0, after.busy_s - before.busy_s),
                max(0.0, after.steal_s - before.steal_s), float(len(self.cores)), probe_s, clock, float(mask),
                self.core_mask, self.gpu_busy()]


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
    probe_s: float  # the slowest group of cores' probe time, each group's its fastest rank's (0: no probe)
    sm_clock_mhz: float | None  # the lowest SM clock of any GPU; None on CPU runs
    throttle: list[str]  # every throttle reason any GPU reported
    steal_cores: int = 1  # cores of the node with that steal
    gpu_busy: float | None = None  # the least busy GPU's busy share (NVML); None: unknown (CPU, no pynvml)
    # The launch's own ranks' run time over their cores' time in the step, for the least busy group
    # of cores (1.0: the ranks computed throughout; low: they waited on the network); None: unknown.
    cpu_busy: float | None = None


# The CPU probe is judged only on steps whose ranks kept their cores at least this busy: a vCPU here
# runs about 1.7x slower for tens of milliseconds after it idles (measured: a probe after a 20-100 ms
# sleep read 0.22-0.25 ms against 0.14 ms, even after 30 ms of spinning), so after a step that waited
# on the network the probe reads the job's own idling, not a disturbance.
PROBE_BUSY_SHARE = 0.8
# ... and only where the step itself ran this much longer than the launch's median step: a slow CPU
# slows the step it computes; a slow probe beside a step of the usual length is the probe's own
# bad luck (another rank took the core for a moment), not a slowed step.
STEP_CORROBORATION = 0.05


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
    masks = [int(node[0][8]) if len(node[0]) > 8 else 0 for node in nodes]
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
    busy_shares, probes = [], []
    for union, members in groups:
        speaking: dict[int, Sequence[float]] = {}  # one node speaks for each distinct core set
        for i in members:
            speaking.setdefault(masks[i] or -1 - i, nodes[i][0])
        busy = sum(first[2] for first in speaking.values())
        group_steal = sum(first[3] for first in speaking.values())
        cores = bin(union).count("1") if union else max(1, int(nodes[members[0]][0][4]))
        own = sum(r[1] for i in members for r in nodes[i])
        busy_shares.append(own / (step_s * cores) if step_s > 0 else 0.0)
        # A slowed vCPU slows every node on it; one node's probe cut short by another rank on the
        # same core is not a slow CPU: the group's probe is the fastest of its nodes'.
        timed = [r[5] for i in members for r in nodes[i] if r[5] > 0]
        probes.append(min(timed) if timed else 0.0)
        group_foreign = max(0.0, busy - own)
        if group_foreign / cores > foreign[0] / foreign[1]:
            foreign = (group_foreign, cores)
        if group_steal / cores > steal[0] / steal[1]:
            steal = (group_steal, cores)
    clocks = [r[6] for r in rows if r[6] > 0]
    mask = 0
    for r in rows:
        mask |= int(r[7])
    busy = [r[9] for r in rows if len(r) > 9 and r[9] >= 0]
    return StepView(step_s, steal[0], foreign[0], foreign[1], max(probes),
                    min(clocks) if clocks else None, throttle_names(mask), steal_cores=steal[1],
                    gpu_busy=min(busy) if busy else None, cpu_busy=min(busy_shares) if busy_shares else None)


def disturbance(view: StepView, probe_reference_s: float = 0.0, step_reference_s: float = 0.0) -> str:
    """Why ``view``'s step is set aside ("" when it is not): the rule in the module docstring.

    ``probe_reference_s``: the same launch's typical CPU probe time (its median); ``step_reference_s``:
    its typical step time (the median; 0: not known, the probe alone decides).
    """
    if _took_too_much(view.steal_s, view.step_s, view.steal_cores):
        return f"cpu steal {view.steal_s * 1000:.0f} ms"
    if _took_too_much(view.foreign_s, view.step_s, view.cores):
        return f"other processes {view.foreign_s * 1000:.0f} ms on the node's cores"
    if (probe_reference_s > 0 and view.probe_s > (1 + PROBE_SLOWDOWN) * probe_reference_s
            and view.step_s > (1 + STEP_CORROBORATION) * step_reference_s):
        return f"cpu slowed {(view.probe_s / probe_reference_s - 1) * 100:.0f}%"
    bad = [t for t in view.throttle if t in DISTURBING_THROTTLE]
    if bad:
        return "gpu " + ", ".join(bad)
    return ""


def _took_too_much(cpu_s: float, step_s: float, cores: int) -> bool:
    """More than ``CPU_SHARE`` of the step's time on ``cores`` cores, and at least ``MIN_TICKS``
    clock ticks (a hair of tolerance: tick counts turned into seconds and subtracted are not exact)."""
    return cpu_s > CPU_SHARE * step_s * max(1, cores) and cpu_s * CLK_TCK >= MIN_TICKS - 1e-6


def probe_judged(probe_s: float, cpu_busy: float | None) -> bool:
    """Whether a step's CPU probe says anything of the machine: it was taken, and the ranks kept
    their cores busy through the step (``PROBE_BUSY_SHARE``; unknown counts as busy)."""
    return probe_s > 0 and (cpu_busy is None or cpu_busy >= PROBE_BUSY_SHARE)


def typical_probe(probes: Sequence[float], cpu_busy: Sequence[float | None]) -> float:
    """The lower median of a launch's judged probes (``probe_judged``): what a step's probe is
    compared with; 0.0 when none was judged."""
    judged = sorted(p for p, b in zip(probes, cpu_busy) if probe_judged(p, b))
    return judged[(len(judged) - 1) // 2] if judged else 0.0


def judge_launch(views: Sequence[StepView]) -> list[str]:
    """The rule applied to every step of a launch so far, the CPU probe of each busy step judged
    against the launch's median probe over its busy steps (a slow phase of the whole launch is
    judged by the harness against its configuration's fastest launch: ``slow_phase``)."""
    reference = typical_probe([v.probe_s for v in views], [v.cpu_busy for v in views])
    steps = sorted(v.step_s for v in views)
    step_reference = steps[(len(steps) - 1) // 2] if steps else 0.0
    return [disturbance(v, reference if probe_judged(v.probe_s, v.cpu_busy) else 0.0, step_reference)
            for v in views]
