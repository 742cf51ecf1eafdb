"""A hang located: one rank made to hang (or crash) by the test itself, not by an option of the harness,
and the launch must end at the collective timeout, well before its deadline, with every rank's stack
grouped, the odd rank's frame named, and the ranks' flight recorders summarised.

The fault is a ``sitecustomize.py`` the test puts first on the ranks' PYTHONPATH: in the process whose
RANK it is given (every rank's for ``*``), it wraps a torch.distributed collective (the N-th call never returns) or registers a
global forward pre-hook (the N-th module call hangs or raises). Every other process ignores it.
"""

from __future__ import annotations

import re
import secrets
import textwrap
from pathlib import Path

import pytest
from cluster_env import RANK_ENV, launch_on_node0, leftover_processes, slurm_site, ssh_site, train_program
from helpers import FAST_LAUNCH, emulated_unavailable, needs
from lxml import etree

from pytest_fabric.cluster.base import _PACKAGE_ROOT

PLANT = textwrap.dedent("""\
    import os, sys, time

    if os.environ.get("RANK") is not None and os.environ.get("PLANTED_RANK") in (os.environ["RANK"], "*"):
        KIND, AT = os.environ["PLANTED_KIND"], int(os.environ["PLANTED_CALL"])
        calls = [0]

        def say(what):
            print(f"planted: {what} in rank {os.environ['RANK']}", file=sys.stderr, flush=True)

        def planted_hang_in_collective(*args, **kwargs):
            calls[0] += 1
            if calls[0] == AT:
                say("hang in a collective")
                while True:
                    time.sleep(3600)
            return real(*args, **kwargs)

        def planted_forward_hook(module, args):
            calls[0] += 1
            if calls[0] == AT and KIND == "hang-compute":
                say("hang in the forward")
                while True:
                    time.sleep(3600)
            if calls[0] == AT and KIND == "crash":
                say("crash in the forward")
                raise RuntimeError("planted crash in the forward")

        import torch
        import torch.distributed as dist
        if KIND == "hang-collective":
            real = dist.all_gather_single  # what FSDP2 (torch 2.13) all-gathers parameters with
            dist.all_gather_single = planted_hang_in_collective
        else:
            torch.nn.modules.module.register_module_forward_pre_hook(planted_forward_hook)
""")


def plant(directory: Path, rank: int | str, kind: str, call: int) -> dict[str, str]:
    """The sitecustomize in ``directory``, and the variables that make it act in ``rank`` only."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(PLANT)
    return {"PLANTED_RANK": str(rank), "PLANTED_KIND": kind, "PLANTED_CALL": str(call)}


def groups(report: str) -> list[str]:
    """The grouped stack lines of a failure report."""
    head = report.index("stacks by rank (")
    lines = report[head:].splitlines()[1:]
    return [line.strip() for line in lines[:next((i for i, l in enumerate(lines) if not l.startswith("  ")), len(lines))]]


def ranks_named(lines: list[str]) -> set[int]:
    """The ranks the grouped lines name ("ranks 0-2, 5 (node0, node1): ...")."""
    return {n for line in lines for span in re.findall(r"^ranks? ([\d, -]+) \(", line)
            for part in span.split(", ") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}


# -- the test Slurm, 2 nodes x 2 ranks ----------------------------------------------------------------

COLLECTIVE_TIMEOUT_S = 15
DEADLINE_S = 150


@pytest.fixture
def site():
    with slurm_site(nodes=2) as started:
        yield started


def planted_env(tmp_path: Path, rank: int | str, kind: str, call: int) -> dict[str, str]:
    return {**RANK_ENV, "PYTHONPATH": f"{tmp_path / 'plant'}:{_PACKAGE_ROOT}", **plant(tmp_path / "plant", rank, kind, call)}


@pytest.mark.slow
def test_a_rank_hung_in_a_collective_on_slurm_is_located(site, tmp_path: Path) -> None:
    job_id = f"slurmhung{secrets.token_hex(3)}"
    env = planted_env(tmp_path, 3, "hang-collective", 3)
    spec = {"cluster": "slurm", "nodes": 2, "procs_per_node": 2, "job_id": job_id, "deadline_s": DEADLINE_S,
            "env": env, "program": train_program(tmp_path, steps=3, collective_timeout_s=COLLECTIVE_TIMEOUT_S)}
    report = launch_on_node0(site, spec, tmp_path, timeout_s=DEADLINE_S + 120, salloc=True)
    text = report["describe_outcome"]
    print(text)
    assert not report["ok"] and not report["timed_out"], text
    # Ended by the collective timeout: after it, and long before the deadline.
    assert COLLECTIVE_TIMEOUT_S < report["elapsed_s"] < DEADLINE_S / 2, text
    assert "stacks by rank (4 ranks;" in text, text
    lines = groups(text)
    # The hung rank first, its frame named; the others died of their collective's timeout, waiting for it.
    assert re.match(r"rank 3 \(node1\): planted_hang_in_collective \(sitecustomize\.py:\d+\) <- ", lines[0]), text
    assert ranks_named(lines) == {0, 1, 2, 3}, text
    # The others waited in the collective the hung rank never entered, until its timeout ended them.
    assert any(" died of " in line for line in lines[1:]), text
    assert "flight recorder (" in text and "gloo:" in text, text
    # The collective timeout reached the ranks and is what ended them, not the deadline.
    assert re.search(r"Timed out waiting 15000ms|timed out|Connection closed by peer", text, re.I), text
    # The ranks ran the package the harness imported (this checkout), as their stack files show.
    assert f'File "{_PACKAGE_ROOT}/pytest_fabric/workload/train.py"' in (tmp_path / "stacks" / "rank3.txt").read_text()
    assert report["steps_after"] == []
    assert leftover_processes(job_id) == []


HUNG_DEADLINE_S = 60


def every_rank_hung_in_compute(site, tmp_path: Path, cluster: dict) -> tuple[dict, str]:
    """Every rank hangs in its forward (no collective is waiting, so none times out): the deadline asks
    each for its stacks through the launcher; (the report, its text)."""
    job_id = f"allhung{secrets.token_hex(3)}"
    spec = {**cluster, "nodes": 2, "job_id": job_id, "deadline_s": HUNG_DEADLINE_S,
            "env": planted_env(tmp_path, "*", "hang-compute", 2),
            "program": train_program(tmp_path, steps=3, collective_timeout_s=HUNG_DEADLINE_S - 10)}
    report = launch_on_node0(site, spec, tmp_path, timeout_s=HUNG_DEADLINE_S + 120, salloc=cluster["cluster"] == "slurm")
    text = report["describe_outcome"]
    print(text)
    assert report["timed_out"], text
    lines = groups(text)
    assert len(lines) == 1 and re.match(r"ranks 0-1 \(node0, node1\): planted_forward_hook \(sitecustomize\.py:\d+\)",
                                        lines[0]), text
    # Each rank dumped its flight recorder too: only the SIGUSR1 the launcher delivered makes a running
    # rank do that (a SIGTERM dumps its stack alone), and its torchrun agent survived it (ignored).
    assert "flight recorder (2 ranks;" in text, text
    assert leftover_processes(job_id) == []
    return report, text


@pytest.mark.slow
def test_every_rank_hung_on_slurm_is_asked_through_scancel(site, tmp_path: Path) -> None:
    report, _ = every_rank_hung_in_compute(site, tmp_path, {"cluster": "slurm"})
    assert report["steps_after"] == []


@pytest.fixture
def ssh():
    with ssh_site(nodes=2) as started:
        yield started


@pytest.mark.slow
def test_every_rank_hung_over_ssh_is_asked_through_a_second_ssh(ssh, tmp_path: Path) -> None:
    every_rank_hung_in_compute(ssh, tmp_path, {"cluster": "ssh", "hostfile": str(ssh.files["hostfile"]),
                                               "ssh_config": str(ssh.files["ssh_config"])})


# -- the emulated cluster, through pytest as a user runs it -------------------------------------------

SOURCE = """
import pytest


@pytest.mark.fabric_matrix(nodes=[2])
def test_step(fabric_case, fabric_measure):
    fabric_measure(fabric_case)
"""
EMULATED_DEADLINE_S = 120
EMULATED_COLLECTIVE_S = 12


def run_planted(pytester: pytest.Pytester, monkeypatch, rank: int, kind: str, call: int) -> tuple[str, float]:
    """One 2-node x 2-rank eth launch with the planted fault; (the JUnit failure text, the test's time)."""
    needs(emulated_unavailable())
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    for name, value in plant(pytester.path / "plant", rank, kind, call).items():
        monkeypatch.setenv(name, value)
    # The harness puts its package first and keeps the rest of PYTHONPATH for the ranks.
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path / 'plant'}:{_PACKAGE_ROOT}")
    pytester.makepyfile(test_generated=SOURCE)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *FAST_LAUNCH, "--steps", "3", "--nodes", "2", "--gpus-per-node", "2", "--fabrics", "eth",
        "--launch-timeout", str(EMULATED_DEADLINE_S), "--collective-timeout", str(EMULATED_COLLECTIVE_S),
        f"--junitxml={junit}", f"--run-dir={tmp}", timeout=EMULATED_DEADLINE_S + 120)
    result.assert_outcomes(failed=1)
    (case,) = etree.parse(str(junit)).iter("testcase")
    failure = case.find("failure")
    # The element's text: the whole report (what pytest puts in the message attribute, and how much of
    # the report, is pytest's own choice, which changed in 9.2).
    return failure.text, float(case.get("time"))


@pytest.mark.slow
@pytest.mark.parametrize("rank, kind, frame", [
    (1, "hang-collective", r"planted_hang_in_collective \(sitecustomize\.py:\d+\)"),
    (2, "hang-compute", r"planted_forward_hook \(sitecustomize\.py:\d+\)"),
    (0, "crash", r"died of RuntimeError: planted crash in the forward; at planted_forward_hook \(sitecustomize\.py:\d+\)"),
])
def test_a_planted_fault_on_the_emulated_cluster_is_located(pytester, monkeypatch, rank, kind, frame):
    failure, seconds = run_planted(pytester, monkeypatch, rank, kind, call=3)
    print(failure[:failure.find("--- node0")])
    match = re.search(r"launch failed after ([\d.]+)s", failure)
    assert match, failure
    if kind != "crash":  # the others wait out their collective timeout, then the launch ends
        assert EMULATED_COLLECTIVE_S < float(match.group(1)) < EMULATED_DEADLINE_S / 2, failure
    assert seconds < EMULATED_DEADLINE_S, failure
    lines = groups(failure)
    node = "node0" if rank < 2 else "node1"
    odd = [line for line in lines if line.startswith(f"rank {rank} ({node}): ")]
    assert len(odd) == 1 and re.search(frame, odd[0]), failure
    assert ranks_named(lines) == {0, 1, 2, 3}, failure  # every rank, in one group or another
    assert "flight recorder (" in failure, failure
