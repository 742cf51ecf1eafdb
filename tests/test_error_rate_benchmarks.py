"""The benchmarks that state the gates' error rates. The resampling benchmark's replayed nights
(benchmarks/nightly_resample.py, replay_plugin.py): a night drawn from a pool measured in rounds keeps
every round whole, matched launches included, and the replay serves a matched launch to the
comparison it was measured for and to no other. The power table (benchmarks/gate_power.py) runs
the plugin's own gate on simulated nights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
nightly_resample = pytest.importorskip("nightly_resample")
replay_plugin = pytest.importorskip("replay_plugin")
gate_power = pytest.importorskip("gate_power")

IB, IB2, IB5 = "m-n2-ib#a", "m-n2-ib2#b", "m-n2-ib5#c"
STRETCHED = {"measured_longer": "its steps stalled", "tag": "ib5"}


def _pool(rounds: int) -> dict[str, dict]:
    """Three configurations, ``rounds`` rounds; ib5 stretched from round 1 on and ib measured over
    its window too in rounds 2 and up (round 1 was planned before any stall was seen)."""
    records = {}
    for r in range(rounds):
        at = f"@{r}" if r else ""
        records[IB + at] = {"tag": f"ib{r}"}
        records[IB2 + at] = {"tag": f"ib2-{r}"}
        records[IB5 + at] = {**STRETCHED, "tag": f"ib5-{r}"} if r else {"tag": "ib5-0"}
        if r >= 2:
            records[f"{IB}@{r}~60.3s"] = {"tag": f"ib{r}~"}
    return records


def test_a_night_takes_whole_rounds_in_its_order_matched_launches_with_them():
    store = nightly_resample.night_store(_pool(5), [0, 3, 1, 4])
    assert store[IB]["tag"] == "ib0" and store[IB + "@1"]["tag"] == "ib3"
    assert store[IB + "@1~60.3s"]["tag"] == "ib3~"  # the matched launch moves with its round
    assert store[IB5 + "@1"]["tag"] == "ib5-3" and store[IB2 + "@2"]["tag"] == "ib2-1"
    assert store[IB + "@3~60.3s"]["tag"] == "ib4~"
    assert IB + "@2~60.3s" not in store  # round 1 of the pool had no matched launch
    assert not any(launch.endswith("@4") for launch in store)  # round 2 was not drawn
    assert len(store) == 4 * 3 + 2


def test_the_replay_serves_a_matched_launch_only_to_the_comparison_with_the_stretched_side():
    store = nightly_resample.night_store(_pool(4), [0, 2, 3, 1])
    assert replay_plugin.stored_match(store, IB, [IB5], 1) == 60.3
    assert replay_plugin.stored_match(store, IB, [IB2], 1) == 0.0  # the A/A gate gets ib's own launch
    assert replay_plugin.stored_match(store, IB5, [IB], 1) == 0.0  # the stretched side is its own launch
    assert replay_plugin.stored_match(store, IB, [IB5], 3) == 0.0  # pool round 1: nothing matched
    assert replay_plugin.stored_match(store, IB, [IB5], 0) == 0.0


def test_each_round_has_one_launch_of_each_configuration_its_own_where_it_measured_one():
    pool = _pool(12)
    pool[f"{IB2}@5~60.3s"] = {"tag": "ib2-5~"}  # ib2 measured only over a partner's window in round 5
    del pool[f"{IB2}@5"]
    by_key = nightly_resample.round_launches(pool)
    assert [r["tag"] for r in by_key[IB]] == [f"ib{r}" for r in range(12)]  # round 10 after round 9
    assert [r["tag"] for r in by_key[IB2]][4:7] == ["ib2-4", "ib2-5~", "ib2-6"]
    assert set(by_key) == {IB, IB2, IB5}


def test_the_power_table_decides_a_quiet_machine_and_refuses_to_guess_on_a_noisy_one(capsys):
    assert gate_power.main(["--nights", "40", "--noise", "0.01,0.08", "--seed", "3"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[0].endswith("%") and cells[4].isdigit():
            rows[(cells[0], cells[1], cells[2])] = tuple(int(c) for c in cells[4:7])
    assert len(rows) == 2 * 2 * len(gate_power.SCENARIOS)
    quiet_aa, quiet_slow = rows[("1%", "learned", "A/A")], rows[("1%", "learned", "x1.10")]
    assert quiet_aa[2] == 0 and quiet_aa[0] >= 36  # passes, never fails
    assert quiet_slow[2] >= 36 and quiet_slow[0] == 0
    # At 8% noise a 5% gate cannot tell: mostly inconclusive, still no A/A failure.
    noisy_aa = rows[("8%", "learned", "A/A")]
    assert noisy_aa[1] > noisy_aa[0] and noisy_aa[2] <= 2


def test_the_power_table_refuses_bad_input_with_a_usage_line(capsys):
    with pytest.raises(SystemExit) as exc:
        gate_power.main(["--noise", "two percent"])
    assert exc.value.code == 2 and "--noise" in capsys.readouterr().err


def test_a_launch_measured_again_for_a_later_gate_moves_with_its_round_and_pairs_with_that_gate():
    """A round's reference launched again next to a later gate's candidate (``+partners``): a
    replayed night keeps it in its round, the round's own launch stays the configuration's launch
    of the round, and the pool's round ratios pair the later gate's candidate with it."""
    from helpers import training_record

    ib, ib2 = "qwen2-tiny-n2-ib#a", "qwen2-tiny-n2-ib2#b"
    pool = {}
    for r in range(4):
        at = f"@{r}" if r else ""
        pool[ib + at] = training_record("qwen2-tiny", 2, "ib", 1000.0 + r)
        pool[ib + at + "+qwen2-tiny-n2-ib2"] = training_record("qwen2-tiny", 2, "ib", 900.0 + r)
        pool[ib2 + at] = training_record("qwen2-tiny", 2, "ib2", 990.0)
    store = nightly_resample.night_store(pool, [0, 3, 1])
    assert store[ib + "@1+qwen2-tiny-n2-ib2"] is pool[ib + "@3+qwen2-tiny-n2-ib2"]
    assert len(store) == 3 * 3
    assert [r is pool[ib + (f"@{k}" if k else "")] for k, r in enumerate(nightly_resample.round_launches(pool)[ib])] == [
        True] * 4
    ratios = [ratio for ratio, _ in nightly_resample.round_pairs(pool)[("qwen2-tiny-n2-ib2", "qwen2-tiny-n2-ib")]]
    assert ratios == pytest.approx([990.0 / (900.0 + k) for k in (1, 2, 3)], rel=1e-6)


def test_a_saved_night_is_rejudged_by_the_current_phase_rule_in_launch_order():
    """A night saved under the fastest-probe rule: a 61-step launch at the usual speed caught one
    fast reading, and the short launch after it was flagged slow; re-judged, that launch is clean
    and one run wholly at the fast level is flagged."""
    from helpers import training_record

    rejudge_phases = pytest.importorskip("rejudge_phases")

    def launch(probes, started, reference):
        record = training_record("qwen2-tiny", 2, "ib", 1000.0)
        record["result"]["step_s"] = [0.5] * len(probes)
        record["result"]["signals"] = {"probe_s": probes, "cpu_busy": [0.95] * len(probes),
                                       "probe_reference_s": reference}
        return {**record, "started": started, "ended": started + 10}

    usual = [0.00025, 0.00026, 0.00024, 0.00025]
    records = {"qwen2-tiny-n2-ib#a@2": launch(usual, 300.0, 0.00016),  # saved in store order, launched last
               "qwen2-tiny-n2-ib#a": launch(usual, 100.0, 0.00024),
               "qwen2-tiny-n2-ib#a@1": launch(usual * 15 + [0.00016], 200.0, 0.00016),
               "qwen2-tiny-n2-ib#a@3": launch([0.00017] * 4, 400.0, 0.00016)}
    rows = {key: (before, after) for key, before, after in rejudge_phases.rejudge(records)}
    assert list(rows) == ["qwen2-tiny-n2-ib#a", "qwen2-tiny-n2-ib#a@1", "qwen2-tiny-n2-ib#a@2", "qwen2-tiny-n2-ib#a@3"]
    assert "machine slow" in rows["qwen2-tiny-n2-ib#a@2"][0] and not rows["qwen2-tiny-n2-ib#a@2"][1]
    assert not rows["qwen2-tiny-n2-ib#a@3"][0] and "machine fast" in rows["qwen2-tiny-n2-ib#a@3"][1]
