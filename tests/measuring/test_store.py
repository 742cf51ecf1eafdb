"""The results store shared by xdist workers: computes once, and concurrent writers lose nothing."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from pathlib import Path

import pytest

from pytest_fabric.measuring.store import ResultStore, StoreWarning


def test_get_or_compute_computes_once(tmp_path):
    store = ResultStore(tmp_path)
    calls = []

    def compute():
        calls.append(1)
        return {"tokens_per_s": 123.0}

    assert store.get_or_compute("k", compute) == ({"tokens_per_s": 123.0}, True)
    assert store.get_or_compute("k", compute) == ({"tokens_per_s": 123.0}, False)
    assert len(calls) == 1
    # A second store on the same directory (another worker) sees the cached record too.
    assert ResultStore(tmp_path).get_or_compute("k", compute) == ({"tokens_per_s": 123.0}, False)
    assert len(calls) == 1


def test_different_keys_are_computed_separately(tmp_path):
    store = ResultStore(tmp_path)
    store.get_or_compute("a", lambda: {"v": 1})
    store.get_or_compute("b", lambda: {"v": 2})
    assert store.all() == {"a": {"v": 1}, "b": {"v": 2}}
    assert store.get("a") == {"v": 1} and store.get("missing") is None


def test_records_written_by_compute_itself_are_kept(tmp_path):
    """The store re-reads after computing: a put() made while computing is not overwritten."""
    store = ResultStore(tmp_path)

    def compute():
        # Same process, so the lock is re-entrant; stands for anything written meanwhile.
        store.put("written-meanwhile", {"v": 0})
        return {"v": 1}

    store.get_or_compute("k", compute)
    assert set(store.all()) == {"k", "written-meanwhile"}


def test_an_exception_in_compute_stores_nothing_and_releases_the_lock(tmp_path):
    store = ResultStore(tmp_path)

    def launch_that_crashes():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.get_or_compute("k", launch_that_crashes)
    assert store.all() == {}
    assert store.get_or_compute("k", lambda: {"v": 1}) == ({"v": 1}, True)


def test_file_is_json_object_on_disk(tmp_path):
    store = ResultStore(tmp_path)
    store.put("k", {"v": 1})
    assert json.loads(store.path.read_text()) == {"k": {"v": 1}}
    assert not list(tmp_path.glob("*.tmp")), "temporary files must be renamed into place"


def test_foreign_file_is_refused(tmp_path):
    (tmp_path / "measurements.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match="not a pytest-fabric results file"):
        ResultStore(tmp_path).all()


@pytest.mark.parametrize("text", ['{"k": {"v": 1}, "trunc', "\x00\x00\x00", "{]"], ids=["truncated", "zeros", "junk"])
def test_an_unreadable_store_is_set_aside_and_the_session_goes_on(tmp_path, text):
    (tmp_path / "measurements.json").write_text(text)
    store = ResultStore(tmp_path)
    with pytest.warns(StoreWarning, match="was not valid JSON .* moved to .*measurements.json.corrupt-"):
        assert store.get_or_compute("k", lambda: {"v": 2}) == ({"v": 2}, True)
    (aside,) = tmp_path.glob("measurements.json.corrupt-*")
    assert aside.read_text() == text, "the unreadable file is kept as it was, for a person to read"
    store.put("k2", {"v": 3})
    assert store.all() == {"k": {"v": 2}, "k2": {"v": 3}}


# -- several processes at once (xdist workers) ---------------------------------------------------

def _put_many(directory: str, worker: int, count: int) -> None:
    store = ResultStore(Path(directory))
    for i in range(count):
        store.put(f"w{worker}-{i}", {"worker": worker, "i": i})


def _compute_shared(directory: str, worker: int, keys: list[str]) -> None:
    store = ResultStore(Path(directory))
    log = Path(directory) / "computed.log"

    def compute(key: str):
        with open(log, "a") as f:  # under the store's lock: one writer at a time
            f.write(f"{key} {worker}\n")
        return {"key": key, "by": worker}

    for key in keys:
        store.get_or_compute(key, lambda key=key: compute(key))


def _run_processes(target, args_per_process, timeout: float = 60) -> None:
    ctx = multiprocessing.get_context("spawn")  # like xdist workers: nothing shared but the files
    procs = [ctx.Process(target=target, args=args) for args in args_per_process]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_concurrent_writers_lose_nothing(tmp_path):
    workers, per_worker = 4, 40
    _run_processes(_put_many, [(str(tmp_path), w, per_worker) for w in range(workers)])
    data = ResultStore(tmp_path).all()
    assert len(data) == workers * per_worker
    assert data["w3-39"] == {"worker": 3, "i": 39}


def test_concurrent_get_or_compute_computes_each_key_once(tmp_path):
    keys = [f"case-{i}" for i in range(10)]
    # Every process wants every key, in different orders.
    orders = [keys, keys[::-1], keys[3:] + keys[:3], keys[7:] + keys[:7]]
    _run_processes(_compute_shared, [(str(tmp_path), w, order) for w, order in enumerate(orders)])
    computed = [line.split()[0] for line in (tmp_path / "computed.log").read_text().splitlines()]
    assert sorted(computed) == sorted(keys), "each key must be computed by exactly one process"
    data = ResultStore(tmp_path).all()
    assert set(data) == set(keys)


# -- the hammer: thousands of writes from many processes ------------------------------------------

HAMMER_WORKERS, HAMMER_OPS, HAMMER_SHARED = 8, 300, 40


def _hammer_record(key: str) -> dict:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return {"key": key, "digest": digest, "value": int(digest[:6], 16) / 7, "text": f"{key}\n\"\u00e9\u2603"}


def _hammer(directory: str, worker: int) -> None:
    """Per worker: puts of its own keys, get_or_compute of its own keys, and of keys every worker
    wants (computed once, by whoever gets the lock first), interleaved, with reads in between."""
    store = ResultStore(Path(directory))
    log = Path(directory) / "computed.log"

    def compute(key: str) -> dict:
        with open(log, "a") as f:
            f.write(f"{key}\n")
        return _hammer_record(key)

    for i in range(HAMMER_OPS):
        kind = i % 4
        if kind in (0, 1):
            key = f"w{worker}-put-{i}"
            store.put(key, _hammer_record(key))
        elif kind == 2:
            key = f"w{worker}-own-{i}"
            record, computed = store.get_or_compute(key, lambda key=key: compute(key))
            assert computed and record == _hammer_record(key)
        else:
            key = f"shared-{(i * 7 + worker) % HAMMER_SHARED}"
            record, _ = store.get_or_compute(key, lambda key=key: compute(key))
            assert record == _hammer_record(key)
            assert store.get(f"w{worker}-put-{i - 3}") == _hammer_record(f"w{worker}-put-{i - 3}")


def test_hammer_thousands_of_writes_from_eight_processes_lose_nothing(tmp_path):
    start = time.monotonic()
    _run_processes(_hammer, [(str(tmp_path), w) for w in range(HAMMER_WORKERS)], timeout=120)
    elapsed = time.monotonic() - start
    data = json.loads((tmp_path / "measurements.json").read_text())  # valid JSON, as a reader sees it
    expected = {f"w{w}-{kind}-{i}" for w in range(HAMMER_WORKERS) for i in range(HAMMER_OPS)
                for kind in ("put", "own") if (i % 4 in (0, 1)) == (kind == "put") and i % 4 != 3}
    expected |= {f"shared-{k}" for k in range(HAMMER_SHARED)}
    assert len(expected) == HAMMER_WORKERS * sum(1 for i in range(HAMMER_OPS) if i % 4 != 3) + HAMMER_SHARED
    missing = expected - set(data)
    assert not missing, f"{len(missing)} record(s) lost, e.g. {sorted(missing)[:5]}"
    assert set(data) == expected
    broken = [key for key, record in data.items() if record != _hammer_record(key)]
    assert not broken, f"{len(broken)} record(s) damaged, e.g. {broken[:5]}"
    computed = (tmp_path / "computed.log").read_text().split()
    assert len(computed) == len(set(computed)), "a key was computed twice"
    assert set(computed) == {k for k in expected if "-put-" not in k}
    assert not list(tmp_path.glob("*.tmp")), "temporary files must be renamed into place"
    print(f"{HAMMER_WORKERS * HAMMER_OPS} operations by {HAMMER_WORKERS} processes in {elapsed:.1f}s")


# -- a session killed before it ended: its completed launches are reused by the restart ------------

def test_a_restart_reuses_the_completed_launches_of_a_killed_session(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_FABRIC_FAULT", "")
    from pytest_fabric.measuring.store import resume_path

    resume = resume_path(tmp_path / "night.json")
    killed = ResultStore(tmp_path / "session-1", resume)
    killed.put("qwen2-tiny-n2-ib#abc", {"case": {"fabric": "ib"}, "result": {"step_s": [0.5]}})
    killed.put("qwen2-tiny-n2-eth#abc", {"case": {"fabric": "eth"}, "error": "launch failed after 3.0s"})
    killed.put("qwen2-tiny-n2-ib#abc@1", {"case": {"fabric": "ib"}, "result": {"step_s": [0.6]}})
    # Killed here (nothing ends the session): the restart, a new session directory, same --fabric-save.
    restart = ResultStore(tmp_path / "session-2", resume)
    assert restart.resume() == (2, f"reusing 2 launches saved by an earlier session in {resume}")
    assert restart.get("qwen2-tiny-n2-ib#abc@1")["result"] == {"step_s": [0.6]}
    assert restart.get("qwen2-tiny-n2-eth#abc") is None  # a failed launch is launched again
    # Killed again before measuring anything: nothing of the first session is lost.
    assert ResultStore(tmp_path / "session-3", resume).resume()[0] == 2
    restart.finished()  # the session ended on its own: nothing is left to resume
    assert not resume.exists()
    assert ResultStore(tmp_path / "session-4", resume).resume() == (0, None)


def test_a_restart_reuses_nothing_when_the_faults_or_the_file_differ(tmp_path, monkeypatch):
    from pytest_fabric.measuring.store import resume_path

    resume = resume_path(tmp_path / "night.json")
    monkeypatch.setenv("PYTEST_FABRIC_FAULT", "slow:factor=1.2")
    ResultStore(tmp_path / "s1", resume).put("k", {"case": {}, "result": {"step_s": [0.5]}})
    monkeypatch.setenv("PYTEST_FABRIC_FAULT", "")
    count, line = ResultStore(tmp_path / "s2", resume).resume()
    assert count == 0 and "its faults differ from this session's" in line
    resume.write_text('{"identity": {"pytest_fab')  # never one written by the store (atomic), but a person's
    count, line = ResultStore(tmp_path / "s3", resume).resume()
    assert count == 0 and "unreadable" in line
