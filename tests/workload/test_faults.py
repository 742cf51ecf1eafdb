"""Faults injected into real launches on the emulated cluster (pytest_fabric/workload/faults.py).

One pytest run, as a subprocess like a user's, measures five configurations in turn: ib is healthy
and measured first, then each other fabric gets one fault: a rank that raises mid-run (eth), a rank
killed by SIGABRT (eth-b, a copy of eth), a rank that stops while its peer waits inside the step's
collectives (roce), a node whose link is down so it never joins the rendezvous (efa). Every fault
must become a failed test within the launch deadline, with the ranks' last log lines in the failure,
no rank process and no network namespace left behind, and the healthy measurement kept on disk.
A second run is interrupted with SIGINT (Ctrl-C) in the middle of a launch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_env import leftover_processes
from helpers import (FAST_LAUNCH, emulated_unavailable, interrupt_when, namespaces, needs, owner_alive,
                     session_directory)
from lxml import etree

from pytest_fabric.cluster.emulated import sweep_stale_namespaces
from pytest_fabric.workload import faults

UNAVAILABLE = emulated_unavailable()

DEADLINE_S = 75  # per launch; a healthy FAST_LAUNCH takes 15-25 s here
FAULTS = "crash:fabric=eth,rank=1,step=1; abort:fabric=eth-b,rank=0,step=1; hang:fabric=roce,rank=1,step=1; " \
         "nojoin:fabric=efa,node=1"
ARGS = [*FAST_LAUNCH, "--steps", "2", "--launch-timeout", str(DEADLINE_S), "--nodes", "2"]
SOURCE = """
import pytest


@pytest.mark.fabric_matrix(nodes=[2])
def test_step(fabric_case, fabric_measure):
    fabric_measure(fabric_case)
"""


# -- the parser, no launch -------------------------------------------------------------------------

def test_parse_reads_each_fault_with_defaults():
    parsed = faults.parse(FAULTS)
    assert [f.kind for f in parsed] == ["crash", "abort", "hang", "nojoin"]
    assert parsed[0] == faults.Fault("crash", fabric="eth", rank=1, step=1)
    assert parsed[3] == faults.Fault("nojoin", fabric="efa", node=1)
    assert faults.parse("hang") == [faults.Fault("hang", fabric=None, rank=1, step=1, node=1)]
    assert faults.parse("") == []
    assert faults.nodes_left_out(parsed, "efa") == {1} and faults.nodes_left_out(parsed, "eth") == set()


@pytest.mark.parametrize("text, says", [
    ("explode", "unknown fault 'explode'"),
    ("crash:rank=one", "rank='one'"),
    ("crash:colour=red", "is not one of fabric=NAME"),
    ("hang:fabric=", "is not one of fabric=NAME"),
])
def test_parse_refuses_malformed_values_saying_what_to_write(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        faults.parse(text)


def test_a_malformed_fault_is_a_usage_error_before_any_launch(pytester, monkeypatch):
    needs(UNAVAILABLE)
    monkeypatch.setenv(faults.ENV, "crash:rank=x")
    pytester.makepyfile(test_generated=SOURCE)
    result = pytester.runpytest_subprocess("--fabrics", "eth", "--nodes", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "PYTEST_FABRIC_FAULT: rank='x'" in result.stderr.str()


def test_parse_reads_the_chaos_faults_with_their_defaults():
    garbage, truncate, linkcut = faults.parse("garbage:fabric=eth,mb=40; truncate; linkcut:node=1,step=2")
    assert garbage == faults.Fault("garbage", fabric="eth", rank=1, step=1, mb=40)
    assert faults.parse("garbage")[0].mb == 50
    assert truncate == faults.Fault("truncate", rank=0)  # rank 0 writes the result
    assert linkcut == faults.Fault("linkcut", node=1, step=2)
    assert faults.links_cut([linkcut], "ib") == {1} and faults.links_cut([garbage], "eth") == set()
    assert faults.truncates([truncate], 0, "ib") == truncate and faults.truncates([truncate], 1, "ib") is None
    assert "40 MB of binary garbage" in garbage.describe()
    assert "node 1's link cut at step 2" in linkcut.describe()


@pytest.mark.parametrize("text, says", [
    ("crash:mb=3", "mb= in 'crash:mb=3' applies to garbage faults only"),
    ("garbage:mb=lots", "mb='lots'"),
])
def test_parse_refuses_mb_where_it_means_nothing(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        faults.parse(text)


# -- real launches ---------------------------------------------------------------------------------

def harness_namespaces_of_dead_owners(before: set[str]) -> set[str]:
    """Emulated-cluster namespaces that appeared since ``before`` and whose harness has exited."""
    return {n for n in namespaces() - before if re.match(r"pf\d+-", n) and not owner_alive(n)}


class FaultRun:
    def __init__(self, pytester: pytest.Pytester, monkeypatch, fault_text: str = FAULTS,
                 fabrics: str = "ib,eth,eth-b,roce,efa", deadline_s: int = DEADLINE_S, extra: tuple = ()) -> None:
        tmp = pytester.path / "tmp"
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setenv(faults.ENV, fault_text)
        pytester.makeini("[pytest]\nfabric_define = eth-b: eth\n")
        pytester.makepyfile(test_generated=SOURCE)
        self.saved = pytester.path / "saved.json"
        self.junit = pytester.path / "junit.xml"
        before = namespaces()
        start = time.monotonic()
        self.result = pytester.runpytest_subprocess(*ARGS, "--launch-timeout", str(deadline_s), "--fabrics", fabrics,
                                                    f"--fabric-save={self.saved}", f"--junitxml={self.junit}",
                                                    f"--run-dir={tmp}", *extra,
                                                    timeout=(fabrics.count(",") + 1) * deadline_s + 120)
        self.wall_s = time.monotonic() - start
        self.output = self.result.stdout.str()
        self.directory = session_directory(self.output)
        self.leftover_namespaces = harness_namespaces_of_dead_owners(before)
        self.leftover_processes = leftover_processes(str(pytester.path))

    def record(self, fabric: str) -> dict:
        records = json.loads((self.directory / "measurements.json").read_text())
        (record,) = [r for r in records.values() if r["case"]["fabric"] == fabric]
        return record

    def failure(self, fabric: str) -> str:
        tree = etree.parse(str(self.junit))
        (case,) = [c for c in tree.iter("testcase") if c.get("name") == f"test_step[qwen2-tiny-n2-{fabric}]"]
        failure = case.find("failure")
        assert failure is not None, f"{fabric}: not a failure in JUnit"
        return f"{failure.get('message')}\n{failure.text}"


@pytest.fixture(scope="module")
def _cache():
    return {}


@pytest.fixture
def fault_run(_cache, pytester, monkeypatch) -> FaultRun:
    needs(UNAVAILABLE)
    if "run" not in _cache:
        _cache["run"] = FaultRun(pytester, monkeypatch)
    return _cache["run"]


@pytest.mark.slow
def test_healthy_launch_passes_and_each_fault_fails_its_test(fault_run):
    fault_run.result.assert_outcomes(passed=1, failed=4)
    tree = etree.parse(str(fault_run.junit))
    passed = [c.get("name") for c in tree.iter("testcase") if not len(c.findall("failure"))]
    assert passed == ["test_step[qwen2-tiny-n2-ib]"]


@pytest.mark.slow
@pytest.mark.parametrize("fabric, head, says", [
    ("eth", "launch failed", "InjectedFault: injected fault: crash on rank 1 at step 1"),
    ("eth-b", "launch failed", "Signal 6 (SIGABRT)"),
    # The hung rank's peer fails at the collective timeout (a third of the deadline), long before it.
    ("roce", "launch failed", "rank 1 (node1): at_step (faults.py:"),
    ("efa", "", "node1: "),
])
def test_each_fault_fails_within_the_deadline_with_the_ranks_log_tails(fault_run, fabric, head, says):
    failure = fault_run.failure(fabric)
    match = re.search(r"(launch failed|deadline exceeded) after ([\d.]+)s", failure)
    assert match, failure
    assert head in match.group(1)
    assert float(match.group(2)) <= DEADLINE_S + 5, failure
    assert "--- node0: " in failure and "--- node1: " in failure and "last lines of" in failure
    assert says in failure, failure
    # One line names the fault's kind and the node it hit: the rank's own (lifted from that node's log
    # to the head) or the harness's note of what it did to the node.
    kind, node = {"eth": ("crash", 1), "eth-b": ("abort", 0), "roce": ("hang", 1), "efa": ("nojoin", 1)}[fabric]
    assert re.search(rf"^node{node}: pytest-fabric: injected fault: {kind} on rank {node} at step 1 \(fabric {fabric}\), "
                     rf"on node{node}/|^injected fault: {kind}: node{node}'s link left down", failure, re.M), failure
    if kind in ("crash", "abort"):
        assert f"node{node} failed first: exit code 1 at " in failure, failure
    # The store keeps the failure, so every other test of the configuration reports it without relaunching.
    assert fault_run.record(fabric)["error"].split("\n")[0] in failure


@pytest.mark.slow
def test_a_hang_report_shows_the_peer_waiting_inside_a_collective(fault_run):
    # The peer's collective timed out (--collective-timeout, a third of the 75 s deadline): it died of
    # that error inside the collective, and the hung rank's stack is where the fault stopped it.
    failure = fault_run.failure("roce")
    assert float(re.search(r"launch failed after ([\d.]+)s", failure).group(1)) < DEADLINE_S * 0.75, failure
    (peer,) = {line for line in failure.splitlines() if line.startswith("  rank 0 (node0): died of ")}
    assert re.search(r"; at (all_gather\w*|reduce_scatter\w*|all_reduce|wait) \(", peer), peer
    assert "flight recorder (" in failure and "gloo:" in failure, failure
    assert fault_run.record("roce")["error"].count("stacks by rank (2 ranks;") == 1


@pytest.mark.slow
def test_a_node_that_never_joins_is_reported_from_its_own_log(fault_run):
    failure = fault_run.failure("efa")
    # node1's torchrun cannot reach node 0's rendezvous store over its dead link: node1 is the one that
    # failed on its own (its exit code), node0 was killed waiting for it; each section is its own log.
    assert re.search(r"--- node1: exit code [1-9]\d*; last lines of \S+/node1\.log ---", failure), failure
    assert re.search(r"--- node0: killed; last lines of \S+/node0\.log ---", failure), failure


@pytest.mark.slow
def test_faults_leave_no_process_or_namespace_behind(fault_run):
    assert fault_run.leftover_processes == []
    assert fault_run.leftover_namespaces == set()
    assert fault_run.wall_s < 5 * DEADLINE_S + 60


@pytest.mark.slow
def test_the_healthy_measurement_is_kept_on_disk(fault_run):
    assert fault_run.record("ib")["result"]["step_s"][0] > 0
    saved = json.loads(fault_run.saved.read_text())
    # The healthy configuration's value is saved; each failed launch's error is saved beside it.
    ib = [c for c in saved["cases"].values() if c["fabric"] == "ib"]
    assert len(ib) == 1 and ib[0]["tokens_per_s"] and all(v > 0 for v in ib[0]["tokens_per_s"]), saved["cases"]
    assert len(saved["errors"]) >= 4, saved["errors"]
    for fabric in ("eth", "eth-b", "roce", "efa"):
        assert "error" in fault_run.record(fabric)


# -- Ctrl-C ----------------------------------------------------------------------------------------

def session_to_kill(pytester: pytest.Pytester, fault_text: str) -> tuple[Path, Path, dict[str, str]]:
    """(its TMPDIR and --run-dir, its --fabric-save, its environment) for a pytest run started as a subprocess."""
    needs(UNAVAILABLE)
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    pytester.makepyfile(test_generated=SOURCE)
    return tmp, pytester.path / "saved.json", {**os.environ, "TMPDIR": str(tmp), faults.ENV: fault_text}


@pytest.mark.slow
def test_ctrl_c_during_a_launch_stops_the_ranks_and_keeps_what_was_measured(pytester):
    tmp, saved, env = session_to_kill(pytester, "hang:fabric=eth,rank=1,step=1")
    before = namespaces()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_generated.py", *ARGS,
                             "--fabrics", "ib,eth", f"--fabric-save={saved}", f"--run-dir={tmp}"],
                            cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            # A shell's background job inherits SIGINT ignored, and Python then never
                            # turns it into KeyboardInterrupt: give the child what a terminal gives.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Once the eth launch is inside its hang (its rank 1 has logged the injected fault), what Ctrl-C
    # sends to the foreground pytest.
    output, stopped_s = interrupt_when(
        proc, lambda: any("injected fault: hang" in p.read_text(errors="replace") for p in tmp.rglob("node1.log")
                          if "qwen2-tiny-n2-eth" in str(p)),
        signal.SIGINT, "the eth launch never reached its injected hang", 3 * DEADLINE_S, 30)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt" in output
    assert stopped_s < 15, output
    assert leftover_processes(str(pytester.path)) == []
    assert harness_namespaces_of_dead_owners(before) == set()
    directory = session_directory(output)
    records = json.loads((directory / "measurements.json").read_text())
    (ib,) = [r for r in records.values() if r["case"]["fabric"] == "ib"]
    assert ib["result"]["step_s"][0] > 0
    saved_text = saved.read_text()
    assert "tokens_per_s" in saved_text and '"ib"' in saved_text


# -- garbage, a truncated result, a link cut mid-step -----------------------------------------------

CHAOS_DEADLINE_S = 60
CHAOS_FAULTS = "garbage:fabric=eth,rank=1,step=0,mb=40; truncate:fabric=eth-b; linkcut:fabric=roce,node=1,step=1"


@pytest.fixture
def chaos(_cache, pytester, monkeypatch) -> FaultRun:
    needs(UNAVAILABLE)
    if "chaos" not in _cache:
        _cache["chaos"] = FaultRun(pytester, monkeypatch, CHAOS_FAULTS, "eth,eth-b,roce", CHAOS_DEADLINE_S)
    return _cache["chaos"]


@pytest.mark.slow
@pytest.mark.parametrize("fabric, says", [
    ("eth", r"log limit exceeded after [\d.]+s\nnode1: its log passed 32 MiB"),
    ("eth-b", r"the result written by global rank 0 \(node0\) is unreadable"),
    # Over the cut link both ranks' collectives time out (--collective-timeout: 20 s of the 60 s
    # deadline), and each says so in its stack.
    ("roce", r"launch failed after [\d.]+s\nnode\d failed first: exit code 1 at [\d.]+s\n"
             r"injected fault: linkcut: node1's link cut by the harness.*\n.*\n  ranks 0-1 \(node0, node1\): died of "),
])
def test_each_chaos_fault_is_an_error_naming_the_node_within_the_deadline(chaos, fabric, says):
    failure = chaos.failure(fabric)
    assert re.search(says, failure), failure
    match = re.search(r"(launch failed|deadline exceeded|log limit exceeded) after ([\d.]+)s", failure)
    assert match and float(match.group(2)) <= CHAOS_DEADLINE_S * 1.1, failure
    assert "injected fault: " + {"eth": "garbage", "eth-b": "truncate", "roce": "linkcut"}[fabric] in failure
    # One line names the fault and the node it hit: the rank's own, lifted to the head, or the harness's.
    node = "node0" if fabric == "eth-b" else "node1"
    assert re.search(rf"^{node}: pytest-fabric: injected fault: \w+.*, on {node}/|^injected fault: linkcut: {node}'s",
                     failure, re.M), failure


@pytest.mark.slow
def test_a_garbage_rank_s_report_is_bounded_and_printable(chaos):
    failure = chaos.failure("eth")
    assert len(failure) < 40_000, len(failure)
    assert "[line cut]" in failure and "\x00" not in failure
    assert all(len(line) <= 320 for line in failure.splitlines() if not line.startswith("--- node"))
    record = chaos.record("eth")["error"]
    assert len(record) < 40_000


@pytest.mark.slow
def test_chaos_faults_leave_nothing_behind(chaos):
    chaos.result.assert_outcomes(failed=3)
    assert chaos.leftover_processes == []
    assert chaos.leftover_namespaces == set()


# -- a short deadline: the stop fits inside it ------------------------------------------------------

SHORT_DEADLINE_S = 25


@pytest.mark.slow
def test_a_hang_under_a_short_deadline_is_reported_within_it(pytester, monkeypatch):
    # The stop (stacks, TERM, KILL: seconds) starts early enough that the report comes by the
    # deadline + 10% however short the deadline: before, it came ~4.5 s after it (27% of 20 s).
    needs(UNAVAILABLE)
    # A collective timeout just below the deadline: the deadline comes first (the ranks start ~10 s in).
    run = FaultRun(pytester, monkeypatch, "hang:fabric=eth,rank=1,step=0", "eth", SHORT_DEADLINE_S,
                   ("--collective-timeout", str(SHORT_DEADLINE_S - 1)))
    run.result.assert_outcomes(failed=1)
    failure = run.failure("eth")
    match = re.search(r"deadline exceeded after ([\d.]+)s \(deadline 25s", failure)
    assert match and float(match.group(1)) <= SHORT_DEADLINE_S, failure
    (case,) = etree.parse(str(run.junit)).iter("testcase")
    assert float(case.get("time")) <= SHORT_DEADLINE_S * 1.1, case.get("time")
    assert re.search(r"^node1: pytest-fabric: injected fault: hang on rank 1 at step 0 \(fabric eth\), on node1/",
                     failure, re.M), failure
    assert run.leftover_processes == [] and run.leftover_namespaces == set()


# -- a killed session restarted: what it completed is not measured again ----------------------------

@pytest.mark.slow
def test_a_session_killed_outright_is_restarted_reusing_the_launches_it_completed(pytester):
    _, saved, env = session_to_kill(pytester, "")
    resume = pytester.path / "saved.json.resume.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_generated.py", *ARGS, "--fabrics", "ib,eth",
           f"--fabric-save={saved}"]
    proc = subprocess.Popen(cmd, cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 3 * DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            if resume.exists() and '"ib"' in resume.read_text():  # ib's launch completed, eth's under way
                break
            time.sleep(0.2)
        else:
            pytest.fail("the ib launch never completed")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up, no saved night
        proc.wait()
        sweep_stale_namespaces()
    assert not saved.exists()
    restart = subprocess.run(cmd, cwd=pytester.path, env=env, capture_output=True, text=True, timeout=4 * DEADLINE_S)
    output = restart.stdout
    assert restart.returncode == 0, output + restart.stderr
    # In the header, and again at the end (-q shows no header).
    assert output.count(f"fabric: reusing 1 launches saved by an earlier session in {resume}") == 2, output
    launched = sorted(re.sub(r"-\d{6}-\w+$", "", p.name) for p in (session_directory(output) / "launches").iterdir())
    assert launched == ["qwen2-tiny-n2-eth"], launched  # ib was not launched again
    night = json.loads(saved.read_text())
    assert sorted(r["case"]["fabric"] for r in night["records"].values()) == ["eth", "ib"]
    assert not resume.exists()  # the restart ended on its own
