"""Rank 0's launch marks (workload/marks.py)."""

from __future__ import annotations

import json
import time

import pytest

from pytest_fabric.workload import marks


@pytest.fixture(autouse=True)
def fresh_marks(monkeypatch):
    monkeypatch.setattr(marks, "_marks", {})
    monkeypatch.setattr(marks, "_where", [])
    monkeypatch.setattr(marks, "_measured", [])


def test_rank_0_writes_its_marks_in_order_with_the_process_start_before_them(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    marks.mark("entry")
    marks.begin(str(tmp_path))
    marks.mark("init")
    marks.write()
    written = json.loads((tmp_path / marks.MARKS_FILE).read_text())
    assert list(written) == ["process_start", "entry", "init", "exit"]
    assert written["process_start"] <= written["entry"] <= written["init"] <= written["exit"] <= time.time()


def test_a_programs_timed_windows_are_written_as_their_sum(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    marks.begin(str(tmp_path))
    marks.measured(1.25)
    marks.measured(0.5)
    marks.write()
    written = json.loads((tmp_path / marks.MARKS_FILE).read_text())
    assert written[marks.MEASURED] == 1.75
    assert list(written)[-1] == marks.MEASURED  # after the points in time, which stay in order


def test_other_ranks_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    marks.begin(str(tmp_path))
    marks.write()
    assert not (tmp_path / marks.MARKS_FILE).exists()


def test_an_unknown_mark_is_refused():
    with pytest.raises(ValueError, match="unknown launch mark 'warmup'"):
        marks.mark("warmup")
