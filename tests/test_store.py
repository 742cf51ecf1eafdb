"""The results store shared by xdist workers: computes once, and concurrent writers lose nothing."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from pytest_fabric.store import ResultStore


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


def _run_processes(target, args_per_process) -> None:
    ctx = multiprocessing.get_context("spawn")  # like xdist workers: nothing shared but the files
    procs = [ctx.Process(target=target, args=args) for args in args_per_process]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
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
