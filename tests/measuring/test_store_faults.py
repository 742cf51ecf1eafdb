"""A results directory on a disk that fills up or turns read-only mid-run (a real tmpfs mounted for the
test): one clear line per refused file saying what to do, the launches measured before kept in the
terminal table and the JUnit, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FAST_LAUNCH

from pytest_fabric.measuring.store import ResultStore, StoreWarning


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted afterwards whatever happened (it is remounted read-only by a test)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Write zeros into ``directory`` until its disk is full."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass


def test_a_record_the_disk_refuses_is_kept_in_memory_and_written_once_there_is_room(small_disk: Path) -> None:
    store = ResultStore(small_disk / "session")
    store.put("before", {"x": 1})
    fill(small_disk)
    with pytest.warns(StoreWarning, match=r"cannot write the measurement store .*no space left on the device"):
        record, computed = store.get_or_compute("during", lambda: {"x": "y" * 20000})
    assert computed and record == {"x": "y" * 20000}
    assert store.all() == {"before": {"x": 1}, "during": record}  # served from memory
    assert json.loads(store.path.read_text()) == {"before": {"x": 1}}  # the file is still whole
    (small_disk / "filler").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.put("after", {"x": 2})
    assert json.loads(store.path.read_text()) == {"before": {"x": 1}, "during": record, "after": {"x": 2}}


# The one-node launch measures with a healthy disk; then the disk fills up (or turns read-only) and
# the two-node launch cannot even write its config.
GENERATED = """
import os, subprocess
from pathlib import Path
import pytest

@pytest.mark.fabric_matrix(nodes=[1, 2], fabrics=["eth"])
def test_step(fabric_case, fabric_measure):
    if fabric_case.nodes == 2:
        disk = Path(os.environ["TMPDIR"])
        if {mode!r} == "full":
            with open(disk / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(bytes(4096)); f.flush()
                except OSError:
                    pass
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    assert fabric_measure(fabric_case).tokens_per_s > 0
"""


def run_session(tmp_path: Path, disk: Path, mode: str, junit: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_generated.py").write_text(GENERATED.format(mode=mode))
    return subprocess.run(
        ["python", "-m", "pytest", "test_generated.py", "-p", "no:cacheprovider", "-s", "--cluster", "local",
         "--nodes", "2", *FAST_LAUNCH, "--fabric-save", str(disk / "night.json"), f"--junitxml={junit}",
         f"--run-dir={disk}"],
        cwd=tmp_path, env={**os.environ, "TMPDIR": str(disk)}, capture_output=True, text=True, timeout=300)


def assert_clear(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-4000:]
    assert proc.returncode == 1, out[-4000:]
    assert "1 failed, 1 passed" in out, out[-4000:]
    table = out.split("fabric throughput (tokens/s)")[1]
    assert any(line.split()[:2] == ["1", "1"] for line in table.splitlines()), "the one-node launch is in the table"
    return out


@pytest.mark.slow
def test_full_results_disk_is_one_clear_error_and_keeps_what_was_measured(small_disk: Path, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"  # on a healthy disk: it must hold the launch measured before
    out = assert_clear(run_session(tmp_path, small_disk, "full", junit))
    assert "measurement failed: qwen2-tiny-n2-eth: cannot write the launch files (" in out
    assert "no space left on the device; free space there" in out
    assert f"fabric: ERROR cannot write the saved night (--fabric-save) ({small_disk / 'night.json'})" in out
    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
    passed, failed = cases["test_step[qwen2-tiny-n1-eth]"], cases["test_step[qwen2-tiny-n2-eth]"]
    assert "tokens/s" in (passed.findtext("system-out") or "")
    assert "no space left on the device" in failed.find("failure").get("message")


@pytest.mark.slow
def test_read_only_results_disk_is_one_clear_error_and_keeps_what_was_measured(small_disk: Path,
                                                                                tmp_path: Path) -> None:
    junit = small_disk / "junit.xml"  # pytest's own JUnit writer is refused too
    out = assert_clear(run_session(tmp_path, small_disk, "ro", junit))
    assert "cannot write the launch files (" in out and "the file system is read-only" in out
    assert f"fabric: ERROR cannot write the JUnit XML ({junit})" in out
    assert "fabric: ERROR cannot write the saved night (--fabric-save)" in out
