"""Files written whole or not at all."""

from __future__ import annotations

import pytest

from pytest_fabric.core.atomic import replacing, write_text


def test_write_text_creates_the_directory_and_replaces_the_file(tmp_path):
    path = tmp_path / "a" / "b" / "night.json"
    write_text(path, "first")
    write_text(path, "second \u00e9")
    assert path.read_text(encoding="utf-8") == "second \u00e9"
    assert sorted(p.name for p in path.parent.iterdir()) == ["night.json"]  # no temporary file left


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "night.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            tmp.write_text("half")
            assert tmp.parent == path.parent and tmp != path
            raise RuntimeError("disk went away")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["night.json"]


def test_errors_policy_for_text_that_cannot_be_encoded(tmp_path):
    path = tmp_path / "out.txt"
    write_text(path, "a\udcff b", errors="replace")  # a lone surrogate, e.g. from a rank's raw output
    assert path.read_text(encoding="utf-8") == "a? b"
