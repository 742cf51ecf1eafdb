"""How long a launch measures (stats.measure_window): a configuration's first launch twice the window,
one whose steps stalled earlier as long as those steps say its mean needs (up to ten windows).

The rule, then two real launches on the emulated cluster: the first with the `stall` fault planted
(each step stalls with p=0.3, x2; of 16 steps none stalls 3 times in 1000, and three quarters
or more almost never, so the 25% quantile stays a fast step) measures the default window; the second, of the same
configuration, measures longer, the whole window, and says why in its record; a configuration
whose first launch did not stall (eth, unless the machine is busy) measures its second as usual.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import FakeCluster, emulated_unavailable, needs, session_directory

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.measuring.store import ResultStore
from pytest_fabric.workload.config import TrainConfig

from pytest_fabric.measuring.measure import Measurer, launch_number, result_estimate
from pytest_fabric.measuring.measurement import LaunchKey
from pytest_fabric.deciding.stats import (FIRST_LAUNCH_FACTOR, STALL_DEADLINE_SHARE, STALL_MARGIN, STALL_MAX_FACTOR,
                                          STALL_TARGET_SE, Window, launch_estimate, measure_window, measuring_done)
from pytest_fabric.workload import faults
from pytest_fabric.workload.result import TrainResult

UNAVAILABLE = emulated_unavailable()


def _launch(stalls: int, steps: int = 12, step_s: float = 0.5, factor: float = 1.6):
    """A launch's value whose ``stalls`` of ``steps`` steps (spread evenly) took ``factor`` times as long."""
    every = steps // stalls if stalls else steps + 1
    return launch_estimate([step_s * (factor if stalls and i % every == every - 1 and i // every < stalls else 1.0)
                            * (1 + 0.002 * (i % 3)) for i in range(steps)])


def test_the_first_launch_measures_its_whole_longer_window_and_later_clean_ones_stop_as_usual():
    clean = _launch(0)
    assert clean.stall < STALL_MARGIN
    assert measure_window(6.0, 0, []) == Window(6.0 * FIRST_LAUNCH_FACTOR, True)
    assert measure_window(6.0, 1, [clean]) == Window(6.0, False)
    assert measure_window(6.0, 3, [clean, _launch(0, 24), clean]) == Window(6.0, False)


def test_an_earlier_stall_stretches_the_window_as_far_as_its_steps_need_measured_whole_and_says_why():
    stalled = _launch(3, 24)  # 3 of 24 steps x1.6: the mean 7.5% above the fast steps
    assert stalled.stall >= STALL_MARGIN
    need = stalled.used * stalled.step_s * (stalled.log_se / STALL_TARGET_SE) ** 2
    window = measure_window(60.0, 2, [_launch(0), stalled])
    # The stalled launch's own precision says how long its mean needs: seconds x (se / target)^2.
    assert 60.0 < need < 60.0 * STALL_MAX_FACTOR and window.seconds == pytest.approx(need) and window.whole
    assert f"{stalled.stall:.0%}" in window.why and "stall" in window.why and f"{need:.3g} s" in window.why
    # The worst-known launch decides: more stalls, noisier means, a longer window.
    assert measure_window(6.0, 2, [stalled]).seconds == pytest.approx(6.0 * STALL_MAX_FACTOR)


def test_a_machine_whose_speed_wobbles_stretches_no_window_of_its_own():
    # Every configuration's mean ~8% above its fast steps is the machine's wobble, not this one's stalls.
    wobbly = _launch(3, 24)
    assert wobbly.stall >= STALL_MARGIN
    assert measure_window(6.0, 1, [wobbly], machine_stall=wobbly.stall - 0.01) == Window(6.0, False)
    stretched = measure_window(6.0, 1, [wobbly], machine_stall=wobbly.stall - STALL_MARGIN - 0.01)
    assert stretched.whole and stretched.seconds > 6.0 and "other configurations" in stretched.why
    # Stalls beyond the machine's still stretch it.
    assert measure_window(6.0, 1, [_launch(6, 12, factor=3.0)], machine_stall=0.08).seconds > 6.0


def test_a_stretched_window_stays_within_its_caps():
    heavy = _launch(6, 12, factor=3.0)  # half of the steps x3: far beyond any cap
    assert measure_window(6.0, 1, [heavy]).seconds == pytest.approx(6.0 * STALL_MAX_FACTOR)
    assert "the most it may" in measure_window(6.0, 1, [heavy]).why
    # Half the launch deadline at most (the rest: start-up, warm-up), never less than the usual window.
    assert measure_window(6.0, 1, [heavy], deadline_s=40.0).seconds == pytest.approx(40.0 * STALL_DEADLINE_SHARE)
    assert measure_window(30.0, 1, [heavy], deadline_s=40.0).seconds == pytest.approx(30.0)
    # A mild stall whose mean is already well known needs no more than the usual window, measured whole.
    mild = launch_estimate([0.5, 0.5, 0.6] * 80)  # every third step 20% longer, 240 steps
    assert mild.stall >= STALL_MARGIN and mild.log_se < STALL_TARGET_SE
    assert measure_window(6.0, 1, [mild]) == Window(6.0, True, measure_window(6.0, 1, [mild]).why)


def test_a_fixed_step_count_stays_fixed():
    assert measure_window(0.0, 0, []) == Window(0.0, False)
    assert measure_window(0.0, 1, [_launch(6, 12, factor=3.0)]) == Window(0.0, False)


def test_no_precision_stop_when_the_whole_window_is_measured():
    steady = [0.5] * 30  # known to far better than 1% after 10 steps
    assert measuring_done(steady[:10], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.01) == "precision"
    assert measuring_done(steady[:10], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.0) == ""
    assert measuring_done(steady[:12], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.0) == "time cap"


SOURCE = """
import pytest
from pytest_fabric.core.case import Case


@pytest.mark.parametrize("fabric", ["ib", "eth"])
def test_two_launches(fabric_measure, fabric):
    for launch in (0, 1):
        fabric_measure(Case("qwen2-tiny", 2, fabric), launch)
"""


def _stalling_ib_session(pytester, monkeypatch, source: str, *args: str):
    """A pytest session of ``source`` on the emulated cluster, ib's steps stalling (p=0.3, x2: of 16
    steps none stalls 3 times in 1000): its result and its store's records."""
    needs(UNAVAILABLE)
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv(faults.ENV, "stall:fabric=ib,p=0.3,factor=2")
    pytester.makepyfile(test_generated=source)
    result = pytester.runpytest_subprocess("--models", "qwen2-tiny", "--nodes", "2", "--steps", "16",
                                           "--warmup-steps", "1", "--measure-seconds", "2", *args, timeout=600)
    return result, json.loads((session_directory(result.stdout.str()) / "measurements.json").read_text())


@pytest.mark.slow
def test_a_stalling_configuration_measures_its_next_launch_longer(pytester, monkeypatch):
    result, records = _stalling_ib_session(pytester, monkeypatch, SOURCE, "--fabrics", "ib,eth")
    result.assert_outcomes(passed=2)
    by_key = {(r["case"]["fabric"], "@1" in key): r for key, r in records.items()}
    stall = {(fabric, later): result_estimate(TrainResult.from_dict(r["result"], fabric)).stall
             for (fabric, later), r in by_key.items()}
    for fabric, other in (("ib", "eth"), ("eth", "ib")):
        first, second = by_key[(fabric, False)], by_key[(fabric, True)]
        # The machine's wobble: what the other configuration's earlier-numbered launches show (ib runs
        # first: none; eth's second launch: ib's first, the least any other shows).
        machine = 0.0 if fabric == "ib" else stall[(other, False)]
        stalled = stall[(fabric, False)] - machine >= STALL_MARGIN
        assert "measured_longer" not in first
        # The rule, on each configuration's own first launch (eth's may stall too on a busy machine).
        assert ("measured_longer" in second) == stalled, (fabric, machine, second.get("measured_longer"))
    ib0, ib1 = by_key[("ib", False)], by_key[("ib", True)]
    assert "stall" in ib1["measured_longer"]  # planted: of 16 steps at p=0.3 none stalls 3 times in 1000
    # The window the ranks were given (their config.json) is what stretched, as far as the first
    # launch's steps said the mean needs, within the cap, measured whole.
    window = {r: [json.loads((Path(x["result"]["run_dir"]) / "config.json").read_text())[k]
                  for k in ("measure_s", "step_precision")] for r, x in (("first", ib0), ("second", ib1))}
    expected = measure_window(2.0, 1, [result_estimate(TrainResult.from_dict(ib0["result"], "ib"))], 300.0)
    assert window == {"first": [2.0 * FIRST_LAUNCH_FACTOR, 0.0], "second": [pytest.approx(expected.seconds), 0.0]}
    assert 2.0 < expected.seconds <= 2.0 * STALL_MAX_FACTOR


COMPARED = """
from pytest_fabric.core.case import Case


def test_gate(fabric_compare):
    fabric_compare.within(Case("qwen2-tiny", 2, "ib2"), Case("qwen2-tiny", 2, "ib"), rel=0.9)
"""


@pytest.mark.slow
@pytest.mark.parametrize("interleave", ["off", "on"])
def test_both_sides_of_a_comparison_measure_the_window_of_the_side_that_stalls(pytester, monkeypatch, interleave):
    """ib stalls (planted), ib2 is a copy of ib that does not: in the second round ib measures
    longer, and so does ib2, as a launch of its own keyed with the window, measured whole and saying
    why, so that the gate compares means over equally long windows: one launch after the other, or
    taking turns (``&``: the round's launches interleaved)."""
    _, records = _stalling_ib_session(pytester, monkeypatch, COMPARED, "--fabrics", "ib,ib2", "-o",
                                      "fabric_define=ib2: ib", "--repeats", "2", "--max-repeats", "2",
                                      "--inconclusive", "warn", "--family-wise", "none", "--interleave", interleave)
    keys = {(r["case"]["fabric"], launch_number(key), "~" in key): key for key, r in records.items()}
    assert sorted(keys) == [("ib", 0, False), ("ib", 1, False), ("ib2", 0, False), ("ib2", 1, True)], sorted(records)
    measure_s = {k: json.loads((Path(records[key]["result"]["run_dir"]) / "config.json").read_text())["measure_s"]
                 for k, key in keys.items()}
    stretched = measure_s[("ib", 1, False)]
    assert stretched > 2.0  # the planted stalls: of 16 steps at p=0.3, none stalls 3 times in 1000
    assert measure_s[("ib2", 1, True)] == pytest.approx(stretched, abs=0.05)
    matched = LaunchKey.parse(keys[("ib2", 1, True)])
    assert (matched.number, matched.window) == (1, round(stretched, 1))
    assert all(LaunchKey.parse(k).interleaved == (interleave == "on") for k in records)
    assert "partner" in records[keys[("ib2", 1, True)]]["measured_longer"]
    assert "measured_longer" not in records[keys[("ib2", 0, False)]]  # its first launch: its own window


def test_a_store_key_names_its_launch_number_matched_window_or_not():
    assert [launch_number(k) for k in ("m-n2-ib#ab12", "m-n2-ib#ab12@3", "m-n2-ib#ab12@3~60.4s", "m-n2-ib#ab12@x")] == [
        0, 3, 3, 0]


class _StallingCluster(FakeCluster):
    """ib's steps stall (3 of 12 take x2); so does every launch measured longer than 5 s, as on a
    machine that slows under sustained load. Records each launch's window."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[tuple[str, float]] = []
        self.caps: list[tuple[float, int]] = []  # each launch's (window, step cap)

    def launch(self, request, on_tick=None):
        outcome = super().launch(request, on_tick)
        config = TrainConfig.load(request.program[request.program.index("--config") + 1])
        self.windows.append((request.fabric.name, config.measure_s))
        self.caps.append((config.measure_s, config.max_steps))
        result = json.loads(Path(config.result_path).read_text())
        stalls = request.fabric.name == "ib" or config.measure_s > 5.0
        result["step_s"] = [0.5 * (2.0 if stalls and i % 4 == 3 else 1.0) for i in range(12)]
        for name in ("steal_s", "foreign_s", "probe_s", "sm_clock_mhz", "throttle", "disturbed", "cpu_busy"):
            if result["signals"].get(name):
                result["signals"][name] = [result["signals"][name][0]] * 12
        Path(config.result_path).write_text(json.dumps(result))
        return outcome


def test_a_round_measures_both_sides_over_the_window_of_the_side_that_stalls(tmp_path):
    """Without launching: ib stalls, so from its second launch on it measures longer, and so does eth
    in the rounds that compare them (a launch of its own, keyed with the window). eth's own plan
    ignores those matched launches (a long window's steps sit above its fast steps on this stand-in,
    as on a machine that slows under load), and a launch compared with nothing keeps its own window."""
    cluster = _StallingCluster()
    m = Measurer(cluster, LaunchSettings(steps=12, warmup_steps=1, batch_size=2, seq_len=16, measure_s=2.0),
                 ResultStore(tmp_path / "store"), tmp_path / "launches")
    ib, eth = Case("qwen2-tiny", 2, "ib"), Case("qwen2-tiny", 2, "eth")
    for launch in range(3):
        for case, partner in ((ib, eth), (eth, ib)) if launch % 2 == 0 else ((eth, ib), (ib, eth)):
            m.measure(case, launch, partners=[partner])
    m.measure(eth, 3)
    stretched = m.window(ib, 1).seconds
    assert stretched > 2.0
    assert cluster.windows == [("ib", 4.0), ("eth", 4.0),  # first launches: twice the window
                               ("eth", stretched), ("ib", stretched), ("ib", stretched), ("eth", stretched),
                               ("eth", 2.0)]
    keys = sorted(m.store.all())
    assert [k.partition("#")[0] + "@" + k.partition("@")[2] for k in keys] == [
        "qwen2-tiny-n2-eth@", f"qwen2-tiny-n2-eth@1~{stretched:g}s", f"qwen2-tiny-n2-eth@2~{stretched:g}s",
        "qwen2-tiny-n2-eth@3", "qwen2-tiny-n2-ib@", "qwen2-tiny-n2-ib@1", "qwen2-tiny-n2-ib@2"]
    assert m.matched_window(eth, 3, [ib]) == stretched and m.matched_window(ib, 3, [eth]) == 0.0
    # A window, not the step cap, ends a launch: a window n times the usual one may take n times its
    # steps (a matched side with short steps would otherwise stop before its partner's window ends).
    settings = m.settings
    assert cluster.caps == [(w, max(settings.max_steps, math.ceil(settings.max_steps * w / settings.measure_s - 1e-9)))
                            for _, w in cluster.windows]
    assert cluster.caps[0] == (4.0, 2 * settings.max_steps) and cluster.caps[-1] == (2.0, settings.max_steps)
