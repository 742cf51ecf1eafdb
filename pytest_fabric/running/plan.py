"""The night's plan, printed before the first launch, and --night-budget's rounds per gate.

Before the first launch the session lists what it will launch: the selected gates (first look and
at most, in launches per side) and the other launches, what each launch is expected to cost
(``expected_launch_s``) and the night's expected length with first looks only and with every gate at
its most. With --night-budget each gate's most rounds are set from the budget
(``deciding.budget.allot``) just before the gate starts (``gate_rounds``), from the time left over
the work left, never during a gate: the gate's sequential design is fixed for its planned looks.

The plan is kept in the session's directory (``PLAN_FILE``), with which gates started and which
tests finished (``PROGRESS_FILE``), so that every xdist worker plans from the same night.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from ..core.atomic import write_text
from ..core.case import BANDWIDTH, LINKS, Case
from ..core.fabrics import REFERENCE_FABRIC
from ..deciding.budget import BudgetTooSmall, GateWork, allot, format_duration
from ..history.baselines import launch_costs
from ..history.launch_time import launched, wall_times
from ..history.night_model import ResultsError

if TYPE_CHECKING:
    from .session import FabricSession

__all__ = ["DEFAULT_LAUNCH_S", "NightPlan", "expected_launch_s", "gate_rounds", "make_plan", "undecided_note"]

PLAN_FILE = "plan.json"
PROGRESS_FILE = "plan-progress.json"

# A launch's wall time where nothing was measured on this cluster: a guess per cluster type and launch
# kind, said to be one. Emulated and local: the launches of 2026-11-27 on 2 cores (12-21 s training,
# the collectives' sweep and the link pairs about as long); Slurm and SSH: a real job's start-up,
# NCCL init, model build and compile dominate (minutes).
DEFAULT_LAUNCH_S: dict[str, dict[str, float]] = {
    "emulated": {"train": 14.0, "bandwidth": 20.0, "links": 15.0},
    "local": {"train": 12.0, "bandwidth": 15.0, "links": 15.0},
    "slurm": {"train": 300.0, "bandwidth": 120.0, "links": 120.0},
    "ssh": {"train": 300.0, "bandwidth": 120.0, "links": 120.0},
}


def launch_kind(case: Case) -> str:
    return {BANDWIDTH: "bandwidth", LINKS: "links"}.get(case.model, "train")


def expected_launch_s(case: Case, tonight: Mapping[str, Sequence[float]], before: Mapping[str, Sequence[float]],
                      cluster_kind: str) -> tuple[float, str]:
    """(seconds, where from) one launch of ``case`` is expected to take: the median of tonight's
    launches of it, else of those this cluster measured before (--night-costs, the baseline's saved
    night), else ``DEFAULT_LAUNCH_S``'s guess (another configuration's launches are no guide: a slow
    fabric's launch takes twice a fast one's). The one seam a
    per-phase breakdown refines (a compile cache hit makes the second launch cheaper)."""
    kind = launch_kind(case)
    for label, times in (("tonight", tonight), ("measured before", before)):
        if times.get(case.id):
            return statistics.median(times[case.id]), f"{label} ({len(times[case.id])} launch(es))"
    guesses = DEFAULT_LAUNCH_S.get(cluster_kind, DEFAULT_LAUNCH_S["slurm"])
    return guesses[kind], f"a guess for the {cluster_kind} cluster"


@dataclass
class NightPlan:
    """What the night will launch and how long it is expected to take."""

    created: float
    budget_s: float | None
    first: int
    most: int
    gates: list[dict[str, Any]] = field(default_factory=list)  # nodeid, name, sides, round_s, allotted
    others: list[dict[str, Any]] = field(default_factory=list)  # case, kind, launches, launch_s, nodeids
    costs: dict[str, list[Any]] = field(default_factory=dict)  # case id -> [seconds, source]

    def work(self, gates: Sequence[dict[str, Any]] | None = None) -> list[GateWork]:
        return [GateWork(g["nodeid"], g["round_s"], self.first, self.most) for g in (self.gates if gates is None else gates)]

    def other_s(self, others: Sequence[dict[str, Any]] | None = None) -> float:
        return sum(o["launches"] * o["launch_s"] for o in (self.others if others is None else others))

    def lengths(self) -> tuple[float, float]:
        """The night's expected length with first looks only, and with every gate at its allotted most."""
        other = self.other_s()
        return (other + sum(g["round_s"] * self.first for g in self.gates),
                other + sum(g["round_s"] * g["allotted"] for g in self.gates))

    def lines(self) -> list[str]:
        """The plan as the terminal shows it."""
        shortest, longest = self.lengths()
        budget = (f"--night-budget {format_duration(self.budget_s)}: each gate's most rounds set from it"
                  if self.budget_s else "no --night-budget: every gate may take --max-repeats rounds")
        out = [f"plan: {len(self.gates)} gate(s), {sum(o['launches'] for o in self.others)} other launch(es); "
               f"expected {format_duration(shortest)} with first looks only, at most {format_duration(longest)}; "
               + budget]
        for g in self.gates:
            out.append(f"plan: gate {g['name']}: {self.first} to {g['allotted']} rounds of {len(g['sides'])} launches "
                       f"(--max-repeats {self.most}), ~{format_duration(g['round_s'] / len(g['sides']))} per launch")
        for o in self.others:
            out.append(f"plan: {o['case']}: {o['launches']} launch(es) ({o['kind']}), ~{format_duration(o['launch_s'])} each")
        sources = sorted({source for _, source in self.costs.values()})
        out.append(f"plan: launch costs from: {'; '.join(sources) or 'nothing'}")
        return out

    def properties(self) -> dict[str, str]:
        """JUnit's ``fabric.plan.*`` properties."""
        shortest, longest = self.lengths()
        props = {"fabric.plan.budget_s": f"{self.budget_s:g}" if self.budget_s else "none",
                 "fabric.plan.expected_first_looks_s": f"{shortest:.0f}", "fabric.plan.expected_at_most_s": f"{longest:.0f}",
                 "fabric.plan.other_launches": str(sum(o["launches"] for o in self.others))}
        props.update({f"fabric.plan.gate.{g['name']}": f"{self.first} to {g['allotted']} rounds, ~{g['round_s']:.0f} s a round"
                      for g in self.gates})
        return props

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NightPlan:
        return cls(**data)


def _sides(item: pytest.Item, case: Case) -> list[Case]:
    """The cases a gate launches each round, as far as collection knows: the case and the reference
    fabric's (a regression gate: the case and its one-node configuration)."""
    if item.get_closest_marker("fabric_regression") is not None:
        return [case, case.with_nodes(1)] if case.nodes > 1 else [case]
    if case.fabric == REFERENCE_FABRIC:
        return [case, case]
    return [case, case.with_fabric(REFERENCE_FABRIC)]


def _history(session: FabricSession) -> dict[str, list[float]]:
    """Launch wall times this cluster measured before: --night-costs's (UsageError where it has none),
    else the --fabric-baseline's (``baselines.launch_costs``)."""
    o = session.options
    if o.night_costs:
        try:
            times = launch_costs(o.night_costs)
        except (ResultsError, OSError, ValueError) as exc:
            raise pytest.UsageError(f"--night-costs {o.night_costs}: {exc}; give a night saved with --fabric-save, "
                                    f"a session's results directory or a baseline") from None
        if not times:
            raise pytest.UsageError(f"--night-costs {o.night_costs}: no launch there records its wall time; give a "
                                    f"night saved with --fabric-save, or a baseline built from such nights, by this "
                                    f"version")
        return times
    try:
        return launch_costs(o.baseline_path) if o.baseline_path else {}
    except (ResultsError, OSError, ValueError):
        return {}


def make_plan(session: FabricSession, items: Sequence[pytest.Item]) -> NightPlan:
    """The plan of the selected ``items``: UsageError where --night-budget does not hold the first looks."""
    o = session.options
    tonight = wall_times(session.store.all()) if session.directory.exists() else {}
    before = _history(session)
    costs: dict[str, list[Any]] = {}

    def cost(case: Case) -> float:
        case = launched(case)
        if case.id not in costs:
            costs[case.id] = list(expected_launch_s(case, tonight, before, session.cluster.name))
        return costs[case.id][0]

    plan = NightPlan(time.time(), o.night_budget, o.repeats, o.max_repeats, costs=costs)
    gate_cases: set[str] = set()
    others: dict[str, dict[str, Any]] = {}
    for item in items:
        names = getattr(item, "fixturenames", ())
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "fabric_compare" in names and isinstance(case := params.get("fabric_case"), Case):
            sides = [launched(c) for c in _sides(item, case)]
            gate_cases.update(c.id for c in sides)
            plan.gates.append({"nodeid": item.nodeid, "name": item.nodeid.rpartition("::")[2], "sides": [c.id for c in sides],
                               "round_s": sum(cost(c) for c in sides), "allotted": o.max_repeats})
            continue
        for name in ("fabric_case", "fabric_bandwidth_case", "fabric_links_case", "fabric_link_node"):
            case = params.get(name)
            case = getattr(case, "case", case)
            if not isinstance(case, Case) or (name == "fabric_case" and "fabric_measure" not in names):
                continue
            case = launched(case)
            launches = o.throughput_launches if name == "fabric_case" else 1
            entry = others.setdefault(case.id, {"case": case.id, "kind": launch_kind(case), "launches": launches,
                                                "launch_s": cost(case), "nodeids": []})
            entry["nodeids"].append(item.nodeid)
    # A gate's first round reuses the throughput suite's launch of its cases (one launch of each).
    for cid, entry in others.items():
        if cid in gate_cases and entry["kind"] == "train":
            entry["launches"] -= 1
    plan.others = [e for e in others.values() if e["launches"] > 0]
    if o.night_budget:
        try:
            allotted = allot(plan.work(), plan.other_s(), o.night_budget)
        except BudgetTooSmall as exc:
            raise pytest.UsageError(str(exc)) from None
        for g, rounds in zip(plan.gates, allotted):
            g["allotted"] = rounds
    return plan


def _read(path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_plan(session: FabricSession, plan: NightPlan) -> None:
    session.directory.mkdir(parents=True, exist_ok=True)
    write_text(session.directory / PLAN_FILE, json.dumps(plan.to_dict()))


def load_plan(session: FabricSession) -> NightPlan | None:
    data = _read(session.directory / PLAN_FILE)
    return NightPlan.from_dict(data) if data else None


def finished(session: FabricSession, nodeid: str) -> None:
    """A test ended: its launches are no longer work left (``gate_rounds``)."""
    if session.options.night_budget is None or not (session.directory / PLAN_FILE).exists():
        return
    with session.store.locked():
        progress = _read(session.directory / PROGRESS_FILE)
        progress.setdefault("finished", []).append(nodeid)
        write_text(session.directory / PROGRESS_FILE, json.dumps(progress))


def gate_rounds(session: FabricSession, nodeid: str) -> tuple[int, str]:
    """The most rounds the gate ``nodeid`` may take, set now, before its first look, and why: the
    time the budget has left over the work left (the other launches and the gates not yet started,
    each at its first look; the launches' costs refreshed with tonight's). --max-repeats without a
    budget, or for a gate the plan does not know."""
    o = session.options
    plan = load_plan(session) if o.night_budget else None
    if plan is None or not any(g["nodeid"] == nodeid for g in plan.gates):
        return o.max_repeats, ""
    with session.store.locked():
        progress = _read(session.directory / PROGRESS_FILE)
        started = progress.setdefault("started", {})
        if nodeid in started:
            return started[nodeid][0], started[nodeid][1]
        done = set(progress.get("finished", []))
        tonight = wall_times(session.store.all())

        def cost(cid: str) -> float:
            return statistics.median(tonight[cid]) if tonight.get(cid) else plan.costs.get(cid, [0.0])[0]

        gates = [g for g in plan.gates if g["nodeid"] == nodeid] + [
            g for g in plan.gates if g["nodeid"] != nodeid and g["nodeid"] not in started and g["nodeid"] not in done]
        for g in gates:
            g["round_s"] = sum(cost(c) for c in g["sides"])
        others = [dict(e, launch_s=cost(e["case"])) for e in plan.others if not set(e["nodeids"]) <= done]
        left = o.night_budget - (time.time() - plan.created)
        rounds = allot(plan.work(gates), plan.other_s(others), left, strict=False)[0]
        why = (f"{rounds} of the {o.max_repeats} rounds --max-repeats allows, set from the night's budget "
               f"({format_duration(max(left, 0))} left for this gate, {len(gates) - 1} other gate(s) and "
               f"{sum(e['launches'] for e in others)} other launch(es)) before its first look; "
               f"~{format_duration(gates[0]['round_s'])} a round")
        started[nodeid] = [rounds, why, gates[0]["round_s"]]
        write_text(session.directory / PROGRESS_FILE, json.dumps(progress))
    return rounds, why


def undecided_note(session: FabricSession, nodeid: str, rounds: int) -> str:
    """What more time would have given a gate left inconclusive at the rounds the budget allowed."""
    o = session.options
    progress = _read(session.directory / PROGRESS_FILE) if o.night_budget else {}
    allotted = progress.get("started", {}).get(nodeid)
    if not allotted or allotted[0] >= o.max_repeats or rounds < allotted[0]:
        return ""
    more = o.max_repeats - allotted[0]
    return (f"inconclusive after {allotted[0]} rounds, the most the night's budget allowed; {more} more round(s), "
            f"about {format_duration(more * allotted[2])}, would have been allowed by --max-repeats {o.max_repeats}")


def record(session: FabricSession) -> dict[str, Any] | None:
    """The plan as the saved night keeps it: what was planned, and each gate's rounds as set when it
    started (``gate_rounds``); None where no plan was made."""
    plan = load_plan(session)
    if plan is None:
        return None
    started = _read(session.directory / PROGRESS_FILE).get("started", {})
    shortest, longest = plan.lengths()
    return {"budget_s": plan.budget_s, "expected_first_looks_s": round(shortest, 1), "expected_at_most_s": round(longest, 1),
            "gates": [{"test": g["name"], "sides": g["sides"], "round_s": round(g["round_s"], 1), "planned": g["allotted"],
                       **({"allotted": started[g["nodeid"]][0]} if g["nodeid"] in started else {})} for g in plan.gates],
            "others": [{k: e[k] for k in ("case", "kind", "launches", "launch_s")} for e in plan.others]}


def announce(session: pytest.Session, fabric: FabricSession) -> NightPlan:
    """The night's plan, made once before the first launch: by this process, or under xdist by the
    first worker to get here (the others read it from the session's directory); printed here where
    this process has the terminal (under xdist the controller shows the saved plan, plugin.py's
    ``pytest_xdist_node_collection_finished``)."""
    worker = hasattr(session.config, "workerinput")
    with fabric.store.locked() if worker else contextlib.nullcontext():
        plan = load_plan(fabric) if worker else None
        if plan is None:
            plan = make_plan(fabric, session.items)
            if not session.config.option.collectonly:
                save_plan(fabric, plan)
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and not worker:
        for line in plan.lines():
            terminal.write_line(f"fabric: {line}")
    return plan
