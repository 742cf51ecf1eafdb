"""One outcome word per gate (pass / fail / inconclusive / error), the same on the terminal, in JUnit
and in the saved night; a night that decides nothing exits non-zero; regression gates are collected
only with a baseline.

The plugin runs in-process through ``pytester`` with gates decided by ``gates.apply_verdict`` on a
``GateOutcome`` stashed as ``CompareFixture`` stashes it: every hook between the gate and the file
is the real one, only the launches are left out (tests of those live in test_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_valid_junit, outcome, run_gates
from lxml import etree

from pytest_fabric.deciding.contrasts import Verdict
from pytest_fabric.deciding.verdicts import (ERROR, FAIL, INCONCLUSIVE, PASS, SKIPPED, counts,
                                             outcome_of, undecided_night)


def cases(xml):
    return {c.get("name"): c for c in etree.parse(str(xml)).iter("testcase")}


def suite_properties(xml):
    return {p.get("name"): p.get("value") for p in etree.parse(str(xml)).iter("property")}


def test_an_inconclusive_gate_is_a_skip_with_its_message_and_text_never_a_pass(pytester, junit_schema):
    result, xml = run_gates(pytester, ["pass", "inconclusive", "fail"])
    assert_valid_junit(junit_schema, xml)
    found = cases(xml)
    (skipped,) = found["test_gate[inconclusive]"].findall("skipped")
    assert skipped.get("message").startswith("INCONCLUSIVE: eth/ib = 0.981 [0.962, 1.001] vs threshold 0.950")
    assert skipped.get("type") == "fabric.inconclusive"
    assert "inconclusive after the launch budget" in skipped.text  # a body: the parsers show it
    assert found["test_gate[fail]"].find("failure") is not None
    assert list(found["test_gate[pass]"]) == []  # a plain pass
    props = suite_properties(xml)
    assert {k: props[f"fabric.outcome.{k}"] for k in ("pass", "fail", "inconclusive", "error", "skipped")} == {
        "pass": "1", "fail": "1", "inconclusive": "1", "error": "1", "skipped": "0"}
    suite = next(etree.parse(str(xml)).iter("testsuite"))
    assert suite.get("skipped") == "1"
    # The terminal says the same word, and the read-back night too.
    assert "test_gate[inconclusive] INCONCLUSIVE" in result.stdout.str()
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*1 inconclusive*"])


def test_under_xdist_the_controller_writes_the_same_words(pytester):
    """The words and gate fields travel with the reports from the workers to the controller."""
    # The workers import the suite's helper (test_junit) from this directory, as the controller does.
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n")
    metrics = pytester.path / "metrics.txt"
    result, xml = run_gates(pytester, ["pass", "inconclusive", "fail"], "-n", "2", "-k", "not broken",
                            f"--fabric-metrics={metrics}")
    result.stdout.fnmatch_lines(["*1 failed, 1 passed, 1 inconclusive*"])
    props = suite_properties(xml)
    assert [props[f"fabric.outcome.{w}"] for w in ("pass", "fail", "inconclusive")] == ["1", "1", "1"]
    (skipped,) = cases(xml)["test_gate[inconclusive]"].findall("skipped")
    assert skipped.get("message").startswith("INCONCLUSIVE: eth/ib = 0.981")
    assert metrics.read_text().count("fabric_gate_ratio{") == 3


def test_a_warned_inconclusive_gate_is_still_a_skip_in_junit(pytester, junit_schema):
    _, xml = run_gates(pytester, ["inconclusive"], "--inconclusive", "warn", "--undecided-night", "pass")
    (skipped,) = cases(xml)["test_gate[inconclusive]"].findall("skipped")
    assert skipped.get("message").startswith("INCONCLUSIVE:")
    assert next(etree.parse(str(xml)).iter("testsuite")).get("skipped") == "1"
    assert_valid_junit(junit_schema, xml)


def test_a_night_of_only_inconclusive_gates_exits_1_and_says_why(pytester):
    result, xml = run_gates(pytester, ["inconclusive", "inconclusive"], "-k", "not broken")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["fabric: no verdict tonight (exit 1): all 2 gate(s) inconclusive*"])
    assert suite_properties(xml)["fabric.undecided"].startswith("all 2 gate(s) inconclusive")


def test_undecided_night_pass_keeps_exit_0(pytester):
    result, _ = run_gates(pytester, ["inconclusive"], "-k", "not broken", "--undecided-night", "pass")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["fabric: no verdict tonight (--undecided-night pass): *"])


def test_one_decided_gate_makes_a_night_decided(pytester):
    result, _ = run_gates(pytester, ["inconclusive", "pass"], "-k", "not broken")
    assert result.ret == 0
    assert "no verdict tonight" not in result.stdout.str()


def test_with_inconclusive_fail_the_gate_is_listed_among_the_failures(pytester):
    result, xml = run_gates(pytester, ["inconclusive"], "-k", "not broken", "--inconclusive", "fail")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAILED test_night_gates.py::test_gate?inconclusive? - Failed: inconclusive*"])
    assert suite_properties(xml)["fabric.outcome.inconclusive"] == "1"


def test_comparisons_skipped_for_lack_of_root_make_the_night_exit_1(pytester, monkeypatch):
    """`auto` falls back to local processes when no namespace can be made (here: as without root)."""
    from pytest_fabric.cluster import ClusterUnavailable
    from pytest_fabric.cluster.emulated import EmulatedCluster

    def no_root(self):
        raise ClusterUnavailable("cannot create a network namespace: mount --make-shared /run/netns failed: "
                                 "Operation not permitted")

    monkeypatch.setattr(EmulatedCluster, "prepare", no_root)
    pytester.makepyfile(test_cmp="""
        import pytest

        @pytest.mark.fabric_comparison
        @pytest.mark.parametrize("fabric", ["eth", "roce"])
        def test_cmp(fabric):
            pass
    """)
    xml = pytester.path / "night.xml"
    result = pytester.runpytest("test_cmp.py", f"--junitxml={xml}")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["fabric: no verdict tonight (exit 1): 2 fabric comparison(s) skipped: emulated "
                                 "cluster unavailable (cannot create a network namespace*); using local processes*; run as root*"])
    assert suite_properties(xml)["fabric.outcome.skipped"] == "2"
    assert pytester.runpytest("test_cmp.py", "--undecided-night", "pass").ret == 0


def test_regression_gates_are_not_collected_without_a_baseline(pytester):
    result, xml = run_gates(pytester, ["pass"])
    assert "test_regression" not in cases(xml)
    result.stdout.fnmatch_lines(["fabric: regression gates off (no --fabric-baseline given)"])
    assert "1 deselected" in result.stdout.str()


def test_a_link_test_can_leave_out_the_reference_instead_of_skipping_it(pytester):
    pytester.makepyfile(test_links="""
        import pytest

        @pytest.mark.fabric_matrix(exclude_fabrics=["ib"])
        def test_link(fabric_bandwidth_case):
            pass
    """)
    ids = [line for line in pytester.runpytest("--collect-only", "-q", "--fabrics", "ib,eth,roce").outlines
           if "::" in line]
    assert ids == ["test_links.py::test_link[collectives-n2-eth]", "test_links.py::test_link[collectives-n2-roce]"]


def test_bad_undecided_night_value_is_a_usage_error(pytester):
    result = pytester.runpytest("--undecided-night", "maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*undecided-night*fail*pass*"])


# -- the word from a report ----------------------------------------------------------------------


class Report:
    def __init__(self, when, outcome, xfail=False):
        self.when, self.outcome = when, outcome
        self.failed, self.skipped, self.passed = outcome == "failed", outcome == "skipped", outcome == "passed"
        if xfail:
            self.wasxfail = "reason"


@pytest.mark.parametrize(("report", "gates", "errored", "word"), [
    (Report("call", "passed"), [Verdict.PASS], False, PASS),
    (Report("call", "failed"), [Verdict.FAIL], False, FAIL),
    (Report("call", "failed"), [Verdict.PASS, Verdict.FAIL], False, FAIL),
    (Report("call", "skipped", xfail=True), [Verdict.INCONCLUSIVE], False, INCONCLUSIVE),
    (Report("call", "passed"), [Verdict.INCONCLUSIVE], False, INCONCLUSIVE),  # --inconclusive warn
    (Report("call", "failed"), [Verdict.INCONCLUSIVE], False, INCONCLUSIVE),  # --inconclusive fail
    (Report("call", "failed"), [], True, ERROR),  # a launch failed
    (Report("call", "failed"), [], False, FAIL),  # a plain assertion (throughput expectations)
    (Report("setup", "failed"), [], False, ERROR),
    (Report("teardown", "failed"), [Verdict.PASS], False, ERROR),
    (Report("setup", "skipped"), [], False, SKIPPED),
    (Report("call", "skipped", xfail=True), [], False, SKIPPED),  # an xfail that decided no gate
])
def test_outcome_word(report, gates, errored, word):
    assert outcome_of(report, [outcome(v) for v in gates], errored) == word


def test_counts_name_every_word():
    assert counts(["pass", "pass", "inconclusive"]) == {"pass": 2, "fail": 0, "inconclusive": 1, "error": 0,
                                                       "skipped": 0}


def test_undecided_night_reasons():
    assert undecided_night(["inconclusive", "pass"], 0, None) is None
    assert undecided_night([], 0, None) is None
    assert undecided_night(["inconclusive"], 0, None).startswith("all 1 gate(s) inconclusive")
    # Fewer than 3 rounds: the night says what would decide, not "lower the noise".
    one = undecided_night(["inconclusive", "inconclusive"], 0, None, one_launch=True)
    assert one.startswith("all 2 gate(s) inconclusive: fewer than 3 rounds") and "--fabric-baseline" in one
    assert "noise bound (15% per round)" in one
    why = undecided_night(["pass"], 3, "emulated cluster unavailable (needs root)")
    assert why.startswith("3 fabric comparison(s) skipped: emulated cluster unavailable (needs root)")


def test_the_family_wise_rule_is_said_in_words():
    from pytest_fabric.reporting.reporter import family_line

    assert "failures judged over 5 gates" in family_line("bonferroni", 5)
    assert "each gate judged alone (--family-wise none)" in family_line("none", 1)
    assert "each gate judged alone" in family_line("bonferroni", 1)
