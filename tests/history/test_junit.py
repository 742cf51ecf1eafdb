"""The JUnit format (pytest_fabric/history/junit.py): what a measured testcase writes, and how the file pytest
wrote is completed without breaking it.

The measurements here are real ``Measurement`` objects made from the rank program's typed result
(``TrainResult``) as the store records it, so every figure goes through ``steps.launch_estimate``.
They are built in ``helpers.py`` (``train_record``, ``train_measurement``), which every test module shares.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from helpers import assert_valid_junit, bandwidth_measurement, geomean, outcome, train_measurement
from lxml import etree

from pytest_fabric.deciding.gates import GateOutcome
from pytest_fabric.history.junit import add_to_junit, gate_lines, junit_names, measurement_lines, suite_properties
from pytest_fabric.history.junit_read import load_junit
from pytest_fabric.history.junit import testcase_text as text_of  # not collected as a test
from pytest_fabric.measuring.measurement import configuration_tokens_per_s
from pytest_fabric.deciding.contrasts import Verdict


# -- machine lines of one configuration ---------------------------------------------------------------


def test_one_launch_gives_its_own_figures():
    m = train_measurement("m", 2, "eth", 800.0, tokens_per_step=200)
    lines = measurement_lines([m])
    p = "fabric.m-n2-eth"
    assert lines[f"{p}.tokens_per_s"] == "800.000"
    assert lines[f"{p}.tokens_per_s_per_gpu"] == "400.000"
    assert lines[f"{p}.step_s"] == "0.250000"
    assert lines[f"{p}.launches"] == "1" and lines[f"{p}.launches_disturbed"] == "0"
    assert lines[f"{p}.launch_tokens_per_s"] == "800.000"
    assert lines[f"{p}.launch_counted"] == "1"
    assert lines[f"{p}.steps"] == "4"
    assert lines[f"{p}.gpus"] == "2"
    assert lines[f"{p}.cluster"] == "emulated"
    assert lines[f"{p}.hosts"] == "node0,node1"
    assert lines[f"{p}.attention"] == "sdpa"
    assert lines[f"{p}.device"] == "cpu/float32"
    assert lines[f"{p}.versions"] == "torch 2.13.0, python 3.11.7"  # unknown versions are left out
    assert '"emulated_mbit": 2000' in lines[f"{p}.fabric_settings"]
    # Flat strings, every name under the case's id: what a script greps for.
    assert all(isinstance(v, str) and "\n" not in v for v in lines.values())
    assert all(k.startswith(p + ".") for k in lines)


def test_the_configuration_figure_is_the_geometric_mean_of_its_launches():
    values = [1000.0, 1100.0, 900.0]
    ms = [train_measurement("m", 2, "ib", v, launch=i, steps=4 + i) for i, v in enumerate(values)]
    lines = measurement_lines(ms)
    p = "fabric.m-n2-ib"
    value = geomean(values)
    assert value != pytest.approx(sum(values) / len(values), rel=1e-4)  # not the arithmetic mean
    assert float(lines[f"{p}.tokens_per_s"]) == pytest.approx(value, abs=1e-3)
    assert float(lines[f"{p}.tokens_per_s_per_gpu"]) == pytest.approx(value / 2, abs=1e-3)
    assert float(lines[f"{p}.step_s"]) == pytest.approx(128 / value, abs=1e-6)
    assert lines[f"{p}.launch_tokens_per_s"] == "1000.000,1100.000,900.000"
    assert lines[f"{p}.launch_counted"] == "1,1,1"
    assert lines[f"{p}.launches"] == "3" and lines[f"{p}.launches_disturbed"] == "0"
    assert lines[f"{p}.steps"] == "4,5,6"


def test_disturbed_launches_are_listed_and_left_out_of_the_figure():
    ms = [train_measurement("m", 2, "ib", 1000.0, launch=0),
          train_measurement("m", 2, "ib", 500.0, launch=1, disturbed=3),  # 3 of 4 steps: disturbed as a whole
          train_measurement("m", 2, "ib", 1210.0, launch=2, disturbed=1)]  # 1 of 4: counts
    assert [m.counted for m in ms] == [True, False, True]
    lines = measurement_lines(ms)
    p = "fabric.m-n2-ib"
    assert lines[f"{p}.launches_disturbed"] == "1"
    assert lines[f"{p}.launches"] == "3"
    assert lines[f"{p}.launch_tokens_per_s"] == "1000.000,500.000,1210.000"  # every launch
    assert lines[f"{p}.launch_counted"] == "1,0,1"  # ...and which one does not count
    assert float(lines[f"{p}.tokens_per_s"]) == pytest.approx(geomean([1000.0, 1210.0]), abs=1e-3)


def test_when_every_launch_is_disturbed_the_figure_is_their_mean():
    ms = [train_measurement("m", 2, "ib", v, launch=i, disturbed=4) for i, v in enumerate([400.0, 900.0])]
    lines = measurement_lines(ms)
    assert lines["fabric.m-n2-ib.launches_disturbed"] == "2"
    assert float(lines["fabric.m-n2-ib.tokens_per_s"]) == pytest.approx(600.0, abs=1e-3)


def test_bandwidth_lines_per_collective_and_payload():
    lines = measurement_lines([bandwidth_measurement(2, "eth", 0.4)])
    p = "fabric.collectives-n2-eth"
    assert lines[f"{p}.all_reduce.16777216.busbw_gbit"] == "0.4000"
    assert lines[f"{p}.all_gather.1048576.busbw_gbit"] == "0.2000"
    assert f"{p}.tokens_per_s" not in lines
    assert lines[f"{p}.versions"] == "torch 2.13.0, python 3.11.7"
    assert '"emulated_mbit": 400.0' in lines[f"{p}.fabric_settings"]


# -- machine lines of one gate ------------------------------------------------------------------------


def test_gate_lines_name_the_comparison_and_carry_every_field():
    lines = gate_lines(outcome(Verdict.INCONCLUSIVE, reruns=("re-run: m-n2-eth launch 2: 3 of 4 steps disturbed",)))
    p = "fabric.gate.eth_vs_ib"
    assert lines == {
        f"{p}.verdict": "inconclusive",
        f"{p}.ratio": "0.981",
        f"{p}.ci_low": "0.962",
        f"{p}.ci_high": "1.0013",
        f"{p}.confidence": "0.9875",
        f"{p}.threshold": "0.95",
        f"{p}.launches": "3+4",
        f"{p}.reruns": "1",
        f"{p}.launch_noise": "0.0158",
        f"{p}.noise_df": "8",
        f"{p}.noise_source": "learned from 3 nights",
        f"{p}.family": "1",
    }


@pytest.mark.parametrize("verdict", list(Verdict))
def test_gate_verdict_is_the_plain_word(verdict):
    assert gate_lines(outcome(verdict))["fabric.gate.eth_vs_ib.verdict"] == verdict.value


# -- the testcase text ---------------------------------------------------------------------------------

MACHINE_LINE = re.compile(r"^fabric\.[^=\s]+=")


def split_text(text: str) -> tuple[list[str], list[str]]:
    """(human lines, machine lines) around the one blank line."""
    human, blank, machine = text.partition("\n\n")
    assert blank, f"no blank line between the human and the machine lines:\n{text}"
    return human.splitlines(), machine.splitlines()


def test_a_gate_shows_its_verdict_lines_then_figures_and_gate_fields_after_a_blank_line():
    ms = [train_measurement("m", 2, "ib", 1000.0, tokens_per_step=250),
          train_measurement("m", 2, "eth", 800.0, tokens_per_step=250)]
    predicted = "predicted: eth < 20% & more slower than ib"  # characters XML must escape
    text = text_of(ms, [predicted], [outcome()])
    human, machine = split_text(text)
    # The verdict line carries both fabrics' numbers: no per-configuration sentence repeats them.
    assert human == ["pass: eth/ib = 0.981, 98.75% CI [0.962, 1.001] over 3+4 launches; required >= 0.950 (eth at "
                     "most 5% slower); eth 981.0 vs ib 1000.0 tokens/s [m, 2 node(s)]; noise 1.6% on 8 df "
                     "(learned from 3 nights)", predicted]
    assert machine and all(MACHINE_LINE.match(line) for line in machine), machine
    assert machine[:2] == ["fabric.m-n2-ib.tokens_per_s=1000.000", "fabric.m-n2-eth.tokens_per_s=800.000"]
    gate = {line.partition("=")[0].rpartition(".")[2] for line in machine[2:]}
    assert gate == {"verdict", "ratio", "ci_low", "ci_high", "confidence", "threshold", "launches", "reruns"}
    # Run-wide facts are suite properties, not repeated per testcase.
    props = suite_properties(ms, {"fabric.nodes": "2"})
    assert props["fabric.m-n2-ib.gpus"] == "2" and props["fabric.version.torch"] == "2.13.0"
    assert props["fabric.attention"] == "sdpa" and props["fabric.nodes"] == "2"
    assert text and "versions" not in text and "fabric_settings" not in text


@pytest.mark.parametrize("verdict", [Verdict.FAIL, Verdict.INCONCLUSIVE])
def test_a_gate_that_did_not_pass_still_shows_its_verdict_line(verdict):
    """The verdict line is rendered from the GateOutcome, whatever apply_verdict() did with it."""
    ms = [train_measurement("m", 2, "ib", 1000.0), train_measurement("m", 2, "eth", 981.0)]
    human, _ = split_text(text_of(ms, ["predicted: eth 2% slower than ib"], [outcome(verdict)]))
    assert human[0].startswith(f"{verdict}: eth/ib = 0.981, 98.75% CI [0.962, 1.001]") and len(human) == 2


def test_a_testcase_output_stays_under_1000_characters_with_six_launches_a_side():
    """Jenkins keeps the first and last 500 characters of a passed test's output: all of it here."""
    ms = [train_measurement("llama-3.1-70b", 64, f, v + i, launch=i) for f, v in (("ib", 12345.678), ("roce.v2", 9876.5))
          for i in range(6)]
    predicted = "predicted: " + "x" * 330  # as long as predict.py's line of the default run
    assert len(text_of(ms, [predicted], [outcome()])) < 1000


def test_repeated_launches_give_one_human_line_with_the_value_and_each_launch():
    ms = [train_measurement("m", 2, "ib", v, launch=i, disturbed=3 if i == 1 else 0)
          for i, v in enumerate([1000.0, 400.0, 1210.0])]
    ms.append(train_measurement("m", 2, "eth", 880.0))
    human, machine = split_text(text_of(ms))
    value = geomean([1000.0, 1210.0])  # the disturbed launch is not counted
    assert human[0] == (f"m-n2-ib: {value:.1f} tokens/s over 3 launches (1000.0, 400.0, 1210.0; 1 disturbed, "
                        "not counted), 2 GPU(s)")
    # The ratio line uses the configuration's value, the one the gates judged.
    assert f"eth/ib tokens/s ratio (m, 2 nodes): {880.0 / value:.3f}" in "\n".join(human)
    assert machine == [f"fabric.m-n2-ib.tokens_per_s={value:.3f}", "fabric.m-n2-eth.tokens_per_s=880.000"]
    props = suite_properties(ms, {})
    assert props["fabric.m-n2-ib.launch_tokens_per_s"] == "1000.000,400.000,1210.000"
    assert props["fabric.m-n2-ib.launches_disturbed"] == "1"


def test_without_the_reference_fabric_there_is_no_ratio():
    text = text_of([train_measurement("m", 2, "eth", 800.0)])
    # Not empty (an empty text would pass the check below): eth's own line and its figure are there.
    assert "fabric.m-n2-eth.tokens_per_s=800.000" in text.splitlines() and text.startswith("m-n2-eth: ")
    assert "ratio" not in text


def test_one_node_shared_launch_says_so():
    text = text_of([train_measurement("m", 1, "eth", 100.0, shared_with="ib")])
    assert "[one node: shared with ib]" in text.splitlines()[0]


def test_bandwidth_and_training_side_by_side():
    human, machine = split_text(text_of([bandwidth_measurement(2, "eth", 0.4),
                                               train_measurement("m", 2, "eth", 800.0)]))
    assert human[0].startswith("collectives-n2-eth: busbw all_gather 0.400 Gbit/s at 16 MiB")
    # busbw at the largest payload in the testcase; every payload in the suite properties.
    assert "fabric.collectives-n2-eth.all_reduce.16777216.busbw_gbit=0.4000" in machine
    assert not any(".1048576." in line for line in machine)
    props = suite_properties([bandwidth_measurement(2, "eth", 0.4)], {})
    assert props["fabric.collectives-n2-eth.all_reduce.1048576.busbw_gbit"] == "0.2000"
    assert "fabric.m-n2-eth.tokens_per_s=800.000" in machine


# -- completing the file pytest wrote -------------------------------------------------------------------

TESTS = {
    "test_top.py": """
        import pytest

        def test_plain():
            print("captured line")

        @pytest.mark.parametrize("x", ["a/b", "c::d", "e f"])
        def test_param(x):
            pass

        @pytest.mark.parametrize("case", ["m-n2-eth"])
        def test_gate(case):
            pytest.xfail("inconclusive after the launch budget: eth/ib = 0.981")
    """,
    "sub/test_nested.py": """
        import pytest

        class TestGroup:
            @pytest.mark.parametrize("n", [1, 2])
            def test_method(self, n):
                pass

            def test_fails(self):
                assert 0, "broken"
    """,
}


def junit_of(pytester, *args):
    for path, source in TESTS.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))
    nodeids = [line for line in pytester.runpytest("--collect-only", "-q").outlines if "::" in line]
    xml = pytester.path / "junit.xml"
    pytester.runpytest(f"--junitxml={xml}", "-o", "junit_logging=system-out", *args)
    return xml, nodeids


@pytest.mark.parametrize("extra", [[], ["-o", "junit_suite_name=fabric", "--junitprefix=nightly"],
                                   ["-o", "junit_family=xunit1"]])
def test_every_testcase_is_found_and_gets_its_text(pytester, junit_schema, extra):
    xml, nodeids = junit_of(pytester, *extra)
    assert len(nodeids) == 8
    outputs = {nodeid: f"measured {nodeid}" for nodeid in nodeids}
    prefix = "nightly" if "--junitprefix=nightly" in extra else None
    updated = add_to_junit(xml, outputs, {"fabric.cluster": "emulated"}, prefix=prefix)
    assert updated == len(nodeids)
    tree = etree.parse(str(xml))
    for case in tree.iter("testcase"):
        out = case.find("system-out")
        assert out is not None and out.text.count("measured ") == 1, etree.tostring(case)
    # Captured output is kept, the measurement text is appended.
    plain = next(c for c in tree.iter("testcase") if c.get("name") == "test_plain")
    assert "captured line" in plain.find("system-out").text
    assert "measured test_top.py::test_plain" in plain.find("system-out").text
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props == {"fabric.cluster": "emulated"}
    if "junit_family=xunit1" not in extra:  # pytest's own xunit1 testcases carry file/line, which junit-10.xsd lacks
        assert_valid_junit(junit_schema, xml)


def test_unknown_nodeids_leave_the_file_valid_and_untouched(pytester, junit_schema):
    xml, _ = junit_of(pytester)
    assert add_to_junit(xml, {"test_other.py::test_x": "nothing"}, {}) == 0
    assert "nothing" not in xml.read_text()
    assert_valid_junit(junit_schema, xml)


def test_a_testcase_text_added_to_junit_stays_valid_and_reads_back(pytester, junit_schema):
    """The full path: testcase_text into a file pytest wrote, validated, then read as a saved night."""
    xml, nodeids = junit_of(pytester)
    (gate,) = [n for n in nodeids if "test_gate" in n]
    ib = [train_measurement("m", 2, "ib", v, launch=i, disturbed=3 if i == 2 else 0)
          for i, v in enumerate([1000.0, 1020.0, 300.0])]
    eth = [train_measurement("m", 2, "eth", v, launch=i) for i, v in enumerate([981.0, 979.5, 990.25])]
    text = text_of([*ib, *eth], ["predicted: eth/ib = 0.981 < 1 & <more>"],
                         [outcome(Verdict.INCONCLUSIVE, ("m-n2-ib launch 3: 3 of 4 steps disturbed",))])
    props = suite_properties([*ib, *eth], {"fabric.cluster": "emulated (network namespaces on this machine)",
                                           "fabric.fabrics": "ib,eth"})
    assert add_to_junit(xml, {gate: text}, props) == 1
    assert_valid_junit(junit_schema, xml)
    case = next(c for c in etree.parse(str(xml)).iter("testcase") if c.get("name") == "test_gate[m-n2-eth]")
    assert case.find("system-out").text.endswith(text)  # escaped on the way in, whole on the way out

    night = load_junit(xml)
    # Every launch, with whether it counts: the disturbed one is kept, not counted (launch_counted).
    assert night.cases["m-n2-ib"].tokens_per_s == [1000.0, 1020.0, 300.0]
    assert night.cases["m-n2-ib"].counted == [True, True, False]
    assert night.cases["m-n2-ib"].mean == pytest.approx(configuration_tokens_per_s(ib), rel=1e-4)
    assert night.cases["m-n2-eth"].tokens_per_s == [981.0, 979.5, 990.25]
    assert night.cases["m-n2-eth"].gpus == 2
    assert night.identity["hosts"] == ["node0", "node1"]
    assert night.identity["versions"] == {"torch": "2.13.0", "python": "3.11.7"}
    (verdict,) = night.verdicts
    assert verdict["outcome"] == "inconclusive" and verdict["fabric"] == "eth"


@pytest.mark.parametrize(("nodeid", "prefix", "expected"), [
    ("test_top.py::test_plain", None, ("test_top", "test_plain")),
    ("sub/test_nested.py::TestGroup::test_method[1]", None, ("sub.test_nested.TestGroup", "test_method[1]")),
    ("test_top.py::test_param[c::d]", None, ("test_top", "test_param[c::d]")),
    ("test_top.py::test_param[a/b]", "nightly", ("nightly.test_top", "test_param[a/b]")),
])
def test_junit_names_as_pytest_derives_them(nodeid, prefix, expected):
    assert junit_names(nodeid, prefix) == expected


def tiny_junit(path, text: str, props: dict | None = None) -> None:
    """A one-testcase JUnit file as pytest writes it (xunit2), carrying ``text`` in its system-out
    and ``props`` as the suite's properties."""
    from xml.sax.saxutils import escape, quoteattr

    properties = "".join(f"<property name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in (props or {}).items())
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
                    'failures="0" skipped="0" tests="1" time="1.0">'
                    + (f"<properties>{properties}</properties>" if properties else "")
                    + '<testcase classname="suites.test_throughput" '
                    f'name="test_gate[m-n2-eth]" time="1.0"><system-out>{escape(text)}</system-out></testcase>'
                    '</testsuite></testsuites>')


def test_when_every_launch_was_disturbed_a_reader_keeps_them_all(tmp_path, junit_schema):
    ms = [train_measurement("m", 2, "eth", v, launch=i, disturbed=4) for i, v in enumerate([400.0, 900.0])]
    tiny_junit(tmp_path / "j.xml", text_of(ms, ["pass: eth"]), suite_properties(ms, {}))
    assert_valid_junit(junit_schema, tmp_path / "j.xml")
    night = load_junit(tmp_path / "j.xml")
    assert night.cases["m-n2-eth"].tokens_per_s == [400.0, 900.0]
    assert night.cases["m-n2-eth"].mean == pytest.approx(600.0)


def test_a_file_without_counted_flags_counts_every_launch(tmp_path):
    ms = [train_measurement("m", 2, "eth", v, launch=i) for i, v in enumerate([400.0, 900.0])]
    props = {k: v for k, v in suite_properties(ms, {}).items() if not k.endswith(".launch_counted")}
    tiny_junit(tmp_path / "j.xml", text_of(ms), props)
    assert load_junit(tmp_path / "j.xml").cases["m-n2-eth"].tokens_per_s == [400.0, 900.0]


def test_a_gate_reads_back_as_fields_not_prose(tmp_path):
    ms = [train_measurement("m", 2, f, v) for f, v in (("ib", 1000.0), ("roce.v2", 981.0))]
    gate = outcome(Verdict.INCONCLUSIVE)
    gate = GateOutcome("roce.v2", "ib", *[getattr(gate, f) for f in ("threshold", "requirement", "interval", "verdict",
                                                                     "values", "unit", "context", "noise")])
    tiny_junit(tmp_path / "j.xml", text_of(ms, [], [gate]),
               suite_properties(ms, {}))
    (verdict,) = load_junit(tmp_path / "j.xml").verdicts
    (fields,) = verdict["gates"]
    assert fields == {"a": "roce.v2", "b": "ib", "outcome": "inconclusive", "ratio": 0.981, "ci_low": 0.962,
                      "ci_high": 1.0013, "confidence": 0.9875, "threshold": 0.95, "launches": [3, 4],
                      "reruns": 0.0}


def test_machine_lines_carry_mfu_peak_memory_and_the_convention():
    """n/a where there is no GPU peak (CPU runs), the number otherwise; the convention run-wide."""
    from pytest_fabric.history.junit import measurement_lines, suite_properties
    from pytest_fabric.core.models import MFU_CONVENTION

    m = train_measurement("m", 2, "ib", 200.0, peak_memory_bytes=3 << 29)
    lines = measurement_lines([m])
    p = f"fabric.{m.case.id}"
    assert lines[f"{p}.mfu"] == "n/a" and lines[f"{p}.mfu_peak"] == "n/a"
    assert lines[f"{p}.peak_memory_gib"] == "1.50"
    unrecorded = train_measurement("m", 2, "ib", 200.0)  # a result from before peak memory was recorded
    assert measurement_lines([unrecorded])[f"{p}.peak_memory_gib"] == "n/a"
    assert suite_properties([m], {})["fabric.mfu_convention"] == MFU_CONVENTION
