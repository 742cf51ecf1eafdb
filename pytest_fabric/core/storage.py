"""Disk faults where the session writes: its results directory, --junitxml, --fabric-save.

A full disk (ENOSPC, EDQUOT, EFBIG) or a read-only one (EROFS) is not a bug of the harness and not a
failure of the fabric: the operator must free space or write elsewhere. So it is reported as one line
that says which file could not be written, why, and what to do, never as a traceback; what was
measured before stays in memory and goes to the report (terminal table, JUnit) that can still be written.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import os
import tempfile
from pathlib import Path

# Errors that say "this disk cannot take the file", whatever the file.
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                  errno.EFBIG: "file too large for the device", errno.EROFS: "the file system is read-only"}
WHAT_TO_DO = ("free space there or make it writable, or write elsewhere (--run-dir for the launches' files, "
              "--junitxml and --fabric-save for those files)")


def is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


def storage_problem(exc: OSError, what: str, where: str | os.PathLike[str] | None = None) -> str:
    """One line: ``what`` could not be written, where (the file the error names, else ``where``), why,
    and what to do."""
    where = exc.filename if exc.filename is not None else where if where is not None else "?"
    return f"cannot write {what} ({os.fspath(where)}): {STORAGE_ERRNOS.get(exc.errno or 0, exc.strerror)}; {WHAT_TO_DO}"


def node_local_lock(directory: Path, name: str) -> Path:
    """The lock file guarding ``directory``'s ``name``, on this node's own disk (its temporary
    directory): only this node's processes take it (the controller and its xdist workers), and
    ``flock`` on shared storage is not everywhere (Lustre mounted ``localflock`` locks per node,
    ``noflock`` refuses; NFSv4 works through its server)."""
    digest = hashlib.sha1(str(Path(directory).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pytest-fabric-{getpass.getuser()}" / "locks" / f"{digest}-{name}"
