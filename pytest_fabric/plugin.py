"""pytest glue: options, markers, parametrization, fixtures and reporting hooks.

The work lives in plain modules (``measure``, ``cluster``, ``gates``, ``report``); this module only
wires them into pytest. State lives in ``pytest.StashKey``s.
"""

from __future__ import annotations

import getpass
import math
import os
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field, replace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from . import options as fabric_options
from .cluster import Cluster, ClusterUnavailable, make_cluster
from .cluster.local import LocalCluster
from .matrix import expand
from .case import BANDWIDTH, Case
from .measure import (BandwidthMeasurement, Measurement, MeasurementError, Measurer, Settings,
                      configuration_tokens_per_s, counted)
from .models import get_model
from .redact import redact_file
from .references import References
from . import __version__
from .junit import SECTION, add_to_junit, gate_lines, measurement_lines, suite_properties, testcase_text
from .report import bandwidth_table, summary_tables
from .gates import GateOutcome, judge
from .results import identity_from_records, identity_mismatch, save_results
from .stats import (DEFAULT_NOISE, Interval, Look, NoisePrior, SequentialGate, Verdict, ahead_gate, contrast_interval,
                    reference_term, within_gate)
from .store import ResultStore
from .verdicts import INCONCLUSIVE, counts, gate_record, headline, outcome_of, undecided_night
from .workload import faults


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

    def prepared_cluster(self) -> Cluster:
        if not self._prepared:
            try:
                self.cluster.prepare()
            except ClusterUnavailable as exc:
                # Only the emulated cluster has a fallback; a Slurm or SSH cluster that cannot run is an error.
                if self.options.cluster != "auto" or self.cluster.name != "emulated":
                    raise pytest.UsageError(f"--cluster {self.options.cluster} ({self.cluster.name}): {exc}") from None
                self.cluster = LocalCluster()
                self.note = f"emulated cluster unavailable ({exc}); using local processes without link shaping"
            self._prepared = True
        return self.cluster

    def noise(self, cases: Sequence[Case] = ()) -> NoisePrior:
        """Launch-to-launch noise a gate over ``cases`` assumes before tonight's launches:
        --launch-noise, else what the --fabric-baseline learned from its nights for those
        configurations (else for all of its own), else the declared default."""
        o = self.options
        if o.launch_noise is not None:
            return o.launch_noise
        learned = o.baseline.noise([c.id for c in cases]) if o.baseline is not None else None
        return learned or DEFAULT_NOISE

    @property
    def store(self) -> ResultStore:
        return ResultStore(self.directory)

    def measurer(self) -> Measurer:
        if self._measurer is None:
            self._measurer = Measurer(self.prepared_cluster(), self.options.settings, self.store,
                                      self.directory / "launches", progress=_progress_writer(self.config))
        return self._measurer

    def recorded(self) -> list[Measurement]:
        """Every measurement of the session, one per (model, nodes, fabric) in the tested fabrics."""
        out = []
        for record in self.store.all().values():
            if "error" in record or record["case"]["model"] == BANDWIDTH:
                continue
            case = Case(**record["case"])
            fabrics = [case.fabric] if case.crosses_fabric else self.options.fabrics
            out.extend(Measurement.from_record(case.with_fabric(f), record) for f in fabrics)
        return out


    def recorded_bandwidth(self) -> list[BandwidthMeasurement]:
        return [BandwidthMeasurement.from_record(r) for r in self.store.all().values()
                if "error" not in r and r["case"]["model"] == BANDWIDTH]


SESSION_KEY = pytest.StashKey[FabricSession]()
MEASURED_KEY = pytest.StashKey[list[Measurement | BandwidthMeasurement]]()
VERDICTS_KEY = pytest.StashKey[list[str]]()
OUTCOMES_KEY = pytest.StashKey[list[GateOutcome]]()
ERRORED_KEY = pytest.StashKey[bool]()  # a measurement the test needed failed: its outcome is "error"
NO_FABRICS_KEY = pytest.StashKey[bool]()  # a comparison skipped because the fabrics share one link
REPORTER_NAME = "fabric-reporter"


def _session_directory(config: pytest.Config) -> Path:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "fabric_dir" in workerinput:
        return Path(workerinput["fabric_dir"])
    root = Path(tempfile.gettempdir()) / f"pytest-fabric-{getpass.getuser()}"
    return root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _progress_writer(config: pytest.Config):
    """Lines on the terminal while a launch runs; workers have no terminal, so none there."""
    if hasattr(config, "workerinput"):
        return None
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if terminal is None:
        return None

    def show(text: str) -> None:
        if capture is not None:
            with capture.global_and_fixture_disabled():
                terminal.write_line(f"[fabric] {text}")
        else:
            terminal.write_line(f"[fabric] {text}")

    return show


# -- options and configuration ---------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    fabric_options.add_options(parser)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fabric_matrix(models=None, nodes=None, fabrics=None, exclude_fabrics=(), min_nodes=1): parametrize "
        "the `fabric_case` fixture over model x nodes x fabric (each axis restricted to what the session selects)")
    config.addinivalue_line(
        "markers",
        "fabric_comparison: the test compares fabrics; it is skipped on a cluster where every fabric "
        "runs over the same links (the local cluster)")
    config.addinivalue_line(
        "markers",
        "fabric_regression: the test gates tonight against --fabric-baseline; collected only when one is given")
    opts = fabric_options.parse(config)
    try:
        faults.from_env()  # injected faults (harness self-tests): refuse a typo before any launch
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        cluster, note = make_cluster(opts.cluster, opts.hostfile, opts.ssh_config, opts.ssh_host_key_checking)
    except ClusterUnavailable as exc:
        raise pytest.UsageError(f"--cluster {opts.cluster}: {exc}") from None
    nodes = opts.nodes or cluster.default_nodes()
    if nodes > cluster.max_nodes():
        raise pytest.UsageError(
            f"--nodes {nodes}: the {cluster.name} cluster has {cluster.max_nodes()} nodes; "
            f"use --nodes {cluster.max_nodes()} or fewer")
    ranks = nodes * opts.settings.gpus_per_node
    max_ranks = cluster.max_ranks()
    if max_ranks is not None and ranks > max_ranks:
        raise pytest.UsageError(
            f"--nodes {nodes} x --gpus-per-node {opts.settings.gpus_per_node} = {ranks} ranks, but the "
            f"{cluster.name} cluster runs every rank on this machine and allows at most {max_ranks}; "
            f"lower --nodes or --gpus-per-node")
    session = FabricSession(config, opts, nodes, cluster, note, _session_directory(config))
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(FabricReporter(session), REPORTER_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin(REPORTER_NAME)
    if reporter is not None:
        config.pluginmanager.unregister(reporter)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: every worker shares the controller's results directory."""
    # Only the path: the directory appears with the first measurement, so a run that measures
    # nothing leaves nothing behind.
    node.workerinput["fabric_dir"] = str(node.config.stash[SESSION_KEY].directory)


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    o = session.options
    rates = ", ".join(f"{f} {o.settings.fabric(f).emulated_mbit:g} Mbit/s" for f in o.fabrics)
    lines = [
        f"fabric: cluster {session.cluster.describe()}; nodes up to {session.nodes} x {o.settings.gpus_per_node} per node",
        f"fabric: fabrics {', '.join(o.fabrics)}"
        + (f" (emulated links: {rates})" if session.cluster.realizes_fabrics else ""),
        f"fabric: models {', '.join(o.models)}; {o.settings.warmup_steps} warm-up + {_measuring(o.settings)}; "
        f"results in {session.directory}",
    ]
    if session.note:
        lines.append(f"fabric: NOTE {session.note}")
    if o.baseline is None:
        lines.append("fabric: regression gates off (no --fabric-baseline given)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a baseline the regression gates are not collected (the header says so once), rather
    than skipped one by one among the comparisons."""
    if config.stash[SESSION_KEY].options.baseline is not None:
        return
    off = [item for item in items if item.get_closest_marker("fabric_regression") is not None]
    if off:
        items[:] = [item for item in items if item.get_closest_marker("fabric_regression") is None]
        config.hook.pytest_deselected(items=off)


def _measuring(s: Settings) -> str:
    if not s.measure_s:
        return f"{s.steps} measured steps"
    return f"at least {s.steps} measured steps, then to {s.step_precision:.0%} precision within {s.measure_s:g} s"


# -- parametrization -------------------------------------------------------------------------

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fabric_link" in metafunc.fixturenames:
        # Collective bandwidth needs two nodes at least: one node never touches the fabric.
        session = metafunc.config.stash[SESSION_KEY]
        marker = metafunc.definition.get_closest_marker("fabric_matrix")
        excluded = marker.kwargs.get("exclude_fabrics", ()) if marker else ()  # e.g. the reference itself
        fabrics = [f for f in session.options.fabrics if f not in excluded]
        links = expand([BANDWIDTH], session.nodes, fabrics, min_nodes=2)
        metafunc.parametrize("fabric_link", links, ids=[c.id for c in links])
    if "fabric_case" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[SESSION_KEY]
    o = session.options
    marker = metafunc.definition.get_closest_marker("fabric_matrix")
    kw = dict(marker.kwargs) if marker else {}
    unknown = set(kw) - {"models", "nodes", "fabrics", "exclude_fabrics", "min_nodes"}
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: fabric_matrix got unknown argument(s) "
                                f"{', '.join(sorted(unknown))}; allowed: models, nodes, fabrics, exclude_fabrics, "
                                f"min_nodes")
    # The session selects (--models/--fabrics); a marker only restricts: a suite lists which models
    # form its class (compute-bound, communication-bound) and runs those the session selected.
    models = [m for m in (kw.get("models") or o.models) if m in o.models]
    excluded = kw.get("exclude_fabrics", ())
    fabrics = [f for f in (kw.get("fabrics") or o.fabrics) if f in o.fabrics and f not in excluded]
    cases = expand(models, session.nodes, fabrics, nodes=kw.get("nodes"), min_nodes=kw.get("min_nodes", 1))
    metafunc.parametrize("fabric_case", cases, ids=[c.id for c in cases])


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fabric_session(pytestconfig: pytest.Config) -> FabricSession:
    return pytestconfig.stash[SESSION_KEY]


@pytest.fixture(scope="session")
def fabric_references(fabric_session: FabricSession) -> References:
    """Thresholds and expected values from --fabric-suite (empty without one: suites use their defaults)."""
    return fabric_session.options.references


@pytest.fixture(scope="session")
def fabric_cluster(fabric_session: FabricSession) -> Cluster:
    """The cluster ranks start on (prepared: namespaces can be made, stale ones swept)."""
    return fabric_session.prepared_cluster()


class MeasureFixture:
    """``fabric_measure(case)`` -> Measurement: launched once per session, then served from the cache."""

    def __init__(self, session: FabricSession, item: pytest.Item) -> None:
        self._session = session
        self._item = item

    def __call__(self, case: Case, launch: int = 0) -> Measurement:
        return self._record(lambda: self._session.measurer().measure(case, launch))

    def _record(self, measure):
        try:
            m = measure()
        except MeasurementError as exc:
            message = f"measurement failed: {exc}"
            self._item.stash[ERRORED_KEY] = True
        else:
            message = None
        if message is not None:  # outside the except: the report shows the launch's failure once, unchained
            pytest.fail(message, pytrace=False)
        self._item.stash.setdefault(MEASURED_KEY, []).append(m)
        if m.result.transport_problem:
            # The numbers are real, but not of the fabric that was asked for.
            pytest.fail(f"wrong transport: {m.result.transport_problem}", pytrace=False)
        impossible = _impossible(self._session, m) if isinstance(m, Measurement) else _impossible_payloads(
            self._session, m)
        if impossible:
            pytest.fail(f"faster than physically possible: {impossible}", pytrace=False)
        return m

    def bandwidth(self, case: Case) -> BandwidthMeasurement:
        """Collective bandwidth over ``case``'s nodes and fabric (all_reduce, all_gather, reduce_scatter)."""
        return self._record(lambda: self._session.measurer().measure_bandwidth(case))


class CompareFixture:
    """Gates decided on repeated, interleaved launches (reference, candidate, reference, ...).

    ``--repeats`` launches per side first (launches set aside as disturbed are replaced), then one
    pair more while the interval of the ratio straddles the threshold, up to ``--max-repeats``
    per side; launches are cached per index, so a reference measured for one comparison serves
    the next one too. The interval is ``stats.contrast_interval`` of the launches' values (each a
    robust value of its steps, with its own precision), with the session's launch-noise prior.
    """

    def __init__(self, measure: MeasureFixture, session: FabricSession, item: pytest.Item) -> None:
        self._measure = measure
        self._session = session
        self._item = item

    def within(self, candidate: Case, reference: Case, rel: float = 0.05) -> GateOutcome:
        """``candidate`` is at most ``rel`` slower than ``reference`` (one-sided)."""
        return self._compare(candidate, reference, within_gate(rel), f"{candidate.fabric} at most {rel:.0%} slower")

    def ahead(self, reference: Case, candidate: Case, by: float = 0.20) -> GateOutcome:
        """``reference`` is at least ``by`` faster than ``candidate`` (one-sided)."""
        return self._compare(reference, candidate, ahead_gate(by), f"{reference.fabric} at least {by:.0%} ahead")

    def _gate(self, threshold: float, direction: str, cases: Sequence[Case]) -> SequentialGate:
        o = self._session.options
        return SequentialGate(threshold, direction, start=o.repeats, budget=o.max_repeats,
                              prior=self._session.noise(cases))

    def _launch_until_decided(self, cases: Sequence[Case], signs: Sequence[float], gate: SequentialGate,
                              per_gpu: bool = False, fixed: tuple[float, float] = (0.0, 0.0),
                              ) -> tuple[list[list[Measurement]], Look]:
        """Launch every case once per round (interleaved, in ``cases`` order) until ``--repeats``
        rounds have no disturbed launch and a look decides, or the budget is spent.

        The gate judges sum_j signs[j] x log tokens/s of cases[j] (per GPU with ``per_gpu``) plus
        ``fixed``, blocked by round: launches of one round ran back to back, so a drift of the
        machine that hits both cancels. A round with a launch set aside is left out whole."""
        o = self._session.options
        runs: list[list[Measurement]] = [[] for _ in cases]
        while True:
            index = len(runs[0])
            for case, launches in zip(cases, runs):
                launches.append(self._measure(case, launch=index))
            spent = index + 1 >= o.max_repeats
            rounds = [r for r in zip(*runs) if not any(m.set_aside for m in r)]
            if not spent and len(rounds) < o.repeats:
                continue  # a disturbed launch is replaced before the first look
            if rounds:
                groups = [(sign, [r[j].sample(per_gpu) for r in rounds]) for j, sign in enumerate(signs)]
                result = gate.look(groups, fixed, blocked=True, launches=index + 1)
            else:
                groups = [(sign, [m.sample(per_gpu) for m in counted(launches)]) for sign, launches in zip(signs, runs)]
                result = gate.look(groups, fixed, launches=index + 1)
                if any(all(m.set_aside for m in launches) for launches in runs):
                    # Only disturbed launches on a side: their figures stand in the output, but decide nothing.
                    return runs, replace(result, verdict=Verdict.INCONCLUSIVE)
            if result.verdict is not Verdict.INCONCLUSIVE or spent:
                return runs, result

    def _compare(self, a: Case, b: Case, gate_spec: tuple[float, str], requirement: str) -> GateOutcome:
        threshold, direction = gate_spec
        gate = self._gate(threshold, direction, (a, b))
        # b first: interleaved b a b a ...
        (runs_b, runs_a), look = self._launch_until_decided((b, a), (-1, +1), gate)
        outcome = GateOutcome(
            a.fabric, b.fabric, threshold, requirement, look.interval, look.verdict,
            (configuration_tokens_per_s(runs_a), configuration_tokens_per_s(runs_b)), "tokens/s",
            f"[{a.model}, {a.nodes} node(s)]", gate.prior, _set_aside(runs_a + runs_b))
        predicted = _predicted(self._session, a, b, {"a": counted(runs_a), "b": counted(runs_b)}, outcome.interval)
        # Measured, floor and predicted side by side.
        predicted = "\n".join([predicted, *(_floor_line(self._session, runs) for runs in (runs_a, runs_b))])
        self._item.stash.setdefault(OUTCOMES_KEY, []).append(outcome)
        lines = self._item.stash.setdefault(VERDICTS_KEY, [])
        # In the output (JUnit system-out) whatever the verdict, and in a failure's message.
        lines.append(predicted)
        line = judge(outcome, self._session.options.inconclusive, note=predicted)
        lines.insert(len(lines) - 1, line)
        return outcome

    def no_regression(self, case: Case, rel: float | None = None) -> GateOutcome:
        """Tonight's ``case`` is not more than ``rel`` below the --fabric-baseline run's.

        A fabric regression is a loss of scaling, so by default (``--regression-on scaling``) the
        gate judges scaling efficiency: tokens/s/GPU of ``case`` over the same night's one-node
        tokens/s/GPU (a launch that never crosses the fabric), tonight against the baseline's.
        A machine that is slower all night moves both and not their ratio. The raw tokens/s
        ratio is shown beside it; ``--regression-on tokens`` gates that instead (also where the
        baseline has no one-node measurement of the model, or ``case`` is one node).

        Skips when there is no baseline or it never measured ``case``. A baseline from other
        hardware or software is compared all the same, with a loud warning naming the differences.
        """
        o = self._session.options
        baseline = o.baseline
        if baseline is None:
            pytest.skip("no --fabric-baseline given")
        if not baseline.values.get(case.id):
            pytest.skip(f"the baseline {baseline.path} has no measurement of {case.id}")
        rel = o.regression_threshold if rel is None else rel
        threshold, direction = within_gate(rel)
        one = case.with_nodes(1)
        gate = self._gate(threshold, direction, (case, one) if o.regression_on == "scaling" else (case,))
        by_scaling = o.regression_on == "scaling" and case.nodes > 1 and bool(baseline.values.get(one.id))
        past = reference_term(baseline.values[case.id], gate.prior)

        def raw(tonight: list[Measurement], confidence: float) -> Interval:
            return contrast_interval([(+1, [m.sample() for m in counted(tonight)])], gate.prior, confidence,
                                     (-past[0], past[1]))

        if by_scaling:
            # log efficiency = log(multi / gpus) - log(one / gpus_one); tonight's launches give it per GPU.
            gpus = math.log(baseline.gpus.get(case.id, 1)) - math.log(baseline.gpus.get(one.id, 1))
            nights = baseline.paired(case.id, one.id)
            if len(nights) >= 2:
                # Each night's own efficiency: what moved both of a night's values (the machine's speed
                # that night) cancels, as it does in tonight's rounds.
                past_eff = reference_term([multi / single for multi, single in nights], gate.prior)
                fixed = (-(past_eff[0] - gpus), past_eff[1])
            else:  # a single saved night, or nights that measured only one of the two: the values apart
                past_one = reference_term(baseline.values[one.id], gate.prior)
                fixed = (-(past[0] - past_one[0] - gpus), past[1] + past_one[1])
            (runs_one, tonight), result = self._launch_until_decided((one, case), (-1, +1), gate, per_gpu=True,
                                                                     fixed=fixed)
            values = (configuration_tokens_per_s(tonight, per_gpu=True) / configuration_tokens_per_s(runs_one, per_gpu=True),
                      math.exp(-fixed[0]))
            tokens = raw(tonight, result.interval.confidence)
            what, unit = "scaling", f"scaling efficiency (n{case.nodes} over n1 tokens/s/GPU)"
            extra = (f"raw tokens/s tonight/baseline = {tokens.point:.3f} [{tokens.low:.3f}, {tokens.high:.3f}]: "
                     f"tonight {configuration_tokens_per_s(tonight):.1f} vs baseline {math.exp(past[0]):.1f}")
            launches = runs_one + tonight
        else:
            (tonight,), result = self._launch_until_decided((case,), (+1,), gate, fixed=(-past[0], past[1]))
            values = (configuration_tokens_per_s(tonight), math.exp(past[0]))
            what, unit = "tokens/s", "tokens/s"
            extra = ("" if case.nodes == 1 or o.regression_on == "tokens"
                     else f"judged on raw tokens/s: the baseline has no one-node measurement of {case.model}")
            launches = tonight
        mismatch = identity_mismatch(baseline.identity, identity_from_records(self._session.store.all()),
                                     ("baseline", "tonight"))
        if mismatch:
            warnings.warn(FabricIdentityWarning(f"{case.id}: comparing against a baseline from a different "
                                                f"set-up: " + "; ".join(mismatch)), stacklevel=2)
            extra = "; ".join(filter(None, [extra, f"DIFFERENT SET-UP: {'; '.join(mismatch)}"]))
        outcome = GateOutcome("tonight", "baseline", threshold, f"{what} at most {rel:.0%} below the baseline",
                              result.interval, result.verdict, values, unit, f"[{case.id}]", gate.prior,
                              _set_aside(launches), extra)
        self._item.stash.setdefault(OUTCOMES_KEY, []).append(outcome)
        self._item.stash.setdefault(VERDICTS_KEY, []).append(judge(outcome, o.inconclusive))
        return outcome


def _set_aside(launches: Sequence[Measurement]) -> tuple[str, ...]:
    """One description per launch the gate did not count."""
    return tuple(f"{m.case.id} launch {m.launch + 1}: {m.set_aside}" for m in launches if m.set_aside)


def _predicted(session: FabricSession, a: Case, b: Case, runs: dict[str, list[Measurement]],
               interval: Interval) -> str:
    """The analytical model's prediction for comparing ``a`` with ``b``, next to the measurement.

    Link rates: the declared one (--fabric-link-gbit) where given, else on the emulated cluster the
    exact emulated rate (--fabric-rate included), on a real one the fabric's nominal rate. Compute throughput: --fabric-flops when given, else fitted to
    the faster fabric's measured step (so the penalty is predicted from the fast side alone).
    Never raises: a prediction that cannot be made says why.
    """
    try:
        from .predict import predict_comparison, recorded_bytes

        o = session.options
        settings = o.settings
        emulated = session.cluster.name == "emulated"
        rates = {}
        for f in (a.fabric, b.fabric):
            rates[f] = settings.fabric(f).link_gbit(emulated)
            if not rates[f]:
                return f"predicted: unavailable (no nominal link rate known for fabric {f!r})"
        fast = a.fabric if rates[a.fabric] >= rates[b.fabric] else b.fabric
        fast_runs = runs["a"] if fast == a.fabric else runs["b"]
        r = fast_runs[0].result  # what ran: shape, precision, ranks per node
        fast_step = r.tokens_per_step / configuration_tokens_per_s(fast_runs)
        param_bytes, grad_bytes = recorded_bytes(r)
        prediction = predict_comparison(
            get_model(a.model), a.nodes, r.local_world_size or settings.gpus_per_node,
            r.batch_size, r.seq_len, rates=rates, fast_step_s=fast_step, flops_per_s=o.flops_per_rank,
            param_bytes=param_bytes, grad_bytes=grad_bytes, activation_checkpointing=r.activation_checkpointing)
        # The measured slow/fast ratio: the interval is of a/b (its bounds are positive).
        measured = ((interval.point, interval.low, interval.high, interval.confidence) if fast == b.fabric
                    else (1 / interval.point, 1 / interval.high, 1 / interval.low, interval.confidence))
        return prediction.line(measured)
    except Exception as exc:  # noqa: BLE001 - a prediction must never turn a test into an error
        return f"predicted: unavailable ({type(exc).__name__}: {exc})"


def _link(session: FabricSession, name: str):
    """(fabric, its link rate in Gbit/s or None, where the rate comes from) for the floor."""
    fabric = session.options.settings.fabric(name)
    emulated = session.cluster.name == "emulated"
    source = "declared" if fabric.declared_gbit else "emulated" if emulated else "nominal"
    return fabric, fabric.link_gbit(emulated), source


def _run_floor(session: FabricSession, m: Measurement):
    """The physical floor of ``m``'s configuration on its fabric's link; None on one node or where
    no link rate is known (a fabric without a nominal rate on a real cluster, nothing declared)."""
    from .floor import run_floor

    _, link, _ = _link(session, m.case.fabric)
    if m.case.nodes < 2 or not link:
        return None
    return run_floor(get_model(m.case.model), m.case.nodes, link, m.result, session.options.floor_tolerance)


def _impossible(session: FabricSession, m: Measurement) -> str | None:
    """Why ``m``'s step is shorter than its fabric's link can carry the job's traffic, or None."""
    from .floor import transport_hint

    floor = _run_floor(session, m)
    if floor is None:
        return None
    fabric, _, source = _link(session, m.case.fabric)
    return floor.problem(m.step_s, m.case.fabric, transport_hint(dict(fabric.nccl_env), source))


def _impossible_payloads(session: FabricSession, bw: BandwidthMeasurement) -> str | None:
    """The collective payloads of ``bw`` that needed more than its fabric's link can carry, or None."""
    from .floor import impossible_payloads, transport_hint

    fabric, link, source = _link(session, bw.case.fabric)
    if not link:
        return None
    flagged = impossible_payloads(bw.rows, bw.case.nodes, link, session.options.floor_tolerance)
    if not flagged:
        return None
    return (f"{bw.case.fabric}: {'; '.join(flagged)}; {bw.case.fabric}'s link is {link:g} Gbit/s per node "
            f"(+{session.options.floor_tolerance:.0%} tolerance): these bytes did not cross {bw.case.fabric} at its rate "
            f"({transport_hint(dict(fabric.nccl_env), source)})")


def _floor_line(session: FabricSession, launches: Sequence[Measurement]) -> str:
    """``floor: ...`` for one side of a comparison: its configuration's step next to the floor. Never
    raises, like the prediction: each launch's floor was already enforced when it was measured."""
    m = launches[0]
    try:
        floor = _run_floor(session, m)
        if floor is None:
            reason = "one node" if m.case.nodes < 2 else f"no link rate known for fabric {m.case.fabric!r}"
            return f"floor: {m.case.fabric} none ({reason})"
        return floor.line(m.result.tokens_per_step / configuration_tokens_per_s(launches), m.case.fabric)
    except Exception as exc:  # noqa: BLE001 - an output line must never turn a test into an error
        return f"floor: {m.case.fabric} unavailable ({type(exc).__name__}: {exc})"


class FabricIdentityWarning(UserWarning):
    """Two runs being compared ran on different hardware or software."""


@pytest.fixture
def fabric_compare(fabric_measure: MeasureFixture, fabric_session: FabricSession,
                   request: pytest.FixtureRequest) -> CompareFixture:
    return CompareFixture(fabric_measure, fabric_session, request.node)


@pytest.fixture
def fabric_measure(fabric_session: FabricSession, request: pytest.FixtureRequest) -> MeasureFixture:
    return MeasureFixture(fabric_session, request.node)


@pytest.fixture
def fabric_link(request: pytest.FixtureRequest) -> Case:
    """One (nodes, fabric) for collective bandwidth; parametrized by ``pytest_generate_tests``."""
    return request.param


@pytest.fixture
def fabric_case(request: pytest.FixtureRequest) -> Case:
    """One (model, nodes, fabric) of the matrix; parametrized by ``pytest_generate_tests``."""
    return request.param


# -- running and reporting -------------------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("fabric_comparison") is None:
        return
    session = item.config.stash[SESSION_KEY]
    cluster = session.prepared_cluster()
    if not cluster.realizes_fabrics:
        reason = session.note or f"the {cluster.name} cluster runs every fabric over the same links"
        if session.note:  # `auto` fell back for lack of root: the night decides no comparison
            item.stash[NO_FABRICS_KEY] = True
        pytest.skip(f"fabric comparison needs distinct fabrics: {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    measured = item.stash.get(MEASURED_KEY, [])
    if call.when == "call" and measured and item.config.getini("junit_family") in ("xunit1", "legacy"):
        # The xunit2 schema has no testcase properties; there the numbers go to system-out only.
        groups: dict[str, list[Measurement | BandwidthMeasurement]] = {}
        for m in measured:
            groups.setdefault(f"{type(m).__name__} {m.case.id}", []).append(m)
        for group in groups.values():
            item.user_properties.extend(measurement_lines(group).items())
        for gate in item.stash.get(OUTCOMES_KEY, []):
            item.user_properties.extend(gate_lines(gate).items())
    report = yield
    gates = item.stash.get(OUTCOMES_KEY, [])
    if call.when == "call" and measured:
        report.sections.append((SECTION, testcase_text(measured, item.stash.get(VERDICTS_KEY, []), gates)))
    # Plain attributes: they travel with the report from an xdist worker to the controller.
    report.fabric_outcome = outcome_of(report, gates, item.stash.get(ERRORED_KEY, False))
    report.fabric_gate = bool(gates)
    report.fabric_headline = headline(gates)
    report.fabric_gates = [gate_record(g) for g in gates]
    report.fabric_no_fabrics = item.stash.get(NO_FABRICS_KEY, False)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """An inconclusive gate is its own outcome on the terminal (not an xfail, not a pass); under
    --inconclusive fail it stays a failure there, so that it is listed with the failures."""
    if report.when == "call" and not report.failed and getattr(report, "fabric_outcome", None) == INCONCLUSIVE:
        return INCONCLUSIVE, "I", "INCONCLUSIVE"
    return None


class FabricReporter:
    """Controller-side reporting, registered per config (it needs the session's state in hooks that
    receive only a report): collects each test's text, edits the JUnit file, prints the tables."""

    def __init__(self, fabric: FabricSession) -> None:
        self.fabric = fabric
        self.verdicts: list[dict[str, str]] = []
        # nodeid -> (outcome word, one-line message, whether the test decided gates), every test.
        self.outcomes: dict[str, tuple[str, str, bool]] = {}
        self.undecided_text: dict[str, str] = {}  # nodeid -> an inconclusive gate's verdict text
        self.gates: dict[str, list[dict[str, Any]]] = {}  # nodeid -> its gates' fields (verdicts.gate_record)
        self.no_fabrics = 0  # comparisons skipped because `auto` fell back to local processes
        self.undecided: str | None = None  # why the night decided nothing (--undecided-night)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Under xdist the controller sees every worker's reports here.
        word = getattr(report, "fabric_outcome", None)
        if word is None:
            return
        message = getattr(report, "fabric_headline", "")
        if report.failed:
            message = report.longreprtext.strip().splitlines()[0] if report.longreprtext.strip() else "failed"
        elif report.skipped and not message and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
        if report.when == "call" or report.failed or report.skipped:  # a teardown error overrides the call
            self.outcomes[report.nodeid] = (word, message, getattr(report, "fabric_gate", False))
        self.no_fabrics += bool(getattr(report, "fabric_no_fabrics", False) and report.skipped)
        if getattr(report, "fabric_gates", None):
            self.gates[report.nodeid] = report.fabric_gates
        if word == INCONCLUSIVE:
            self.undecided_text[report.nodeid] = str(getattr(report, "wasxfail", "") or message)
        if report.when != "call":
            return
        text = next((t for name, t in report.sections if name == SECTION), None)
        if text is None:
            return
        self.fabric.outputs[report.nodeid] = text
        if word == "pass" and not message:
            message = next((line for line in text.splitlines() if line.startswith("pass:")), "")
        self.verdicts.append({"test": report.nodeid, "outcome": word, "message": message,
                              "gates": list(getattr(report, "fabric_gates", []))})

    @pytest.hookimpl(trylast=True)  # after junitxml has written its file
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        if hasattr(config, "workerinput"):
            return
        # --undecided-night fail: a night that decided no gate exits 1 (the summary says why).
        gates = [word for word, _, gate in self.outcomes.values() if gate]
        self.undecided = undecided_night(gates, self.no_fabrics, self.fabric.note)
        if self.undecided and self.fabric.options.undecided_night == "fail" and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._save()
        self._dashboards()
        xmlpath = getattr(config.option, "xmlpath", None)
        if not xmlpath or not Path(xmlpath).exists():
            return
        path = Path(xmlpath)
        if self.fabric.outputs or self.no_fabrics or any(gate for _, _, gate in self.outcomes.values()):
            add_to_junit(path, self.fabric.outputs, self._suite_properties(), prefix=config.option.junitprefix,
                         inconclusive={nodeid: (message, self.undecided_text.get(nodeid, ""))
                                       for nodeid, (word, message, _) in self.outcomes.items() if word == INCONCLUSIVE})
        redact_file(path)  # failure messages and captured output may quote a rank's environment

    def _night_verdicts(self) -> list[dict[str, Any]]:
        """Every test's outcome word and message, with its gates' fields: skipped gates too."""
        measured = {v["test"]: v for v in self.verdicts}
        return [measured.get(nodeid, {"test": nodeid, "outcome": word, "message": message,
                                      "gates": self.gates.get(nodeid, [])})
                for nodeid, (word, message, _) in self.outcomes.items()]

    def _dashboards(self) -> None:
        """--fabric-metrics, --fabric-benchmark-json and, under GitHub Actions, the job summary."""
        o = self.fabric.options
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if not (o.metrics or o.benchmark_json or (step_summary and self.outcomes)):
            return
        from .dashboards import build_tables, write_outputs
        from .results import SavedRun, run_from_store

        records = self.fabric.store.all() if (self.fabric.directory / "measurements.json").exists() else {}
        run = run_from_store(records, o.fabrics) if records else SavedRun({})
        run.verdicts = self._night_verdicts()
        tables = build_tables(run, records)
        if self.undecided:
            tables.notes.append(f"no verdict tonight: {self.undecided}")
        write_outputs(tables, o.metrics, o.benchmark_json, step_summary if self.outcomes else None)

    def _save(self) -> None:
        """--fabric-save: everything measured, also when tests failed or the run was interrupted."""
        fabric = self.fabric
        if (fabric.options.save is None or hasattr(fabric.config, "workerinput")
                or not (fabric.directory / "measurements.json").exists()):
            return
        identity = {"cluster": fabric.cluster.describe(), "cluster_kind": fabric.cluster.name,
                    "nodes": fabric.nodes, "gpus_per_node": fabric.options.settings.gpus_per_node,
                    "fabrics": list(fabric.options.fabrics)}
        save_results(fabric.options.save, fabric.store.all(), identity, self._night_verdicts(), fabric.options.prices)

    def _suite_properties(self) -> dict[str, str]:
        fabric, o = self.fabric, self.fabric.options
        facts = {"fabric.cluster": fabric.cluster.describe(), "fabric.cluster_kind": fabric.cluster.name,
                 "fabric.fabrics": ",".join(o.fabrics), "fabric.nodes": str(fabric.nodes),
                 "fabric.gpus_per_node": str(o.settings.gpus_per_node),
                 "fabric.repeats": f"{o.repeats} to {o.max_repeats} launches per side",
                 "fabric.inconclusive": o.inconclusive,
                 # The session's prior; a gate whose configurations the baseline learned uses theirs (its fields say).
                 "fabric.launch_noise": f"{fabric.noise().sigma:.6g}",
                 "fabric.launch_noise_source": fabric.noise().source, "fabric.project_version": __version__}
        facts.update({f"fabric.outcome.{word}": str(n)
                      for word, n in counts(word for word, _, _ in self.outcomes.values()).items()})
        if self.undecided:
            facts["fabric.undecided"] = self.undecided
        return suite_properties([*fabric.recorded(), *fabric.recorded_bandwidth()], facts)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        fabric = self.fabric
        if self.undecided and not hasattr(fabric.config, "workerinput"):
            exit_note = "exit 1" if fabric.options.undecided_night == "fail" else "--undecided-night pass"
            terminalreporter.write_line(f"fabric: no verdict tonight ({exit_note}): {self.undecided}", yellow=True)
        if hasattr(fabric.config, "workerinput") or not (fabric.directory / "measurements.json").exists():
            return
        measured = fabric.recorded()
        errors = [r["error"].splitlines()[0] for r in fabric.store.all().values() if "error" in r]
        bandwidth = fabric.recorded_bandwidth()
        if not measured and not errors and not bandwidth:
            return
        terminalreporter.write_sep("=", "fabric throughput (tokens/s)")
        for line in summary_tables(measured, fabric.options.fabrics):
            terminalreporter.write_line(line)
        for line in bandwidth_table(bandwidth):
            terminalreporter.write_line(line)
        if fabric.options.prices:
            from .reportgen import cost_lines
            from .results import run_from_store

            for line in cost_lines(run_from_store(fabric.store.all(), fabric.options.fabrics), fabric.options.prices):
                terminalreporter.write_line(line)
        for line in errors:
            terminalreporter.write_line(f"failed launch: {line}")
        terminalreporter.write_line(f"launch logs and results: {fabric.directory}")
        if fabric.options.save:
            terminalreporter.write_line(f"results saved to {fabric.options.save}")
