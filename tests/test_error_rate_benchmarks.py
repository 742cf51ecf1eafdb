"""The benchmarks that state the gates' error rates. The resampling benchmark's replayed nights
(benchmarks/nightly_resample.py, replay_plugin.py): a night drawn from a pool measured in rounds keeps
every round whole. The power table (benchmarks/gate_power.py) runs the plugin's own gate on
simulated nights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
nightly_resample = pytest.importorskip("nightly_resample")
replay_plugin = pytest.importorskip("replay_plugin")
gate_power = pytest.importorskip("gate_power")

IB, IB2, IB5 = "m-n2-ib#a", "m-n2-ib2#b", "m-n2-ib5#c"


def _pool(rounds: int) -> dict[str, dict]:
    """Three configurations, ``rounds`` rounds."""
    records = {}
    for r in range(rounds):
        at = f"@{r}" if r else ""
        records[IB + at] = {"tag": f"ib{r}"}
        records[IB2 + at] = {"tag": f"ib2-{r}"}
        records[IB5 + at] = {"tag": f"ib5-{r}"}
    return records


def test_a_night_takes_whole_rounds_in_its_order():
    store = nightly_resample.night_store(_pool(5), [0, 3, 1, 4])
    assert store[IB]["tag"] == "ib0" and store[IB + "@1"]["tag"] == "ib3"
    assert store[IB5 + "@1"]["tag"] == "ib5-3" and store[IB2 + "@2"]["tag"] == "ib2-1"
    assert not any(launch.endswith("@4") for launch in store)  # round 2 was not drawn
    assert len(store) == 4 * 3


def test_each_round_has_one_launch_of_each_configuration_in_round_order():
    by_key = nightly_resample.round_launches(_pool(12))
    assert [r["tag"] for r in by_key[IB]] == [f"ib{r}" for r in range(12)]  # round 10 after round 9
    assert set(by_key) == {IB, IB2, IB5}


def _power_rows(out: str) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """The power table's rows: (round SD, m, prior) -> the five rates' (rate, Wilson upper bound)
    (A/A pass, A/A fail, at-threshold pass, x1.10 fail, stall fail), in fractions."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0].endswith("%") and cells[1].isdigit():
            rates = []
            for cell in cells[3:8]:
                point, bounds = cell.split(" [")
                rates.append((float(point.rstrip("%")) / 100, float(bounds.split(", ")[1].rstrip("%]")) / 100))
            rows[(cells[0], cells[1], cells[2])] = rates
    return rows


def test_gate_power_runs_the_plugins_gate_on_every_row_and_checks_the_targets(capsys):
    """--quick: every round SD x m x prior row on 40 simulated nights a cell, with disturbances; the
    plugin's own run_rounds and SequentialGate decide. Only what no noise of 40 nights can flip."""
    assert gate_power.main(["--quick", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    rows = _power_rows(out)
    sds, families = ("0.5%", "1.0%", "2.0%", "4.0%", "8.0%"), ("1", "7")
    assert set(rows) == {(sd, m, prior) for sd in sds for m in families for prior in gate_power.PRIORS}
    # A/A: the gate almost never fails a candidate that is the reference itself (about 0.1% expected).
    aa_fails = sum(round(r[1][0] * 40) for r in rows.values())
    assert aa_fails <= 16  # of 1600 nights
    # At 0.5-1% round SD with the noise learned right, the A/A passes and x1.10 and the stall fail
    # nearly always (100% expected).
    for sd in ("0.5%", "1.0%"):
        for m in families:
            aa_pass, _, _, slow_fail, stall_fail = (p for p, _ in rows[(sd, m, "learned")])
            assert aa_pass >= 0.85 and slow_fail >= 0.85 and stall_fail >= 0.85, (sd, m)
    # At the threshold the gate passes about 5% of the nights (a prior learned right or none).
    right = [r[2][0] for (sd, m, prior), r in rows.items() if prior in ("learned", "none")]
    assert sum(right) / len(right) <= 0.15
    # At 8% a 5% gate cannot tell a 10% slowdown in 6 rounds: x1.10 fails far less often than at 0.5%.
    assert rows[("8.0%", "7", "learned")][3][0] < 0.8
    # Every target has its check line under the table.
    for target in ("at-threshold pass <= 5%", "A/A false fail <= 1% per gate", "A/A pass >= 95%",
                   "x1.10 fail >= 95%"):
        assert any(line.startswith(("# PASS", "# MISS")) and target in line for line in out.splitlines()), target
    assert "# 40 nights per cell x 160 cells in" in out


def test_gate_power_one_round_without_a_learned_noise_decides_no_10_percent_effect(capsys):
    """One round per side (--repeats 1 --max-repeats 1) and nothing learned: the look is judged against
    the stated noise bound (15% per round), so neither a 10% slowdown nor a candidate at the threshold
    decides; a noise learned from 3 nights decides x1.10 at a 1% round SD."""
    assert gate_power.main(["--quick", "--round-sd", "0.01", "--gates", "7", "--repeats", "1", "--max-repeats", "1",
                            "--disturbed", "0"]) == 0
    rows = _power_rows(capsys.readouterr().out)
    none, learned = rows[("1.0%", "7", "none")], rows[("1.0%", "7", "learned")]
    assert none[2][0] == 0 and none[3][0] == 0 and none[1][0] == 0
    assert learned[3][0] >= 0.85


def test_gate_power_is_the_same_however_its_cells_are_spread_over_processes(capsys):
    argv = ["--quick", "--round-sd", "0.02", "--gates", "7", "--nights", "20"]
    assert gate_power.main([*argv, "--jobs", "1"]) == 0
    one = _power_rows(capsys.readouterr().out)
    assert gate_power.main([*argv, "--jobs", "2"]) == 0
    assert _power_rows(capsys.readouterr().out) == one and len(one) == len(gate_power.PRIORS)


def test_gate_power_refuses_bad_input_with_a_usage_line(capsys):
    with pytest.raises(SystemExit) as exc:
        gate_power.main(["--round-sd", "two percent"])
    assert exc.value.code == 2 and "--round-sd" in capsys.readouterr().err


def test_a_launch_measured_again_for_a_later_gate_moves_with_its_round_and_pairs_with_that_gate():
    """A round's reference launched again next to a later gate's candidate (``+partners``): a
    replayed night keeps it in its round, the round's own launch stays the configuration's launch
    of the round, and the pool's round ratios pair the later gate's candidate with it."""
    from helpers import train_record

    from pytest_fabric import Case

    ib, ib2 = "qwen2-tiny-n2-ib#a", "qwen2-tiny-n2-ib2#b"
    pool = {}
    for r in range(4):
        at = f"@{r}" if r else ""
        pool[ib + at] = train_record(Case("qwen2-tiny", 2, "ib"), 1000.0 + r)
        pool[ib + at + "+qwen2-tiny-n2-ib2"] = train_record(Case("qwen2-tiny", 2, "ib"), 900.0 + r)
        pool[ib2 + at] = train_record(Case("qwen2-tiny", 2, "ib2"), 990.0)
    store = nightly_resample.night_store(pool, [0, 3, 1])
    assert store[ib + "@1+qwen2-tiny-n2-ib2"] is pool[ib + "@3+qwen2-tiny-n2-ib2"]
    assert len(store) == 3 * 3
    assert [r is pool[ib + (f"@{k}" if k else "")] for k, r in enumerate(nightly_resample.round_launches(pool)[ib])] == [
        True] * 4
    ratios = nightly_resample.round_pairs(pool)[("qwen2-tiny-n2-ib2", "qwen2-tiny-n2-ib")]
    assert ratios == pytest.approx([990.0 / (900.0 + k) for k in range(4)], rel=1e-6)
