"""Results shared by every pytest process of one session: a JSON file guarded by a file lock on this node.

Under pytest-xdist each worker is a separate process; the first worker that needs a configuration
measures it while holding the lock and the others read the result. The lock also serialises
launches: two jobs on the same machines at once would measure each other, not the fabric.
Records are stored with secrets masked (``redact``): the store is shown, saved and reported.
Where the disk refuses a write (full, read-only), the record stays in this process's memory and is
reported from there; the lock is skipped where it cannot be created (a read-only disk changes for nobody).

A session that saves its night (``--fabric-save NIGHT``) also keeps its completed launches in a resume
file beside it (``NIGHT.resume.json``, written atomically with every record), which the session
removes when it ends on its own. A session killed before that (Ctrl-C, SIGTERM, SIGKILL) leaves it,
and the session restarted with the same ``--fabric-save`` reuses those launches (``resume``): same
key (case, launch index, set-up), same harness version, host and injected faults; failed launches
are launched again.
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..core.version import VERSION
from ..core.atomic import write_text
from ..core.redact import redact_data
from ..core.storage import is_storage_error, node_local_lock, storage_problem

RESUME_SUFFIX = ".resume.json"


def resume_path(save: Path | str) -> Path:
    """The resume file of the night saved at ``save``."""
    return Path(f"{save}{RESUME_SUFFIX}")


def _resume_identity() -> dict[str, str]:
    """What must not have changed for a launch to be reused: the harness, the machine, the faults."""

    return {"pytest_fabric": VERSION, "host": platform.node(), "faults": os.environ.get("PYTEST_FABRIC_FAULT", "")}


def _completed(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("result"), dict)}


class StoreWarning(UserWarning):
    """The session's store was unreadable and has been set aside."""


class ResultStore:
    def __init__(self, directory: Path, resume_file: Path | None = None) -> None:
        self.directory = directory
        self.path = directory / "measurements.json"
        self.resume_file = resume_file
        self._lock = FileLock(str(node_local_lock(directory, "measurements.lock")))
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
            Path(self._lock.lock_file).parent.mkdir(parents=True, exist_ok=True)
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
            # write rewrites every record (8 processes x 500 records took minutes; tests/measuring/test_store.py).
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
            self._write_resume(data)

    def _write_resume(self, data: dict[str, Any]) -> None:
        """The completed launches to the resume file (a disk that refuses it: the store has said so)."""
        if self.resume_file is None:
            return
        try:
            write_text(self.resume_file, json.dumps({"identity": _resume_identity(), "records": _completed(data)},
                                                    sort_keys=True, separators=(",", ":")))
        except OSError as exc:
            if not is_storage_error(exc):
                raise

    def resume(self) -> tuple[int, str | None]:
        """Adopt the completed launches an earlier session left in the resume file (one killed before
        it ended); (how many, a line saying so or why none were, None when there is no such file)."""
        if self.resume_file is None or not self.resume_file.exists():
            return 0, None
        try:
            earlier = json.loads(self.resume_file.read_text())
            identity, records = earlier["identity"], _completed(earlier["records"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return 0, f"not reusing {self.resume_file}: unreadable ({exc}); every launch is measured again"
        if identity != _resume_identity():
            changed = ", ".join(k for k, v in _resume_identity().items() if identity.get(k) != v)
            return 0, (f"not reusing the launches saved by an earlier session in {self.resume_file}: its {changed} "
                       f"differ from this session's; every launch is measured again")
        with self.locked():
            data = self._read()
            new = {k: v for k, v in records.items() if k not in data}
            if new:
                data.update(new)
                self._unsaved.update(new)  # kept in memory, all of them, where the disk refuses them
                self._write(data, next(iter(new)))
        return len(new), f"reusing {len(new)} launches saved by an earlier session in {self.resume_file}"

    def finished(self) -> None:
        """The session ended on its own: its night is saved, nothing is left to resume."""
        if self.resume_file is not None:
            try:
                self.resume_file.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if not is_storage_error(exc):
                    raise

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
