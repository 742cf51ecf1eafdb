"""The Measurer with a stand-in cluster: one launch per configuration, failures cached with their logs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FakeCluster

from pytest_fabric import Case, MeasurementError, LaunchSettings
from pytest_fabric.cluster import Cluster
from pytest_fabric.cluster.base import OnThisMachine
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.measuring.store import ResultStore
from pytest_fabric.workload.config import TrainConfig
from pytest_fabric.workload.result import RESULT_VERSION


def measurer(tmp_path: Path, cluster: Cluster, **settings) -> Measurer:
    settings = {"steps": 3, "warmup_steps": 1, "batch_size": 2, "seq_len": 16, **settings}
    return Measurer(cluster, LaunchSettings(**settings), ResultStore(tmp_path / "store"), tmp_path / "launches")


def test_each_configuration_is_launched_once(tmp_path):
    cluster = FakeCluster()
    m = measurer(tmp_path, cluster)
    first = m.measure(Case("qwen2-tiny", 2, "ib"))
    again = m.measure(Case("qwen2-tiny", 2, "ib"))
    eth = m.measure(Case("qwen2-tiny", 2, "eth"))
    assert len(cluster.requests) == 2
    assert [r.fabric.name for r in cluster.requests] == ["ib", "eth"]
    assert first.tokens_per_s == again.tokens_per_s == 2 * 16 * 2 / 0.5
    assert first.gpus == 2 and first.step_s == 0.5
    assert first.estimate.steps == first.estimate.used == 3 and not first.disturbed
    assert first.result.hosts == ["node0", "node1"] and first.result.version == RESULT_VERSION
    assert eth.case == Case("qwen2-tiny", 2, "eth") and eth.shared_with is None


def test_another_measurer_on_the_same_store_reuses_the_launch(tmp_path):
    """What an xdist worker does: a second process with its own Measurer, same session directory."""
    cluster = FakeCluster()
    measurer(tmp_path, cluster).measure(Case("qwen2-tiny", 2, "ib"))
    other = FakeCluster()
    measurer(tmp_path, other).measure(Case("qwen2-tiny", 2, "ib"))
    assert len(cluster.requests) == 1 and other.requests == []


def test_one_node_is_measured_once_for_every_fabric(tmp_path):
    cluster = FakeCluster()
    m = measurer(tmp_path, cluster)
    ib = m.measure(Case("qwen2-tiny", 1, "ib"))
    eth = m.measure(Case("qwen2-tiny", 1, "eth"))
    assert len(cluster.requests) == 1
    assert eth.tokens_per_s == ib.tokens_per_s
    assert eth.case.fabric == "eth" and eth.shared_with == "ib"
    assert "[one node: shared with ib]" in eth.summary()


@pytest.mark.parametrize("changed", [{"steps": 4}, {"warmup_steps": 0}, {"batch_size": 1}, {"seq_len": 32},
                                     {"gpus_per_node": 2}, {"measure_s": 0.0},
                                     {"max_steps": 50}, {"device": "cpu"}, {"fsdp": 1}])
def test_a_setting_that_changes_the_measurement_changes_the_key(tmp_path, changed):
    case = Case("qwen2-tiny", 2, "eth")
    assert measurer(tmp_path, FakeCluster()).key(case) != measurer(tmp_path, FakeCluster(), **changed).key(case)


def test_launch_timeout_does_not_change_the_key(tmp_path):
    case = Case("qwen2-tiny", 2, "eth")
    assert (measurer(tmp_path, FakeCluster(), launch_timeout_s=60).key(case)
            == measurer(tmp_path, FakeCluster(), launch_timeout_s=600).key(case))


def test_request_carries_the_case_and_settings(tmp_path):
    cluster = FakeCluster()
    measurer(tmp_path, cluster, launch_timeout_s=77, gpus_per_node=2).measure(Case("llama-wide", 4, "eth"))
    (request,) = cluster.requests
    assert (request.nodes, request.procs_per_node, request.deadline_s) == (4, 2, 77)
    assert request.fabric.name == "eth" and request.fabric.emulated_mbit > 0
    config = TrainConfig.load(request.program[request.program.index("--config") + 1])
    assert (config.model["name"], config.batch_size, config.seq_len, config.steps, config.warmup_steps) == \
        ("llama-wide", 2, 16, 3, 1)
    assert config.fabric["name"] == "eth" and config.fabric["crosses_fabric"] is True


def test_model_default_shape_when_none_given(tmp_path):
    cluster = FakeCluster()
    measurer(tmp_path, cluster, batch_size=None, seq_len=None).measure(Case("llama-wide", 2, "ib"))
    config = TrainConfig.load(cluster.requests[0].program[-1])
    assert (config.batch_size, config.seq_len) == (1, 32)  # llama-wide's own shape


def test_failed_launch_is_cached_with_the_log_tail(tmp_path):
    cluster = FakeCluster(fail_with="RuntimeError: Connection refused")
    m = measurer(tmp_path, cluster)
    with pytest.raises(MeasurementError) as first:
        m.measure(Case("qwen2-tiny", 2, "ib"))
    message = str(first.value)
    assert message.startswith("qwen2-tiny-n2-ib on the fake cluster: launch failed")
    assert "node0: exit code 1" in message and "RuntimeError: Connection refused" in message
    # The next test needing the same configuration fails at once with the same report.
    with pytest.raises(MeasurementError) as second:
        measurer(tmp_path, FakeCluster()).measure(Case("qwen2-tiny", 2, "ib"))
    assert str(second.value) == message
    assert len(cluster.requests) == 1


def test_success_without_a_result_file_is_an_error(tmp_path):
    with pytest.raises(MeasurementError, match=r"every rank exited 0 but the result written by global rank 0 \(node0\) is unreadable"):
        measurer(tmp_path, FakeCluster(write_result=False)).measure(Case("qwen2-tiny", 2, "ib"))


def test_machine_lines_are_flat_strings_named_after_the_case(tmp_path):
    from pytest_fabric.history.junit import measurement_lines

    m = measurer(tmp_path, FakeCluster()).measure(Case("qwen2-tiny", 2, "eth"))
    lines = measurement_lines([m])
    assert all(isinstance(v, str) for v in lines.values())
    assert lines["fabric.qwen2-tiny-n2-eth.tokens_per_s"] == f"{m.tokens_per_s:.3f}"
    assert lines["fabric.qwen2-tiny-n2-eth.gpus"] == "2"
    assert lines["fabric.qwen2-tiny-n2-eth.steps"] == "3"
    assert lines["fabric.qwen2-tiny-n2-eth.hosts"] == "node0,node1"


def test_the_measured_steps_and_their_bounds_reach_the_rank_program(tmp_path):
    cluster = FakeCluster()
    m = measurer(tmp_path, cluster, steps=5, measure_s=2.5, max_steps=40)
    for launch in (0, 1):
        m.measure(Case("qwen2-tiny", 2, "eth"), launch)
    # Every launch, the first too, measures the same window: fixed before it starts.
    configs = [TrainConfig.load(r.program[-1]) for r in cluster.requests]
    assert [(c.steps, c.measure_s, c.max_steps) for c in configs] == [(5, 2.5, 40)] * 2


def test_a_result_from_a_newer_harness_is_an_error_that_says_so(tmp_path):
    class NewerCluster(FakeCluster):
        def launch(self, request, on_tick=None):
            outcome = super().launch(request, on_tick)
            path = Path(TrainConfig.load(request.program[-1]).result_path)
            path.write_text(json.dumps({**json.loads(path.read_text()), "version": RESULT_VERSION + 1}))
            return outcome

    with pytest.raises(MeasurementError, match="newer than this pytest-fabric reads"):
        measurer(tmp_path, NewerCluster()).measure(Case("qwen2-tiny", 2, "eth"))


def test_a_disturbed_launch_is_measured_and_marked_set_aside(tmp_path):
    class DisturbedCluster(FakeCluster):
        def launch(self, request, on_tick=None):
            outcome = super().launch(request, on_tick)
            path = Path(TrainConfig.load(request.program[-1]).result_path)
            result = json.loads(path.read_text())
            result["signals"]["disturbed"] = ["cpu steal 40 ms"] * len(result["step_s"])
            path.write_text(json.dumps(result))
            return outcome

    m = measurer(tmp_path, DisturbedCluster()).measure(Case("qwen2-tiny", 2, "eth"))
    assert m.disturbed.startswith("3 of 3 steps disturbed (cpu steal: 3)")
    assert m.tokens_per_s == 2 * 16 * 2 / 0.5  # a figure all the same: the output shows it


def test_repeated_launches_are_independent_and_each_cached(tmp_path):
    cluster = FakeCluster()
    m = measurer(tmp_path, cluster)
    case = Case("qwen2-tiny", 2, "eth")
    m.measure(case, launch=0)
    m.measure(case, launch=1)
    m.measure(case, launch=1)
    m.measure(case)
    assert len(cluster.requests) == 2


def test_every_launch_gets_its_own_directory(tmp_path):
    """Repeats of one case start within the same second when a launch fails fast: they must not share
    config, logs and result.json."""
    cluster = FakeCluster()
    m = measurer(tmp_path, cluster)
    case = Case("qwen2-tiny", 2, "eth")
    for launch in range(3):
        m.measure(case, launch=launch)
    assert len({r.workdir for r in cluster.requests}) == 3


class FakeLocalCluster(OnThisMachine, FakeCluster):
    """A cluster whose ranks would share this machine: launches take the machine-wide lock."""

    def __init__(self, lock_path: Path) -> None:
        super().__init__()
        self.lock_path = lock_path
        self.started_at: list[float] = []

    def machine_lock_path(self) -> Path:
        return self.lock_path

    def launch(self, request, on_tick=None):
        self.started_at.append(time.monotonic())
        return super().launch(request, on_tick)


def test_launches_on_this_machine_wait_for_another_sessions_launch(tmp_path):
    lock_path = tmp_path / "machine.lock"
    # Another session (another process: fcntl locks are per process) holds the machine for 2 s.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom filelock import FileLock\n"
        f"lock = FileLock({str(lock_path)!r})\nlock.acquire()\nprint('held', flush=True)\ntime.sleep(2)\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    held_at = time.monotonic()
    cluster = FakeLocalCluster(lock_path)
    said: list[str] = []
    m = Measurer(cluster, LaunchSettings(steps=3, warmup_steps=1, batch_size=2, seq_len=16), ResultStore(tmp_path / "s"),
                 tmp_path / "launches", progress=said.append)
    m.measure(Case("qwen2-tiny", 2, "eth"))
    assert holder.wait(timeout=10) == 0
    assert cluster.started_at[0] - held_at >= 1.5  # it launched only once the other session let go...
    assert any("waiting for another pytest-fabric session's launch on this machine" in s for s in said), said
    # ...and the lock is free again for the next session.
    from filelock import FileLock
    FileLock(str(lock_path)).acquire(timeout=0)


def test_a_free_machine_launches_at_once_without_a_message(tmp_path):
    cluster = FakeLocalCluster(tmp_path / "machine.lock")
    said: list[str] = []
    m = Measurer(cluster, LaunchSettings(steps=3, warmup_steps=1, batch_size=2, seq_len=16), ResultStore(tmp_path / "s"),
                 tmp_path / "launches", progress=said.append)
    m.measure(Case("qwen2-tiny", 2, "eth"))
    assert len(cluster.started_at) == 1 and not any("waiting" in s for s in said)
