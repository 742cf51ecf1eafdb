"""Results shared by every pytest process of one session: a JSON file guarded by a file lock.

Under pytest-xdist each worker is a separate process; the first worker that needs a configuration
measures it while holding the lock and the others read the result. The lock also serialises
launches: two jobs on the same machines at once would measure each other, not the fabric.
Records are stored with secrets masked (``redact``): the store is shown, saved and reported.
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

from .atomic import write_text
from .redact import redact_data


class StoreWarning(UserWarning):
    """The session's store was unreadable and has been set aside."""


class ResultStore:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "measurements.json"
        self._lock = FileLock(str(directory / "measurements.lock"))

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            yield

    def _read(self) -> dict[str, Any]:
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

    def _write(self, data: dict[str, Any]) -> None:
        # Compact: json.dumps(indent=...) falls back to the pure-Python encoder, ~10x slower, and every
        # write rewrites every record (8 processes x 500 records took minutes; tests/test_store.py).
        write_text(self.path, json.dumps(data, sort_keys=True, separators=(",", ":")))

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._read().get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        record = redact_data(record)
        with self._lock:
            data = self._read()
            data[key] = record
            self._write(data)

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """The record for ``key``, computing and storing it under the lock if absent.

        Returns (record, computed_here).
        """
        with self._lock:
            data = self._read()
            if key in data:
                return data[key], False
            record = redact_data(compute())
            data = self._read()
            data[key] = record
            self._write(data)
            return record, True

    def all(self) -> dict[str, Any]:
        with self._lock:
            return self._read()
