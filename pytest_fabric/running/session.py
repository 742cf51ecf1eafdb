"""One pytest process's view of a fabric run, and the keys its hooks, fixtures and reporter share.

``FabricSession`` holds what the session decided at configure time (options, the cluster and its
size, the results directory every xdist worker shares) and answers what every part of the plugin
asks of it: the prepared cluster (falling back to local processes where ``auto`` cannot make
namespaces), the measurer, the noise prior a gate assumes, and the physical floor and prediction of
what was measured on this session's links. State that travels with one test lives in the
``pytest.StashKey``s below.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from . import options as fabric_options
from ..core.case import Case
from ..cluster import Cluster, ClusterUnavailable, local_fallback
from ..core.fabrics import REFERENCE_FABRIC, Fabric
from ..physics.floor import Floor, impossible_payloads, run_floor, transport_hint
from ..deciding.gates import DEFAULT_AHEAD, DEFAULT_WITHIN, GateOutcome
from ..measuring.link_rate import LinkRate, link_rate
from ..measuring.measure import Measurer
from ..workload.compile_cache import CACHE_DIR
from ..measuring.measurement import BandwidthMeasurement, Measurement, configuration_tokens_per_s
from ..core.models import get_model
from ..physics.comparison import comparison_line, predicted_contradiction
from ..physics.step_model import JobShape
from ..core.redact import remember
from ..deciding.references import ReferenceError, References
from ..history.baselines import Baseline
from ..history.night_model import ResultsError
from ..deciding.contrasts import Interval, NoisePrior, ahead_gate, within_gate
from ..measuring import nodes as node_checks
from ..measuring.nodes import NODES_FILE, NodeCheck, RunDirError
from ..measuring.preflight import NodeFacts, visible_gpus
from ..measuring.store import ResultStore, resume_path


@dataclass
class FabricSession:
    """One pytest process's view of the fabric run (controller or xdist worker)."""

    config: pytest.Config
    options: fabric_options.FabricOptions
    nodes: int  # the cluster size this session tests up to (--nodes, or the cluster's own)
    cluster: Cluster
    note: str | None  # why `auto` fell back, shown in the header and in skip reasons
    directory: Path  # shared by the controller and every worker of this session
    outputs: dict[str, str] = field(default_factory=dict)  # nodeid -> testcase text (controller)
    _measurer: Measurer | None = None
    _prepared: bool = False
    _refused: str | None = None  # why the session cannot launch (prepared_cluster), once known
    gates: int = 0  # comparison tests the suites collected, before -k/-m select (the night's family of gates)
    resumed: str | None = None  # launches an earlier, killed session left for this one (store.resume)
    # The healthy nodes' facts from the node check before the first launch (check_nodes): their NICs'
    # rates are the links' (link_rate.py). Empty where no check ran (the local cluster).
    node_facts: list[NodeFacts] = field(default_factory=list)
    # The gates the model predicts will fail on the session's links (check_expectations), by node id.
    contradictions: dict[str, str] = field(default_factory=dict)
    expectations_checked: int = 0

    def family(self) -> int:
        """How many gates a failure's error allowance is shared over (--family-wise)."""
        return max(1, self.gates) if self.options.family_wise == "bonferroni" else 1

    def prepared_cluster(self) -> Cluster:
        """The cluster, prepared and its nodes checked (``check_nodes``) before its first launch. A
        session refused here (a cluster that cannot run, a run directory no node sees) is refused
        again at every later call: nothing launches."""
        if self._refused is not None:
            raise pytest.UsageError(self._refused)
        if not self._prepared:
            try:
                self.cluster.prepare()
            except ClusterUnavailable as exc:
                # Only the emulated cluster has a fallback; a Slurm or SSH cluster that cannot run is an error.
                if self.options.cluster != "auto" or self.cluster.name != "emulated":
                    self._refused = f"--cluster {self.options.cluster} ({self.cluster.name}): {exc}"
                    raise pytest.UsageError(self._refused) from None
                self.cluster, self.note = local_fallback(exc)
            try:
                self.check_nodes()
            except pytest.UsageError as exc:
                self._refused = str(exc)
                raise
            self._prepared = True
        return self.cluster

    def nodes_left_out(self) -> dict[str, str]:
        """Node -> why, for the nodes this session's check left out (read from its directory, where
        the process that checked them, perhaps an xdist worker, kept the verdicts)."""
        return node_checks.left_out(node_checks.load(self.directory / NODES_FILE) or [])

    def check_nodes(self) -> list[NodeCheck]:
        """Every node of the cluster checked once per session (``measuring/nodes.py``), those with a
        problem or named by --exclude-nodes left out of every launch. The first process to get here
        (the controller, or one xdist worker) runs the check under the store's lock and keeps the
        verdicts in the session's directory, where the others and the reporter read them."""
        cluster = self.cluster
        if not cluster.checks_nodes:
            return []
        names = cluster.node_names(self.nodes)
        excluded = self.options.exclude_nodes
        if unknown := [n for n in excluded if n not in names]:
            raise pytest.UsageError(f"--exclude-nodes: {', '.join(unknown)} not among the {cluster.name} cluster's "
                                    f"nodes: {', '.join(names)}")
        path = self.directory / NODES_FILE
        with self.store.locked():
            checks = node_checks.load(path)
            if checks is None:
                settings = self.options.settings
                fabrics = [settings.fabric(f) for f in self.options.fabrics]
                try:
                    checks = node_checks.check_nodes(cluster, [n for n in names if n not in excluded], self.directory,
                                             fabrics, settings.gpus_per_node, settings.device)
                except RunDirError as exc:
                    raise pytest.UsageError(str(exc)) from None
                checks += [NodeCheck(n, ["named by --exclude-nodes"]) for n in excluded]
                node_checks.save(checks, path)
                if (show := progress_writer(self.config)) is not None:
                    for line in node_checks.table(checks):
                        show(line)
        cluster.left_out.update(node_checks.left_out(checks))
        self.node_facts = [c.facts for c in checks if c.ok and c.facts is not None]
        gpus = [c.gpus for c in checks if c.ok and c.gpus]
        if not self.options.gpus_per_node_given and not cluster.gpus_per_node() and gpus:
            # Nothing declared GPUs per node: one rank per GPU the healthy nodes all show (nvidia-smi -L).
            self.options = fabric_options.with_gpus_per_node(self.options, min(gpus))
        return checks

    def noise(self, cases: Sequence[Case] = ()) -> NoisePrior | None:
        """Launch-to-launch noise a gate over ``cases`` knows before tonight's launches: what the
        --fabric-baseline learned from its nights for those configurations (else for all of its
        own); None where nothing was learned (the gate then rests on tonight's rounds, or on the
        stated bound: ``contrasts.contrast_interval``)."""
        o = self.options
        return o.baseline.noise([c.id for c in cases]) if o.baseline is not None else None

    @functools.cached_property
    def store(self) -> ResultStore:
        """One per process: records its disk could not take stay in memory there (store.py)."""
        save = self.options.save
        return ResultStore(self.directory, resume_path(save) if save is not None else None)

    def measurer(self) -> Measurer:
        if self._measurer is None:
            cluster = self.prepared_cluster()  # its nodes checked: node_facts, options' GPUs per node
            self._measurer = Measurer(cluster, self.options.settings, self.store,
                                      self.directory / "launches", progress=progress_writer(self.config),
                                      nodes=self.node_facts)
            self._measurer.on_left_out = self._left_out
            # Beside the sessions' directories, under --run-dir: shared by nodes and nights.
            self._measurer.compile_cache = self.directory.parent / CACHE_DIR
        return self._measurer

    def _left_out(self, node: str, why: str) -> None:
        """Keep a node the measurer left out (its launches kept failing there) with the session's node
        verdicts, where the summary, JUnit and the saved night read them."""
        path = self.directory / NODES_FILE
        with self.store.locked():
            checks = node_checks.load(path) or []
            known = next((c for c in checks if c.name == node), None)
            if known is None:
                checks.append(NodeCheck(node, [why]))
            else:
                known.problems.append(why)
            node_checks.save(checks, path)

    # -- the physical floor of what was measured (floor.py), on this session's links ---------------

    def link_rate(self, name: str) -> LinkRate | None:
        """Fabric ``name``'s per-node link rate and its source, as the bandwidth gate holds busbw to it:
        declared, the emulated link's, or the nodes' sysfs (``link_rate.link_rate``); None where none
        is known. Never an assumed rate: a gate against a guess judges the guess."""
        return link_rate(self.options.settings.fabric(name), self.node_facts, self.cluster.name == "emulated")

    def link(self, name: str) -> tuple[Fabric, float | None, str]:
        """(fabric, its link rate in Gbit/s or None, where the rate comes from) for the floor and
        the prediction: ``link_rate``'s, else the fabric's nominal rate ("nominal": a real cluster
        whose nodes showed no rate). The nodes' own rate comes first: a floor on an assumed rate fails
        a healthy run where the link is faster, and misses an impossible step where it is slower."""
        fabric = self.options.settings.fabric(name)
        rate = self.link_rate(name)
        if rate is None:
            return fabric, fabric.nominal_gbit, "nominal"
        return fabric, rate.gbit, rate.source

    def floor(self, m: Measurement) -> Floor | None:
        """The physical floor of ``m``'s configuration on its fabric's link; None on one node or where
        no link rate is known (a fabric without a nominal rate on a real cluster, nothing declared)."""
        _, link, _ = self.link(m.case.fabric)
        if m.case.nodes < 2 or not link:
            return None
        return run_floor(get_model(m.case.model), m.case.nodes, link, m.result, self.options.floor_tolerance)

    def impossible(self, m: Measurement | BandwidthMeasurement) -> str | None:
        """Why ``m`` is faster than its fabric's link can carry (a training step too short for its
        traffic, or collective payloads above the link), or None."""
        if isinstance(m, BandwidthMeasurement):
            return self._impossible_payloads(m)
        floor = self.floor(m)
        if floor is None:
            return None
        fabric, _, source = self.link(m.case.fabric)
        return floor.problem(m.step_s, m.case.fabric, transport_hint(dict(fabric.nccl_env), source))

    def _impossible_payloads(self, bw: BandwidthMeasurement) -> str | None:
        fabric, link, source = self.link(bw.case.fabric)
        if not link:
            return None
        tolerance = self.options.floor_tolerance
        flagged = impossible_payloads(bw.rows, bw.case.nodes, link, tolerance)
        if not flagged:
            return None
        return (f"{bw.case.fabric}: {'; '.join(flagged)}; {bw.case.fabric}'s link is {link:g} Gbit/s per node "
                f"(+{tolerance:.0%} tolerance): these bytes did not cross {bw.case.fabric} at its rate "
                f"({transport_hint(dict(fabric.nccl_env), source)})")

    def floor_line(self, launches: Sequence[Measurement]) -> str:
        """``floor: ...`` for one side of a comparison: its configuration's step next to the floor. Never
        raises, like the prediction: each launch's floor was already enforced when it was measured."""
        m = launches[0]
        try:
            floor = self.floor(m)
            if floor is None:
                reason = "one node" if m.case.nodes < 2 else f"no link rate known for fabric {m.case.fabric!r}"
                return f"floor: {m.case.fabric} none ({reason})"
            return floor.line(m.result.tokens_per_step / configuration_tokens_per_s(launches), m.case.fabric)
        except Exception as exc:  # noqa: BLE001 - an output line must never turn a test into an error
            return f"floor: {m.case.fabric} unavailable ({type(exc).__name__}: {exc})"

    def check_expectations(self, items: Sequence[pytest.Item]) -> None:
        """Before the night, each comparison that declares what it expects (``fabric_comparison(expect=)``)
        is set against the model's prediction on the session's links (declared, emulated or the nodes'),
        ranks per node, shape, precision, sharding and --fabric-flops: a gate predicted to fail is
        noted on its item (``CONTRADICTION_KEY``) and in ``contradictions``, and still measured. Without
        --fabric-flops nothing is predicted (a rank's compute throughput decides what bounds a step)."""
        for item in items:
            marker = item.get_closest_marker("fabric_comparison")
            kind = marker.kwargs.get("expect") if marker is not None else None
            case = getattr(item, "callspec", None) and item.callspec.params.get("fabric_case")
            if kind is None or not isinstance(case, Case):
                continue
            if kind not in EXPECTATIONS:
                raise pytest.UsageError(f"{item.nodeid}: fabric_comparison(expect={kind!r}): use one of "
                                        f"{', '.join(map(repr, EXPECTATIONS))}")
            message = self.expectation(case, kind)  # None where nothing can be predicted
            self.expectations_checked += self._predictable(case)
            if message:
                item.stash[CONTRADICTION_KEY] = self.contradictions[item.nodeid] = message

    def expectation_lines(self) -> list[str]:
        """What the pre-night check found, for the terminal: each gate predicted to fail, or that none is."""
        if not self.contradictions:
            return [f"pre-night check: the model predicts all {self.expectations_checked} comparison(s) as their gates "
                    f"expect, on these links and --fabric-flops"]
        return [f"predicted to fail: {message}" for message in self.contradictions.values()]

    def _predictable(self, case: Case) -> bool:
        return self.options.flops_per_rank is not None and case.crosses_fabric and case.fabric != REFERENCE_FABRIC

    def expectation(self, case: Case, kind: str) -> str | None:
        """The model's words where ``case``'s gate against the reference fabric is predicted to fail
        (``comparison.predicted_contradiction``), else None; None too where it cannot be predicted."""
        if not self._predictable(case):
            return None
        s, o = self.options.settings, self.options
        try:
            rates = {f: self.link(f)[1] for f in (REFERENCE_FABRIC, case.fabric)}
            if not all(rates.values()):
                return None
            gpu = s.device == "cuda" or (s.device == "auto" and visible_gpus() > 0)
            bf16 = s.mixed_precision == "bf16" or (s.mixed_precision == "auto" and gpu)
            batch, seq = s.shape(case.model, case.nodes * s.gpus_per_node)
            shape = JobShape(get_model(case.model), case.nodes, s.gpus_per_node, batch, seq,
                             param_bytes=2 if bf16 else 4, grad_bytes=2 if bf16 and s.reduce_dtype == "bf16" else 4,
                             activation_checkpointing=s.activation_checkpointing, sharding=case.layout,
                             grad_accum=s.grad_accum, backend="nccl" if gpu else "gloo")
            threshold = (within_gate(o.references.within(case, DEFAULT_WITHIN))[0] if kind == "within"
                         else ahead_gate(o.references.ahead(case, DEFAULT_AHEAD))[0])
            return predicted_contradiction(shape, kind, threshold, (REFERENCE_FABRIC, rates[REFERENCE_FABRIC]),
                                           (case.fabric, rates[case.fabric]), o.flops_per_rank)
        except (KeyError, ValueError):  # a model or a shape the catalog cannot size: nothing predicted
            return None

    def predicted(self, a: Case, b: Case, runs_a: Sequence[Measurement], runs_b: Sequence[Measurement],
                  interval: Interval) -> str:
        """The analytical model's line for comparing ``a`` with ``b`` (``comparison.comparison_line``)
        on this session's link rates. Never raises."""
        try:
            rates = {f: self.link(f)[1] for f in (a.fabric, b.fabric)}
            sides = [(case.fabric, runs[0].result, configuration_tokens_per_s(runs))
                     for case, runs in ((a, runs_a), (b, runs_b))]
        except Exception as exc:  # noqa: BLE001 - a prediction must never turn a test into an error
            return f"predicted: unavailable ({type(exc).__name__}: {exc})"
        ratio = (interval.point, interval.low, interval.high, interval.confidence)
        return comparison_line(a.model, a.nodes, rates, sides, ratio, self.options.settings.gpus_per_node,
                               self.options.flops_per_rank)


# Comparisons declare what they expect: ``@pytest.mark.fabric_comparison(expect="within")`` (the
# candidate keeps up with the reference) or ``expect="ahead"`` (the reference leads).
EXPECTATIONS = ("within", "ahead")

SESSION_KEY = pytest.StashKey[FabricSession]()
CONTRADICTION_KEY = pytest.StashKey[str]()  # the model's prediction against a gate's expectation
MEASURED_KEY = pytest.StashKey[list[Measurement | BandwidthMeasurement]]()
# Lines shown below a test's verdicts (the prediction, the floor). The verdicts themselves are the
# GateOutcomes under OUTCOMES_KEY: every renderer writes their words from those.
NOTES_KEY = pytest.StashKey[list[str]]()
OUTCOMES_KEY = pytest.StashKey[list[GateOutcome]]()
ERRORED_KEY = pytest.StashKey[bool]()  # a measurement the test needed failed: its outcome is "error"
NO_FABRICS_KEY = pytest.StashKey[bool]()  # a comparison skipped because the fabrics share one link


def session_directory(config: pytest.Config, run_dir: Path) -> Path:
    """This session's directory under ``run_dir`` (--run-dir): the controller's, which xdist workers share."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "fabric_dir" in workerinput:
        return Path(workerinput["fabric_dir"])
    return run_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def progress_writer(config: pytest.Config):
    """Lines on the terminal while a launch runs; workers have no terminal, so none there."""
    if hasattr(config, "workerinput"):
        return None
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if terminal is None:
        return None

    lock = threading.Lock()  # the launches of an interleaved round report from threads of their own

    def show(text: str) -> None:
        with lock:
            if capture is not None:
                with capture.global_and_fixture_disabled():
                    terminal.write_line(f"[fabric] {text}")
            else:
                terminal.write_line(f"[fabric] {text}")

    return show


def with_inputs(options: fabric_options.FabricOptions) -> fabric_options.FabricOptions:
    """``options`` with the files it names read by their owners (--fabric-suite by
    ``References.load``, --fabric-baseline by ``baselines.Baseline.load``), and every fabric
    setting's secret value remembered for masking (``redact.remember``): what ``options.parse``
    leaves undone, so that parsing reads no file and changes no global state. A bad file is one
    usage error."""
    try:
        references = References.load(options.suite_path) if options.suite_path else References()
    except ReferenceError as exc:
        raise pytest.UsageError(f"--fabric-suite: {exc}") from None
    try:
        baseline = Baseline.load(options.baseline_path) if options.baseline_path else None
    except ResultsError as exc:
        raise pytest.UsageError(f"--fabric-baseline: {exc}") from None
    for fabric in (options.settings.fabric_table or {}).values():
        remember(fabric.nccl_env)  # a token given as a fabric setting is masked like the environment's
    return replace(options, references=references, baseline=baseline)
