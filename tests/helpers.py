"""Helpers the test modules share (plain functions; the fixtures live in conftest.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The cheapest real launch: the compute-light CPU model, one measured step (no adaptive measuring),
# a short sequence.
FAST_LAUNCH = [
    "--models", "qwen2-tiny",
    "--steps", "1",
    "--measure-seconds", "0",
    "--warmup-steps", "0",
    "--batch-size", "1",
    "--seq-len", "64",
    "--launch-timeout", "180",
]


def needs(unavailable: str | None) -> None:
    """Skip this test, saying what is missing, where this machine cannot run it (no root, no
    namespaces, no Slurm or sshd); under CI (``CI`` set) fail instead: ``.ci/run`` installs all of
    it, so a skip there would hide that the test never ran."""
    if unavailable is None:
        return
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but this machine cannot: {unavailable}", pytrace=False)
    pytest.skip(unavailable)


def namespaces() -> set[str]:
    """Network namespaces on this machine (none where iproute2 is missing)."""
    if shutil.which("ip") is None:
        return set()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def owner_alive(netns: str) -> bool:
    """Emulated namespaces are named ``pf<pid>-...`` after the harness process that made them;
    True when that process is alive and is not this one."""
    match = re.match(r"pf(\d+)-", netns)
    return bool(match) and int(match.group(1)) != os.getpid() and os.path.exists(f"/proc/{match.group(1)}")


def session_directory(output: str) -> Path:
    """The session's results directory, as the terminal summary prints it."""
    match = re.search(r"launch logs and results: (\S+)", output)
    assert match, "the terminal summary names no results directory"
    return Path(match.group(1))


def junit_schema_path() -> Path:
    """The Jenkins junit-10.xsd: the shared copy beside the repository (as CI checks it out), else
    the copy in fixtures/."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "junit-10.xsd"
    return shared if shared.is_file() else REPO / "fixtures" / "junit-10.xsd"


def assert_valid_junit(schema, path: Path) -> None:
    from lxml import etree

    doc = etree.parse(str(path))
    assert schema.validate(doc), f"{path} does not validate against junit-10.xsd:\n{schema.error_log}"


def emulated_unavailable() -> str | None:
    """Why the emulated cluster cannot run on this machine; None where it can."""
    from pytest_fabric.cluster import ClusterUnavailable
    from pytest_fabric.cluster.emulated import check_available

    try:
        check_available()
    except ClusterUnavailable as exc:
        return str(exc)
    return None


# The launch recorded on one H200 (fixtures/gpu/README.md): qwen2.5-1.5b, FSDP2 bf16, 8 x 2048, one rank.
GPU_RESULT = REPO / "fixtures" / "gpu" / "result-qwen2.5-1.5b-b8-fsdp2-h200.json"
GPU_PEAK = "H200 SXM 989 TFLOP/s dense bf16"  # the peak its MFU is taken against, as every output names it


def gpu_record(fabric: str = "eth") -> dict:
    """The recorded H200 result as a session store's record of a one-node launch measured for ``fabric``."""
    import json

    return {"case": {"model": "qwen2.5-1.5b", "nodes": 1, "fabric": fabric}, "cluster": "local",
            "result": json.loads(GPU_RESULT.read_text())}


def gpu_measurement(fabric: str = "eth"):
    """The recorded H200 launch as the Measurer reads it."""
    from pytest_fabric import Case, Measurement

    return Measurement.from_record(Case("qwen2.5-1.5b", 1, fabric), gpu_record(fabric))


def gpu_expected() -> tuple[float, float]:
    """(MFU, peak memory per rank in GiB) of the recorded H200 launch, from its raw figures: FLOPs per
    token x the launch's tokens/s over the 989 TFLOP/s peak of one GPU; its allocator's peak."""
    m = gpu_measurement()
    return m.result.flops_for_mfu() * m.tokens_per_s / 989e12, m.result.peak_memory_bytes / 2**30
