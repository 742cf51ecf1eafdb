"""The controller's reporting: each test's text into JUnit, the night saved, dashboards written,
the tables printed.

Registered per config by the plugin (``REPORTER_NAME``): its hooks receive only reports, and need
the session's state. Under xdist the controller's instance sees every worker's reports.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ..core.version import VERSION as __version__
from ..history.junit import SECTION, add_to_junit, suite_properties
from ..core.redact import redact_file
from .tables import straggler_report
from .terminal import bandwidth_table, cost_lines, summary_tables
from ..history.nights import SessionNight, launch_records, save_results, session_night
from ..history.launch_time import NightLaunchTime, night_launch_time
from ..measuring.pair_measure import STORE_DIR as LINKS_STORE_DIR
from ..measuring.store import ResultStore
from ..running import plan as night_plan
from ..workload.marks import process_start_unix
from ..running.session import FabricSession
from ..core.storage import is_storage_error, storage_problem
from ..deciding.verdicts import INCONCLUSIVE, counts, undecided_night
from ..deciding.contrasts import MIN_ROUNDS, QUICK_LOOK_ROUND_SD

REPORTER_NAME = "fabric-reporter"


def family_line(rule: str, family: int) -> str:
    """How the night's gates shared the allowance for false failures, in words (terminal, summary)."""
    if rule == "bonferroni" and family > 1:
        return (f"fabric: failures judged over {family} gates (--family-wise bonferroni: a failure must hold at "
                f"the error allowance over {family})")
    return f"fabric: each gate judged alone (--family-wise {rule})"


class FabricReporter:
    """Controller-side reporting, registered per config (it needs the session's state in hooks that
    receive only a report): collects each test's text, edits the JUnit file, prints the tables."""

    def __init__(self, fabric: FabricSession) -> None:
        self.fabric = fabric
        self.verdicts: list[dict[str, str]] = []
        # nodeid -> (outcome word, one-line message, whether the test decided gates), every test.
        self.outcomes: dict[str, tuple[str, str, bool]] = {}
        self.undecided_text: dict[str, str] = {}  # nodeid -> an inconclusive gate's verdict text
        self.gates: dict[str, list[dict[str, Any]]] = {}  # nodeid -> its gates' fields (GateOutcome.record)
        self.no_fabrics = 0  # comparisons skipped because `auto` fell back to local processes
        self.undecided: str | None = None  # why the night decided nothing (--undecided-night)
        self.storage_problems: list[str] = []  # files a full or read-only disk refused (storage.py)
        self.saved = True  # False once the disk refused --fabric-save
        # nodeid -> the model's prediction against the test's expectation (session.check_expectations)
        self.contradictions: dict[str, str] = {}

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
        if getattr(report, "fabric_contradiction", None):
            self.contradictions[report.nodeid] = report.fabric_contradiction
        if word == INCONCLUSIVE:
            self.undecided_text[report.nodeid] = str(getattr(report, "wasxfail", "") or message)
        if report.when != "call":
            return
        text = next((t for name, t in report.sections if name == SECTION), None)
        if text is None:
            return
        self.fabric.outputs[report.nodeid] = text
        self.verdicts.append({"test": report.nodeid, "outcome": word, "message": message,
                              "gates": list(getattr(report, "fabric_gates", []))})

    # The innermost wrapper: after junitxml has written its file, and before the terminal's summary,
    # which then shows the tables and any file the disk refused (``storage_problems``).
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        try:
            yield
        except OSError as exc:  # pytest's own junitxml on a full or read-only disk
            if not is_storage_error(exc):
                raise
            self._refused(session, exc, "the JUnit XML", getattr(session.config.option, "xmlpath", None))
        if hasattr(session.config, "workerinput"):
            return None
        # --undecided-night fail: a night that decided no gate exits 1 (the summary says why).
        gates = [word for word, _, gate in self.outcomes.values() if gate]
        self.undecided = undecided_night(gates, self.no_fabrics, self.fabric.note,
                                         one_launch=self.fabric.options.max_repeats < MIN_ROUNDS)
        if self.undecided and self.fabric.options.undecided_night == "fail" and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        # Each file on its own: a disk that refuses one still gets the others.
        o = self.fabric.options
        for what, where, write in (
                ("the saved night (--fabric-save)", o.save, self._save),
                ("a dashboard file", o.metrics or o.benchmark_json, self._dashboards),
                ("the JUnit XML", getattr(session.config.option, "xmlpath", None),
                 lambda: self._complete_junit(session.config))):
            try:
                write()
            except OSError as exc:
                if not is_storage_error(exc):
                    raise
                self._refused(session, exc, what, where)
        return None

    def _refused(self, session: pytest.Session, exc: OSError, what: str, where: Any = None) -> None:
        """A file the disk would not take: one line in the summary (no traceback), and the run fails."""
        self.storage_problems.append(storage_problem(exc, what, where))
        if what.startswith("the saved night"):
            self.saved = False
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _complete_junit(self, config: pytest.Config) -> None:
        """Each test's measurement text and the run's properties into pytest's JUnit file."""
        xmlpath = getattr(config.option, "xmlpath", None)
        if not xmlpath or not Path(xmlpath).exists():
            return
        path = Path(xmlpath)
        if (self.fabric.outputs or self.no_fabrics or self.contradictions
                or any(gate for _, _, gate in self.outcomes.values())):
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

    @functools.cached_property
    def night(self) -> SessionNight:
        """The session's store read once, at the end (the controller's), and the one ``SavedRun``
        the dashboards, the cost lines and --fabric-save take; the terminal's tables and the suite
        properties take its measurements."""
        store = self.fabric.store
        night = session_night(store.all() if store.holds_records() else {}, self.fabric.options.fabrics)
        night.run.verdicts = self._night_verdicts()
        return night

    @functools.cached_property
    def link_records(self) -> dict[str, Any]:
        """The link test's launches (a store of their own, measuring/pair_measure.py)."""
        links = ResultStore(self.fabric.directory / LINKS_STORE_DIR)
        return links.all() if links.holds_records() else {}

    @functools.cached_property
    def launch_time(self) -> NightLaunchTime | None:
        """Where the night's launch time went (history/launch_time.py): every launch of the session's
        store and of the link test's, and the session's wall from this pytest process's start to now."""
        launches = [*self.night.launches.values(), *launch_records(self.link_records, "link store").values()]
        started = process_start_unix()
        return night_launch_time(launches, None if started is None else time.time() - started)

    def _dashboards(self) -> None:
        """--fabric-metrics, --fabric-benchmark-json and, under GitHub Actions, the job summary."""
        o = self.fabric.options
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if not (o.metrics or o.benchmark_json or (step_summary and self.outcomes)):
            return
        from .dashboards import build_tables, write_outputs

        tables = build_tables(self.night.run, self.night.records)
        if self.undecided:
            tables.notes.append(f"no verdict tonight: {self.undecided}")
        write_outputs(tables, o.metrics, o.benchmark_json, step_summary if self.outcomes else None)

    def _save(self) -> None:
        """--fabric-save: everything measured, also when tests failed or the run was interrupted."""
        fabric = self.fabric
        if (fabric.options.save is None or hasattr(fabric.config, "workerinput")
                or not fabric.store.holds_records()):
            return
        identity = {"cluster": fabric.cluster.describe(), "cluster_kind": fabric.cluster.name,
                    "nodes": fabric.nodes, "gpus_per_node": fabric.options.settings.gpus_per_node,
                    "fabrics": list(fabric.options.fabrics), "nodes_left_out": fabric.nodes_left_out(),
                    "plan": night_plan.record(fabric)}
        night = self.night
        spent = self.launch_time
        save_results(fabric.options.save, night.records, identity, night.run.verdicts, fabric.options.prices, night.run,
                     extra={**({"launch_time": spent.to_dict()} if spent else {}),
                            **({"link_records": self.link_records} if self.link_records else {})})

    def _suite_properties(self) -> dict[str, str]:
        fabric, o = self.fabric, self.fabric.options
        # The session's prior; a gate whose configurations the baseline learned uses theirs (its fields say).
        noise = fabric.noise()
        facts = {"fabric.cluster": fabric.cluster.describe(), "fabric.cluster_kind": fabric.cluster.name,
                 "fabric.fabrics": ",".join(o.fabrics), "fabric.nodes": str(fabric.nodes),
                 "fabric.gpus_per_node": str(o.settings.gpus_per_node),
                 "fabric.repeats": f"{o.repeats} to {o.max_repeats} launches per side",
                 "fabric.inconclusive": o.inconclusive,
                 "fabric.launch_noise": f"{noise.sigma:.6g}" if noise else "none learned",
                 "fabric.launch_noise_source": noise.source if noise else (
                     f"tonight's rounds (from {MIN_ROUNDS}); fewer: the noise bound, {QUICK_LOOK_ROUND_SD:.0%} per round"),
                 "fabric.project_version": __version__}
        facts.update({f"fabric.outcome.{word}": str(n)
                      for word, n in counts(word for word, _, _ in self.outcomes.values()).items()})
        if self.undecided:
            facts["fabric.undecided"] = self.undecided
        if (plan := night_plan.load_plan(fabric)) is not None:
            facts.update(plan.properties())
        if left_out := fabric.nodes_left_out():
            facts["fabric.nodes_left_out"] = "; ".join(f"{node}: {why}" for node, why in left_out.items())
        # Each gate predicted to fail before the night, by its test's name.
        facts.update({f"fabric.predicted_to_fail.{nodeid.rpartition('::')[2]}": message
                      for nodeid, message in sorted(self.contradictions.items())})
        if self.launch_time is not None:
            facts.update(self.launch_time.properties())
        return suite_properties([*self.night.measured, *self.night.bandwidth], facts)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        fabric = self.fabric
        if self.undecided and not hasattr(fabric.config, "workerinput"):
            exit_note = "exit 1" if fabric.options.undecided_night == "fail" else "--undecided-night pass"
            terminalreporter.write_line(f"fabric: no verdict tonight ({exit_note}): {self.undecided}", yellow=True)
        if hasattr(fabric.config, "workerinput"):
            return
        for problem in [*self.storage_problems, *([fabric.store.problem] if fabric.store.problem else [])]:
            terminalreporter.write_line(f"fabric: ERROR {problem}", red=True, bold=True)
        for node, why in fabric.nodes_left_out().items():
            terminalreporter.write_line(f"fabric: node {node} left out: {why}", yellow=True)
        if not fabric.store.holds_records():
            return
        night = self.night
        measured, errors, bandwidth = night.measured, night.errors, night.bandwidth
        if not measured and not errors and not bandwidth:
            return
        terminalreporter.write_sep("=", "fabric throughput (tokens/s)")
        for line in summary_tables(measured, fabric.options.fabrics):
            terminalreporter.write_line(line)
        for line in bandwidth_table(bandwidth):
            terminalreporter.write_line(line)
        found, judged = straggler_report(night.run)
        if judged:
            terminalreporter.write_line(judged)
        for line in found:
            terminalreporter.write_line(f"fabric: {line}", yellow=True)
        if fabric.options.prices:
            for line in cost_lines(night.run, fabric.options.prices):
                terminalreporter.write_line(line)
        for line in errors:
            terminalreporter.write_line(f"failed launch: {line}")
        if self.launch_time is not None:
            terminalreporter.write_line(f"fabric: {self.launch_time.line()}")
        if fabric.gates:
            terminalreporter.write_line(family_line(fabric.options.family_wise, fabric.family()))
        terminalreporter.write_line(f"launch logs and results: {fabric.directory}")
        if fabric.options.save and self.saved:
            terminalreporter.write_line(f"results saved to {fabric.options.save}")
