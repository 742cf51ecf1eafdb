"""pytest glue: options, markers, parametrization, fixtures and hooks; registration only.

The work lives in plain modules: session state in ``session``, the fixtures' objects in
``fixtures``, the controller's reporting in ``reporter``, measuring in ``measure`` and
``cluster``, deciding in ``deciding/`` (``rounds``, ``contrasts``, ``sequential``, ``gates``). State that travels with a test lives in the
``pytest.StashKey``s of ``session``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from .running import options as fabric_options
from .running.option_table import add_options
from .core.case import BANDWIDTH, Case
from .cluster import Cluster, ClusterUnavailable, make_cluster
from .running.fixtures import CompareFixture, MeasureFixture, link_rate_or_skip
from .running.link_fixtures import LinkNode, LinkPairs, LinksFixture, link_cases, link_nodes
from .history.junit import SECTION, gate_lines, measurement_lines, testcase_text
from .running.matrix import expand
from .running import plan as night_plan
from .measuring.link_rate import LinkRate
from .measuring.measurement import BandwidthMeasurement, Measurement
from .deciding.references import References
from .reporting.reporter import REPORTER_NAME, FabricReporter
from .running.session import (CONTRADICTION_KEY, ERRORED_KEY, MEASURED_KEY, NO_FABRICS_KEY, NOTES_KEY, OUTCOMES_KEY,
                              SESSION_KEY, FabricSession, session_directory, with_inputs)
from .deciding.verdicts import INCONCLUSIVE, headline, outcome_of
from .workload import faults

PLAN_SHOWN_KEY = pytest.StashKey[bool]()  # xdist's controller showed the night's plan


# -- options and configuration ---------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fabric_matrix(models=None, nodes=None, fabrics=None, exclude_fabrics=(), min_nodes=1, shardings=None): "
        "parametrize the `fabric_case` fixture over model x nodes x sharding x fabric (each axis restricted to what "
        "the session selects)")
    config.addinivalue_line(
        "markers",
        "fabric_comparison(expect=None): the test compares fabrics; it is skipped on a cluster where every fabric "
        "runs over the same links (the local cluster). expect='within' (the candidate keeps up) or 'ahead' (the "
        "reference leads): checked against the model's prediction before the night (with --fabric-flops)")
    config.addinivalue_line(
        "markers",
        "fabric_regression: the test gates tonight against --fabric-baseline; collected only when one is given")
    opts = with_inputs(fabric_options.parse(config))
    try:
        faults.from_env()  # injected faults (harness self-tests): refuse a typo before any launch
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        cluster, note = make_cluster(opts.cluster, opts.cluster_options())
    except ClusterUnavailable as exc:
        raise pytest.UsageError(f"--cluster {opts.cluster}: {exc}") from None
    if not opts.gpus_per_node_given and (gpus := cluster.gpus_per_node()):
        opts = fabric_options.with_gpus_per_node(opts, gpus)  # the allocation's GPUs, the hostfile's slots
    nodes = opts.nodes or cluster.default_nodes()
    if nodes > cluster.max_nodes():
        raise pytest.UsageError(
            f"--nodes {nodes}: the {cluster.name} cluster has {cluster.max_nodes()} nodes; "
            f"use --nodes {cluster.max_nodes()} or fewer")
    ranks = nodes * opts.settings.gpus_per_node
    max_ranks = cluster.max_ranks()
    # --collect-only launches nothing: it may plan for a cluster larger than this machine.
    if max_ranks is not None and ranks > max_ranks and not config.option.collectonly:
        raise pytest.UsageError(
            f"--nodes {nodes} x --gpus-per-node {opts.settings.gpus_per_node} = {ranks} ranks, but the "
            f"{cluster.name} cluster runs every rank on this machine and allows at most {max_ranks}; "
            f"lower --nodes or --gpus-per-node")
    session = FabricSession(config, opts, nodes, cluster, note, session_directory(config, opts.run_dir))
    config.stash[SESSION_KEY] = session
    if not hasattr(config, "workerinput"):
        # A session killed before it ended left its completed launches beside --fabric-save.
        _, session.resumed = session.store.resume()
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
        f"fabric: models {', '.join(o.models)}; {o.settings.warmup_steps} warm-up + {o.settings.measuring()}; "
        f"results in {session.directory}",
    ]
    if session.note:
        lines.append(f"fabric: NOTE {session.note}")
    if session.resumed:
        lines.append(f"fabric: {session.resumed}")
    if o.baseline is None:
        lines.append("fabric: regression gates off (no --fabric-baseline given)")
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that ended on its own leaves nothing to resume; an interrupted one keeps it."""
    fabric = session.config.stash.get(SESSION_KEY, None)
    if fabric is not None and not hasattr(session.config, "workerinput") \
            and exitstatus != pytest.ExitCode.INTERRUPTED:
        fabric.store.finished()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Launches reused from a killed session: said at the end too (``-q`` shows no header)."""
    session = config.stash.get(SESSION_KEY, None)
    if session is not None and session.resumed and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"fabric: {session.resumed}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a baseline the regression gates are not collected (the header says so once), rather
    than skipped one by one among the comparisons. The night's family of gates is what the suites
    collected, counted here, before ``-k`` and ``-m`` select (tryfirst): the same launches get the
    same verdict whichever gates a run selects."""
    fabric = config.stash[SESSION_KEY]
    if fabric.options.baseline is None:
        off = [item for item in items if item.get_closest_marker("fabric_regression") is not None]
        if off:
            items[:] = [item for item in items if item.get_closest_marker("fabric_regression") is None]
            config.hook.pytest_deselected(items=off)
    fabric.gates = sum(1 for item in items if "fabric_compare" in getattr(item, "fixturenames", ()))


# A test that asks for one of these may launch ranks: its session checks every node first.
LAUNCHING_FIXTURES = {"fabric_measure", "fabric_compare", "fabric_cluster", "fabric_links"}


@pytest.hookimpl(tryfirst=True)  # on an xdist worker, before xdist reports the collection: the plan is saved
def pytest_collection_finish(session: pytest.Session) -> None:
    """The selected comparisons are set against the model (``check_expectations``), and what it
    predicts to fail is said. Where any selected test launches, every node is checked now, before the first test
    (``FabricSession.check_nodes``): a session its nodes refuse (a run directory no node sees) ends
    here in one line. Under xdist the controller collects nothing, and the first worker to launch
    checks the nodes; the night's plan is made by the first worker to collect and shown by the
    controller (``pytest_xdist_node_collection_finished``)."""
    fabric = session.config.stash[SESSION_KEY]
    fabric.check_expectations(session.items)  # the selected ones: what -k and -m left
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and fabric.expectations_checked:
        for line in fabric.expectation_lines():
            terminal.write_line(f"fabric: {line}")
    launches = any(name in LAUNCHING_FIXTURES for item in session.items for name in getattr(item, "fixturenames", ()))
    if launches:
        night_plan.announce(session, fabric)
    if launches and not session.config.option.collectonly and not hasattr(session.config, "workerinput"):
        fabric.prepared_cluster()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's controller: the night's plan, which the first worker to collect saved before it said
    so (``plan.announce``), shown once, before any worker is given a test."""
    fabric = node.config.stash.get(SESSION_KEY, None)
    terminal = node.config.pluginmanager.get_plugin("terminalreporter")
    if fabric is None or terminal is None or node.config.stash.get(PLAN_SHOWN_KEY, False):
        return
    plan = night_plan.load_plan(fabric)
    if plan is not None:
        node.config.stash[PLAN_SHOWN_KEY] = True
        for line in plan.lines():
            terminal.write_line(f"fabric: {line}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A test's launches are done: no longer work left for --night-budget (``plan.finished``)."""
    fabric = item.config.stash.get(SESSION_KEY, None)
    if fabric is not None:
        night_plan.finished(fabric, item.nodeid)


# -- parametrization -------------------------------------------------------------------------

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fabric_bandwidth_case" in metafunc.fixturenames:
        # Collective bandwidth needs two nodes at least: one node never touches the fabric.
        session = metafunc.config.stash[SESSION_KEY]
        marker = metafunc.definition.get_closest_marker("fabric_matrix")
        excluded = marker.kwargs.get("exclude_fabrics", ()) if marker else ()  # e.g. the reference itself
        fabrics = [f for f in session.options.fabrics if f not in excluded]
        links = expand([BANDWIDTH], session.nodes, fabrics, min_nodes=2)
        metafunc.parametrize("fabric_bandwidth_case", links, ids=[c.id for c in links])
    for name, params in (("fabric_link_node", link_nodes), ("fabric_links_case", link_cases)):
        if name in metafunc.fixturenames:  # the link test: every node of the session, per fabric
            marker = metafunc.definition.get_closest_marker("fabric_matrix")
            excluded = marker.kwargs.get("exclude_fabrics", ()) if marker else ()
            chosen = params(metafunc.config.stash[SESSION_KEY], excluded)
            metafunc.parametrize(name, chosen, ids=[c.id for c in chosen])
    if "fabric_case" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[SESSION_KEY]
    o = session.options
    marker = metafunc.definition.get_closest_marker("fabric_matrix")
    kw = dict(marker.kwargs) if marker else {}
    unknown = set(kw) - {"models", "nodes", "fabrics", "exclude_fabrics", "min_nodes", "shardings"}
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: fabric_matrix got unknown argument(s) "
                                f"{', '.join(sorted(unknown))}; allowed: models, nodes, fabrics, exclude_fabrics, "
                                f"min_nodes, shardings")
    # The session selects (--models/--fabrics); a marker only restricts: a suite lists which models
    # form its class (compute-bound, communication-bound) and runs those the session selected.
    models = [m for m in (kw.get("models") or o.models) if m in o.models]
    excluded = kw.get("exclude_fabrics", ())
    fabrics = [f for f in (kw.get("fabrics") or o.fabrics) if f in o.fabrics and f not in excluded]
    shardings = [s for s in (kw.get("shardings") or o.shardings) if s in o.shardings]
    cases = expand(models, session.nodes, fabrics, nodes=kw.get("nodes"), min_nodes=kw.get("min_nodes", 1),
                   shardings=shardings)
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


@pytest.fixture(scope="session")
def fabric_link_rate(fabric_session: FabricSession) -> Callable[[str], LinkRate]:
    """``fabric_link_rate(name)``: fabric ``name``'s per-node link rate and its source, for a gate that
    holds a measurement to it; skips the test where none is known (``fixtures.link_rate_or_skip``)."""
    return functools.partial(link_rate_or_skip, fabric_session)


@pytest.fixture
def fabric_compare(fabric_measure: MeasureFixture, fabric_session: FabricSession,
                   request: pytest.FixtureRequest) -> CompareFixture:
    return CompareFixture(fabric_measure, fabric_session, request.node)


@pytest.fixture
def fabric_measure(fabric_session: FabricSession, request: pytest.FixtureRequest) -> MeasureFixture:
    return MeasureFixture(fabric_session, request.node)


@pytest.fixture
def fabric_bandwidth_case(request: pytest.FixtureRequest) -> Case:
    """One (nodes, fabric) for collective bandwidth; parametrized by ``pytest_generate_tests``."""
    return request.param


@pytest.fixture(scope="session")
def fabric_link_pairs(fabric_session: FabricSession) -> LinkPairs:
    """The session's link tests: one launch per fabric, every pair of nodes measured alone."""
    return LinkPairs(fabric_session)


@pytest.fixture
def fabric_links(fabric_link_pairs: LinkPairs, fabric_session: FabricSession,
                 request: pytest.FixtureRequest) -> LinksFixture:
    """``fabric_links(case)`` -> the pairs of ``case``'s fabric judged (``deciding.slow_links.LinkVerdict``)."""
    return LinksFixture(fabric_link_pairs, fabric_session, request.node)


@pytest.fixture
def fabric_link_node(request: pytest.FixtureRequest) -> LinkNode:
    """One node x fabric of the link test (``.case``, ``.node``); parametrized by ``pytest_generate_tests``."""
    return request.param


@pytest.fixture
def fabric_links_case(request: pytest.FixtureRequest) -> Case:
    """The link test's case of one fabric (all the session's nodes); parametrized by ``pytest_generate_tests``."""
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
    if CONTRADICTION_KEY in item.stash:
        item.stash.setdefault(NOTES_KEY, []).append(f"predicted to fail before the night: {item.stash[CONTRADICTION_KEY]}")
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
    if call.when == "call" and (measured or item.stash.get(NOTES_KEY, [])):
        report.sections.append((SECTION, testcase_text(measured, item.stash.get(NOTES_KEY, []), gates)))
    # Plain attributes: they travel with the report from an xdist worker to the controller.
    report.fabric_outcome = outcome_of(report, gates, item.stash.get(ERRORED_KEY, False))
    report.fabric_gate = bool(gates)
    report.fabric_headline = headline(gates)
    report.fabric_gates = [g.record() for g in gates]
    report.fabric_no_fabrics = item.stash.get(NO_FABRICS_KEY, False)
    report.fabric_contradiction = item.stash.get(CONTRADICTION_KEY, None)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """An inconclusive gate is its own outcome on the terminal (not an xfail, not a pass); under
    --inconclusive fail it stays a failure there, so that it is listed with the failures."""
    if report.when == "call" and not report.failed and getattr(report, "fabric_outcome", None) == INCONCLUSIVE:
        return INCONCLUSIVE, "I", "INCONCLUSIVE"
    return None
