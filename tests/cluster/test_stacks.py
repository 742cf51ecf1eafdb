"""Every rank's stack at a failed launch, grouped (cluster/stacks.py), from real processes that write
their stack files as rank programs do (workload/hangs.py) and are asked by the real supervisor."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_fabric.cluster import stacks, supervisor
from pytest_fabric.cluster.supervisor import ProcSpec, supervise

# A stand-in rank program: the marker (pytest_fabric.workload) is in its command line, it writes its
# stack file through hangs.install, and it stops in the function its argument names.
RANK = textwrap.dedent("""\
    import os, sys, time
    import faulthandler, signal
    import pytest_fabric.workload.hangs as hangs
    faulthandler.register(signal.SIGUSR1)  # as the rank programs do before they read their config
    hangs.install(sys.argv[1])

    def wait_in_collective():
        time.sleep(60)

    def stuck_in_data_step():
        time.sleep(60)

    def all_gather():
        time.sleep(1.0)
        raise RuntimeError("[/src/gloo/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete\\nmore")

    def step(where):
        globals()[where]()

    try:
        step(sys.argv[2])
    except Exception as exc:
        hangs.record_exception(exc)
        raise
""")


@pytest.fixture(autouse=True)
def short_graces(monkeypatch):
    monkeypatch.setattr(supervisor, "FAILURE_GRACE_S", 2.0)
    monkeypatch.setattr(supervisor, "TERM_GRACE_S", 1.0)


def rank(run_dir: Path, number: int, node: str, where: str) -> ProcSpec:
    env = {**os.environ, "RANK": str(number), "PYTEST_FABRIC_NODE": f"{node}/10.0.0.{number}",
           "PYTHONPATH": str(Path(stacks.__file__).resolve().parents[2])}
    return ProcSpec(f"rank{number}", [sys.executable, "-c", RANK, str(run_dir), where], env)


def test_a_failed_launch_reports_every_rank_s_stack_grouped(tmp_path):
    specs = [rank(tmp_path, 0, "node0", "wait_in_collective"), rank(tmp_path, 1, "node0", "wait_in_collective"),
             rank(tmp_path, 2, "node1", "stuck_in_data_step"), rank(tmp_path, 3, "node1", "all_gather")]
    outcome = supervise(specs, tmp_path, deadline_s=60)
    assert not outcome.ok and not outcome.timed_out
    assert outcome.elapsed_s < 20
    text = outcome.describe()
    head, *groups = outcome.stacks
    assert head.startswith("stacks by rank (4 ranks;"), text
    # The odd ones out first; the hung frame of each named with its file and line.
    assert re.match(r"  rank 2 \(node1\): stuck_in_data_step \(<string>:\d+\) <- step \(<string>:\d+\)", groups[0]), text
    assert re.match(r"  rank 3 \(node1\): died of RuntimeError: Timed out waiting 1000ms for recv operation to "
                    r"complete; at all_gather \(<string>:\d+\) <- step", groups[1]), text
    assert re.match(r"  ranks 0-1 \(node0\): wait_in_collective \(<string>:\d+\) <- step", groups[2]), text
    assert len(groups) == 3
    assert "\n".join(outcome.stacks) in text
    assert all(len(line) <= 300 for line in outcome.stacks[1:]), outcome.stacks


def test_a_deadline_asks_every_running_rank(tmp_path):
    specs = [rank(tmp_path, 0, "node0", "wait_in_collective"), rank(tmp_path, 1, "node1", "stuck_in_data_step")]
    outcome = supervise(specs, tmp_path, deadline_s=8)
    assert outcome.timed_out
    assert [line.split(":")[0] for line in outcome.stacks[1:]] == ["  rank 0 (node0)", "  rank 1 (node1)"], outcome.stacks
    assert "wait_in_collective" in outcome.stacks[1] and "stuck_in_data_step" in outcome.stacks[2]
    # Each dumped when asked (SIGUSR1) and again when killed (SIGTERM).
    assert [s.dumps for s in stacks.read(tmp_path)] == [2, 2]


def test_a_stack_file_keeps_the_exception_over_later_dumps():
    text = textwrap.dedent("""\
        # rank 5 node node2/10.0.0.3 pid 77 main 0x00007f0000000001
        Thread 0x00007f0000000002 (most recent call first):
          File "/x/threading.py", line 320 in wait

        Current thread 0x00007f0000000001 (most recent call first):
          File "/x/train.py", line 170 in run
        --- exception
        DistBackendError: Timed out
        Current thread (most recent call first):
          File "/x/c10d.py", line 3790 in all_gather_into_tensor
          File "/x/train.py", line 171 in run
        Current thread 0x00007f0000000001 (most recent call first):
          File "/x/errors.py", line 9 in record
        """)
    stack = stacks.parse(text)
    assert stack is not None and stack.rank == 5 and stack.node == "node2/10.0.0.3"
    assert stack.error == "DistBackendError: Timed out"
    assert stack.frames == (("/x/c10d.py", 3790, "all_gather_into_tensor"), ("/x/train.py", 171, "run"))
    assert stacks.parse("no header\n") is None


def test_ranks_that_wrote_no_file_are_named(tmp_path):
    (tmp_path / "stacks").mkdir()
    for rank in (0, 2):
        (tmp_path / "stacks" / f"rank{rank}.txt").write_text(
            f"# rank {rank} node node{rank} pid 1 main 0x00007f0000000001 world 4\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n  File \"/x/a.py\", line 3 in wait\n")
    lines = stacks.report(tmp_path)
    assert lines[0].startswith("stacks by rank (2 ranks;")
    assert lines[1] == "  ranks 0, 2 (node0, node2): wait (a.py:3)"
    assert lines[2].startswith("  ranks 1, 3: no stack file (never started")


def test_ranges_and_many_groups_stay_short():
    assert stacks.ranges([3, 0, 1, 2, 5, 7, 8]) == "0-3, 5, 7-8"
    many = [stacks.RankStack(r, f"node{r}", ((f"f{r}.py", 1, f"f{r}"),)) for r in range(20)]
    lines = stacks.group(many, shown=4)
    assert len(lines) == 5 and lines[-1].startswith("... 16 more groups, 16 ranks")
