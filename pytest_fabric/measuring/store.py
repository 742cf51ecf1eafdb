"""Results shared by every pytest process of one session: a JSON file guarded by a file lock.

Under pytest-xdist each worker is a separate process; the first worker that needs a configuration
measures it while holding the lock and the others read the result. The lock also serialises
launches: two jobs on the same machines at once would measure each other, not the fabric.
Records are stored with secrets masked (``redact``): the store is shown, saved and reported.
Where the disk refuses a write (full, read-only), the record stays in this process's memory and is
reported from there; the lock is skipped where it cannot be created (a read-only disk changes for nobody).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..core.atomic import write_text
from ..core.redact import redact_data
from ..core.storage import is_storage_error, storage_problem


class StoreWarning(UserWarning):
    """The session's store was unreadable and has been set aside."""


class ResultStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "measurements.json"
        self._lock = FileLock(str(directory / "measurements.lock"))
        # Records this process could not write (full or read-only disk): kept here, served with the
        # file's, and written with the next write that succeeds.
        self._unsaved: dict[str, Any] = {}
        self.problem: str | None = None  # why they are unsaved (storage.storage_problem), once known

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The store's lock, where the disk lets it be taken: on a read-only (or inode-full) disk no
        process can change the file either, so it is read without one."""
        held = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
            held = True
        except OSError as exc:
            if not is_storage_error(exc):
                raise
        try:
            yield
        finally:
            if held:
                self._lock.release()

    def holds_records(self) -> bool:
        return self.path.exists() or bool(self._unsaved)

    def _read(self) -> dict[str, Any]:
        return {**self._read_file(), **self._unsaved}

    def _read_file(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        # Writes are atomic (os.replace), so a partial file means someone else wrote it.
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            return self._set_aside(exc)
        if not isinstance(data, dict):
            raise ValueError(f"{self.path} is not a pytest-fabric results file (expected a JSON object)")
        return data

    def _set_aside(self, exc: ValueError) -> dict[str, Any]:
        """An unreadable store (truncated, overwritten) is kept for a person to read, under another
        name, and the session goes on with an empty one: what is measured from now on is kept."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{os.getpid()}-{time.time_ns()}")
        os.replace(self.path, aside)
        warnings.warn(StoreWarning(f"{self.path} was not valid JSON ({exc}); moved to {aside}, and the "
                                   f"configurations in it will be measured again"), stacklevel=3)
        return {}

    def _write(self, data: dict[str, Any], key: str) -> None:
        """``data`` (the file's records and ``key``'s new one) to the file; where the disk refuses, the
        new record is kept in memory, and a warning says once what to do."""
        try:
            # Compact: json.dumps(indent=...) falls back to the pure-Python encoder, ~10x slower, and every
            # write rewrites every record (8 processes x 500 records took minutes; tests/test_store.py).
            write_text(self.path, json.dumps(data, sort_keys=True, separators=(",", ":")))
        except OSError as exc:
            if not is_storage_error(exc):
                raise
            self._unsaved[key] = data[key]
            if self.problem is None:
                self.problem = storage_problem(exc, "the measurement store", self.path)
                warnings.warn(StoreWarning(f"{self.problem}; this process keeps its results in memory"),
                              stacklevel=3)
        else:
            self._unsaved.clear()  # all of them are in the file now

    def get(self, key: str) -> dict[str, Any] | None:
        with self.locked():
            return self._read().get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        record = redact_data(record)
        with self.locked():
            data = self._read()
            data[key] = record
            self._write(data, key)

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """The record for ``key``, computing and storing it under the lock if absent.

        Returns (record, computed_here).
        """
        with self.locked():
            data = self._read()
            if key in data:
                return data[key], False
            record = redact_data(compute())
            data = self._read()
            data[key] = record
            self._write(data, key)
            return record, True

    def all(self) -> dict[str, Any]:
        with self.locked():
            return self._read()
