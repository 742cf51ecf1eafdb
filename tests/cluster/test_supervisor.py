"""The process supervisor: deadline, process-group kill (grandchildren too), failure spreading, log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_fabric.cluster import supervisor
from pytest_fabric.cluster.supervisor import ProcSpec, supervise


@pytest.fixture(autouse=True)
def short_graces(monkeypatch):
    # The production graces (seconds) only make these tests slow; the logic is the same.
    monkeypatch.setattr(supervisor, "FAILURE_GRACE_S", 0.5)
    monkeypatch.setattr(supervisor, "TERM_GRACE_S", 1.0)


def python(name: str, code: str) -> ProcSpec:
    return ProcSpec(name, [sys.executable, "-c", code], dict(os.environ))


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def grandparent_code(pidfile: Path, own_session: bool = False) -> str:
    """A process that starts a grandchild which ignores SIGTERM, records its pid, then sleeps.

    ``own_session``: the grandchild leaves the process group (as torchrun's workers do).
    """
    return (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], "
        f"start_new_session={own_session})\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )


def read_pid(pidfile: Path, timeout: float = 20.0) -> int:
    end = time.monotonic() + timeout
    while True:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        if time.monotonic() > end:
            raise AssertionError(f"{pidfile} never written")
        time.sleep(0.05)


def test_all_succeed(tmp_path):
    ticks = []
    outcome = supervise([python("node0", "print('hello 0')"), python("node1", "print('hello 1')")],
                        tmp_path, deadline_s=60, on_tick=ticks.append, tick_s=0.05)
    assert outcome.ok and not outcome.timed_out and outcome.killed == []
    assert [p.returncode for p in outcome.procs] == [0, 0]
    assert (tmp_path / "node0.log").read_text().strip() == "hello 0"
    assert (tmp_path / "node1.log").read_text().strip() == "hello 1"


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "own-session"])
def test_deadline_kills_the_whole_process_tree_including_grandchildren(tmp_path, own_session):
    pidfile = tmp_path / "grandchild.pid"
    spec = python("node0", grandparent_code(pidfile, own_session))
    start = time.monotonic()
    # Deadline long enough for the grandchild to start on a loaded machine, far below its sleep.
    outcome = supervise([spec], tmp_path / "logs", deadline_s=4)
    elapsed = time.monotonic() - start
    grandchild = read_pid(pidfile, timeout=0)
    try:
        assert outcome.timed_out and not outcome.ok
        assert outcome.killed == ["node0"]
        assert outcome.procs[0].returncode is None
        assert elapsed < 20, f"deadline 4 s, took {elapsed:.1f} s"
        # The grandchild ignores SIGTERM: only a SIGKILL to the whole group stops it.
        assert wait_dead(grandchild), f"grandchild {grandchild} survived the deadline"
        assert outcome.describe().startswith("deadline exceeded after ")
        assert "node0: killed" in outcome.describe()
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_grandchildren_are_killed_after_their_parent_exits(tmp_path):
    """torchrun agents can exit while workers they started live on: the group is killed anyway."""
    pidfile = tmp_path / "grandchild.pid"
    code = grandparent_code(pidfile).replace("time.sleep(120)\n", "") + "sys.exit(0)\n"
    outcome = supervise([python("node0", code)], tmp_path / "logs", deadline_s=30)
    grandchild = read_pid(pidfile, timeout=0)
    try:
        assert outcome.ok
        assert wait_dead(grandchild), f"grandchild {grandchild} of an exited process survived"
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_failing_process_brings_the_others_down(tmp_path):
    start = time.monotonic()
    outcome = supervise(
        [python("node0", "import time; time.sleep(120)"),
         python("node1", "import sys; print('rendezvous failed'); sys.exit(3)")],
        tmp_path, deadline_s=60)
    elapsed = time.monotonic() - start
    assert not outcome.ok and not outcome.timed_out
    assert elapsed < 20, f"one failure must not wait for the deadline (took {elapsed:.1f} s)"
    codes = {p.name: p.returncode for p in outcome.procs}
    assert codes == {"node0": None, "node1": 3}
    assert outcome.killed == ["node0"]
    report = outcome.describe()
    assert report.startswith("launch failed after ")
    assert "node0: killed" in report
    assert "node1: exit code 3" in report and "rendezvous failed" in report


def test_failure_report_carries_each_log_tail(tmp_path):
    noisy = "import sys\nfor i in range(100): print(f'line {i}')\nsys.exit(1)"
    outcome = supervise([python("node0", noisy), python("node1", "print('bye')")], tmp_path, deadline_s=60)
    report = outcome.describe()
    tail = outcome.procs[0].tail().splitlines()
    assert tail == [f"line {i}" for i in range(100 - supervisor.LOG_TAIL_LINES, 100)]
    assert "line 99" in report and "line 0\n" not in report
    assert str(tmp_path / "node0.log") in report and str(tmp_path / "node1.log") in report
    assert "node1: exit code 0" in report and "bye" in report


HUNG_RANK = """
import faulthandler, signal, sys, time

def on_term(signum, frame):  # what torchrun does when killed: a long traceback
    for i in range(100):
        print("noise while being killed", i, flush=True)
    sys.exit(1)

faulthandler.register(signal.SIGUSR1, all_threads=True)
signal.signal(signal.SIGTERM, on_term)
print("entering the collective", flush=True)

def wait_inside_collective():
    time.sleep(3600)

wait_inside_collective()
"""


def test_deadline_report_shows_where_each_rank_waited_not_the_noise_of_its_kill(tmp_path):
    # The rank programs' command lines hold the marker; they dump their stacks on SIGUSR1.
    spec = ProcSpec("node0", [sys.executable, "-c", HUNG_RANK, "pytest_fabric.workload.train"], dict(os.environ))
    outcome = supervise([spec], tmp_path, deadline_s=3)
    assert outcome.timed_out
    tail = outcome.procs[0].tail()
    assert "entering the collective" in tail
    assert "in wait_inside_collective" in tail  # faulthandler's dump, taken before the kill
    assert "noise while being killed" not in tail
    # The whole log is still on disk for whoever wants all of it.
    assert "noise while being killed 99" in (tmp_path / "node0.log").read_text()


@pytest.mark.parametrize("marker", [False, True])
def test_processes_that_do_not_catch_sigusr1_get_no_stack_dump_signal(tmp_path, marker):
    # SIGUSR1 would kill a process without a handler: a torchrun agent (its command line names the
    # rank program too), a rank still importing torch, a shell.
    code = "import time; print('agent', flush=True); time.sleep(3600)"
    argv = [sys.executable, "-c", code, *(["-m", "pytest_fabric.workload.train"] if marker else [])]
    outcome = supervise([ProcSpec("node0", argv, dict(os.environ))], tmp_path, deadline_s=2)
    # Killed by the supervisor's TERM (returncode None), not by SIGUSR1 before it (-10).
    assert outcome.timed_out and outcome.procs[0].returncode is None and outcome.killed == ["node0"]


def test_output_of_both_streams_goes_to_the_log(tmp_path):
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(2)"
    outcome = supervise([python("node0", code)], tmp_path, deadline_s=60)
    text = (tmp_path / "node0.log").read_text()
    assert "to stdout" in text and "to stderr" in text
    assert outcome.procs[0].returncode == 2


def test_sigterm_handler_is_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    supervise([python("node0", "pass")], tmp_path, deadline_s=60)
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_unstartable_program_stops_the_ones_already_started(tmp_path, monkeypatch):
    """An exception while starting (a missing executable) still kills what was started before."""
    started = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(supervisor.subprocess, "Popen", RecordingPopen)
    first = python("node0", "import time; time.sleep(120)")
    missing = ProcSpec("node1", [str(tmp_path / "no-such-program")], dict(os.environ))
    with pytest.raises(FileNotFoundError):
        supervise([first, missing], tmp_path, deadline_s=60)
    assert len(started) == 1
    assert started[0].returncode is not None, "the process started before the failure is still running"


@pytest.mark.parametrize("deadline_s", [3, 8])
def test_the_stop_is_budgeted_inside_the_deadline(tmp_path, monkeypatch, deadline_s):
    # The production graces: a rank that ignores SIGTERM costs the whole TERM grace, yet the
    # supervisor returns by the deadline (it starts stopping stop_budget_s before it).
    monkeypatch.setattr(supervisor, "TERM_GRACE_S", 3.0)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    start = time.monotonic()
    outcome = supervise([python("node0", code), python("node1", code)], tmp_path, deadline_s=deadline_s)
    elapsed = time.monotonic() - start
    assert outcome.timed_out and sorted(outcome.killed) == ["node0", "node1"]
    assert outcome.elapsed_s <= deadline_s and elapsed <= deadline_s * 1.1, (outcome.elapsed_s, elapsed)
    assert outcome.describe().startswith(f"deadline exceeded after {outcome.elapsed_s:.1f}s (deadline {deadline_s}s")


def test_stop_budget_is_a_share_of_the_deadline_bounded_both_ways():
    assert supervisor.stop_budget_s(20) == 2.0
    assert supervisor.stop_budget_s(300) == supervisor.STOP_BUDGET_S
    assert supervisor.stop_budget_s(3) == supervisor.MIN_STOP_S
    assert supervisor.stop_budget_s(1) == 0.5  # never more than half of it


def test_the_report_names_the_node_that_failed_first_and_lifts_the_ranks_own_lines(tmp_path):
    # node1 says what happened to it, then prints more than a tail's worth of lines; node0 waits.
    says = ("import sys; print('pytest-fabric: injected fault: crash on rank 1 at step 1, on node1/10.0.0.2'); "
            "print('pytest-fabric: injected fault: crash on rank 1 at step 1, on node1/10.0.0.2'); "
            "[print('frame', i) for i in range(200)]; sys.exit(1)")
    outcome = supervise([python("node0", "import time; time.sleep(120)"), python("node1", says)], tmp_path,
                        deadline_s=60)
    report = outcome.describe()
    assert "injected fault" not in outcome.procs[1].tail()  # out of the tail ...
    lines = report.splitlines()
    assert lines[1].startswith("node1 failed first: exit code 1 at ")
    # ... at the head, once, with the node it came from
    assert lines.count("node1: pytest-fabric: injected fault: crash on rank 1 at step 1, on node1/10.0.0.2") == 1
