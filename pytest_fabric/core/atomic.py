"""Files written whole or not at all.

Everything the harness writes is read by someone else while it may still be writing: an xdist
worker reads the shared result store, a dashboard reads the saved night, the harness reads a
rank's result. Each file is written beside its place and moved there in one step (``os.replace``),
so a reader sees the old file or the new one, never half of one. Standard library only: the rank
programs use it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing", "write_text"]


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; when the block ends without error it replaces
    ``path`` in one step; on an error it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def write_text(path: str | os.PathLike[str], text: str, errors: str | None = None) -> None:
    """``text`` (UTF-8) at ``path``, atomically."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8", errors=errors) as f:
            f.write(text)
