"""The flight recorder's dumps summarised (cluster/flight.py), on real dumps recorded with torch 2.13 gloo."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

from pytest_fabric.cluster import flight

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "flight" / "gloo-2ranks-rank1-hung"


def run_dir_with(tmp_path: Path, *names: str) -> Path:
    (tmp_path / "flight").mkdir()
    for name in names:
        shutil.copy(RECORDED / name, tmp_path / "flight" / name)
    return tmp_path


def test_the_rank_behind_the_others_leads_the_summary(tmp_path):
    lines = flight.report(run_dir_with(tmp_path, "rank0.json", "rank1.json"))
    assert lines[0].startswith("flight recorder (2 ranks; ")
    # Rank 1 never entered collective #4: its records stop at #3 (gloo: every entry stays scheduled).
    assert "  rank 1: last recorded #3 gloo:all_reduce [256] -> [256] (scheduled)" in lines
    assert "  rank 0: last recorded #4 gloo:all_gather [256] -> [2, 256] (scheduled)" in lines
    assert "last completed" not in "\n".join(lines)


def test_the_pickled_dump_reads_as_the_json_one(tmp_path):
    run_dir = run_dir_with(tmp_path, "fr_trace_rank_0", "fr_trace_rank_1")
    for rank in (0, 1):
        (run_dir / "flight" / f"nccl_trace_rank_{rank}").write_bytes((RECORDED / f"fr_trace_rank_{rank}").read_bytes())
    flights, problems = flight.read(run_dir)
    assert problems == [] and [f.source for f in flights] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert [f.last["collective_seq_id"] for f in flights] == [4, 3]


def test_completed_entries_are_named_where_the_backend_tracks_them(tmp_path):
    dump = pickle.loads((RECORDED / "fr_trace_rank_0").read_bytes())
    for entry in dump["entries"][:-1]:
        entry["state"] = "completed"  # as NCCL's watchdog marks them
    dump["entries"][-1]["state"] = "started"
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump))
    (line,) = flight.report(tmp_path)[1:]
    assert line == ("  rank 0: last recorded #4 gloo:all_gather [256] -> [2, 256] (started); "
                    "last completed #3 gloo:all_reduce [256] -> [256] (completed)")


def test_a_damaged_or_foreign_dump_is_named_not_fatal(tmp_path):
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "rank0.json").write_bytes(b"\x80\x04garbage")
    (tmp_path / "flight" / "nccl_trace_rank_1").write_bytes(pickle.dumps(Path("/etc")))  # names a class
    lines = flight.report(tmp_path)
    assert lines[0].startswith("flight recorder (0 ranks")
    assert sum("unreadable: " in line for line in lines) == 2, lines
    assert flight.report(tmp_path / "nothing") == []
