"""Gates on paired rounds: verdicts, disturbed rounds launched again, the noise, and the inconclusive policy.

The launches are synthetic here (known distributions, so the right verdict is known), but each is a
real ``Measurement`` read from a typed rank result, so its value goes through
``steps.launch_estimate`` as a real launch's does; the real launch path is covered by the emulated
runs in test_plugin.py.
"""

import math
import random
import re
import warnings
from types import SimpleNamespace

import pytest
from helpers import geomean, train_measurement, train_record

from pytest_fabric.core.case import Case
from pytest_fabric.measuring.measure import LaunchSettings
from pytest_fabric.history.baselines import Baseline
from pytest_fabric.running.fixtures import CompareFixture
from pytest_fabric.running.session import NOTES_KEY, OUTCOMES_KEY, FabricSession
from pytest_fabric.deciding.contrasts import Interval, Verdict
from pytest_fabric.deciding.gates import machine_fields

CAND, REF = Case("m", 2, "eth"), Case("m", 2, "ib")


class FakeLaunches:
    """Tokens/s per case id (or per fabric) drawn from a seeded normal distribution; remembers the
    launch order. ``paired``: launch i has the same draw whatever the case (an A/A comparison);
    ``disturbed``: (case id or fabric, launch) pairs whose every step is flagged disturbed, and
    which ran at a quarter of the speed, so a gate that counted them fully would decide otherwise;
    ``lost``: the share of those steps' time their signals say other processes took (0: flags alone)."""

    def __init__(self, means, noise=0.01, seed=1, paired=False, disturbed=(), lost=0.0):
        self.means, self.noise, self.seed, self.paired, self.lost = means, noise, seed, paired, lost
        self.rng, self.disturbed, self.order, self.ids = random.Random(seed), set(disturbed), [], []
        self.made = {}  # case id -> its launches, in order
        self.partners = []  # (fabric, launch, the fabrics the round compares it with)

    def __call__(self, case, launch=0, partners=()):
        self.order.append((case.fabric, launch))
        self.partners.append((case.fabric, launch, tuple(p.fabric for p in partners)))
        self.ids.append((case.id, launch))
        rng = random.Random(f"{self.seed}-{launch}") if self.paired else self.rng
        mean = self.means.get(case.id, self.means.get(case.fabric))
        value = mean * (1 + rng.gauss(0, self.noise))
        disturbed = bool({(case.id, launch), (case.fabric, launch)} & self.disturbed)
        m = train_measurement(case.model, case.nodes, case.fabric, value / 4 if disturbed else value,
                              launch=launch, disturbed=4 if disturbed else 0, lost=self.lost)
        self.made.setdefault(case.id, []).append(m)
        return m


class StandInSession(SimpleNamespace):
    # The real session's answers, on the stand-in's options and cluster: the learned launch noise
    # (the baseline's, else none), link rates, floor and prediction.
    noise = FabricSession.noise
    link = FabricSession.link
    link_rate = FabricSession.link_rate
    node_facts = ()  # no pre-flight probe: a real cluster's floor then assumes the nominal rate
    floor = FabricSession.floor
    floor_line = FabricSession.floor_line
    predicted = FabricSession.predicted
    family = FabricSession.family
    gates = 0


def said(item) -> list[str]:
    """The verdict sentences a test's gates showed: rendered from the GateOutcomes the fixture kept."""
    return [g.render() for g in item.stash.get(OUTCOMES_KEY, [])]


def options(**kw):
    defaults = dict(repeats=3, max_repeats=6, reruns=2, inconclusive="xfail", baseline=None,
                    regression_threshold=0.10, regression_on="scaling", flops_per_rank=None, settings=LaunchSettings(),
                    floor_tolerance=0.10, family_wise="bonferroni", night_budget=None)
    return SimpleNamespace(**{**defaults, **kw})


def compare(means, noise=0.01, paired=False, disturbed=(), seed=1, lost=0.0, **kw):
    launches = FakeLaunches(means, noise, seed=seed, paired=paired, disturbed=disturbed, lost=lost)
    item = SimpleNamespace(stash={})
    # No cluster: the prediction beside each verdict says it is unavailable, and nothing fails.
    return CompareFixture(launches, StandInSession(options=options(**kw)), item), launches, item


def test_equal_fabrics_pass_on_paired_rounds_in_alternating_order():
    fixture, launches, item = compare({"ib": 1000.0, "eth": 1000.0})
    result = fixture.within(CAND, REF, rel=0.05)
    rounds = len(launches.order) // 2
    assert result.verdict is Verdict.PASS and result.interval.launches == (rounds, rounds)
    # Early looks spend little of the error allowance: equal fabrics need a few rounds, not all six.
    assert 2 < rounds < 6
    # Each launch index once per side; the reference first in rounds 1, 3, ..., the candidate in 2, 4, ...
    assert launches.order == [(f, i) for i in range(rounds) for f in (("ib", "eth") if i % 2 == 0 else ("eth", "ib"))]
    # Each launch names the configuration its round compares it with (it must run next to it).
    assert launches.partners == [(f, i, ({"ib": "eth", "eth": "ib"}[f],)) for f, i in launches.order]
    (line,), (predicted,) = said(item), item.stash[NOTES_KEY]
    assert line.startswith("pass: eth/ib = ") and f"over {rounds}+{rounds} launches" in line and ">= 0.950" in line
    # The noise the interval used, with its source and degrees of freedom, on a pass too: no baseline,
    # so tonight's rounds alone (paired t on rounds - 1 df).
    assert "launch noise " in line and f"on {rounds - 1} df: tonight's {rounds} rounds" in line
    assert predicted.startswith("predicted: unavailable (")


def test_the_values_shown_are_the_configuration_values():
    fixture, launches, _ = compare({"ib": 1000.0, "eth": 1000.0}, noise=0.02)
    result = fixture.within(CAND, REF, rel=0.2)
    eth = [m.tokens_per_s for m in launches.made["m-n2-eth"]]
    ib = [m.tokens_per_s for m in launches.made["m-n2-ib"]]
    # Each side's value is the geometric mean of its launches, and the interval's point their ratio.
    assert result.values == pytest.approx((geomean(eth), geomean(ib)), rel=1e-12)
    assert result.interval.point == pytest.approx(result.values[0] / result.values[1], rel=1e-9)


def test_clear_slowdown_fails_with_interval_and_numbers():
    fixture, _, item = compare({"ib": 1000.0, "eth": 800.0})
    with pytest.raises(pytest.fail.Exception) as info:
        fixture.within(CAND, REF, rel=0.05)
    message = str(info.value)
    assert "wholly below" in message and "eth/ib = 0.8" in message and "CI [" in message
    assert re.search(r"eth 8\d\d\.\d vs ib \d+\.\d tokens/s \[m, 2 node\(s\)\]", message)
    # A failed gate is in the machine lines too.
    (outcome,) = item.stash[OUTCOMES_KEY]
    assert outcome.verdict is Verdict.FAIL


def test_advantage_gate_direction():
    fixture, _, _ = compare({"ib": 1000.0, "eth": 500.0})
    assert fixture.ahead(REF, CAND, by=0.20).verdict is Verdict.PASS
    fixture, _, _ = compare({"ib": 1000.0, "eth": 990.0})
    with pytest.raises(pytest.fail.Exception, match="ib/eth = 1.0"):
        fixture.ahead(REF, CAND, by=0.20)


@pytest.mark.parametrize(("policy", "outcome"), [("xfail", pytest.xfail.Exception),
                                                  ("fail", pytest.fail.Exception)])
def test_inconclusive_takes_more_launches_then_follows_the_policy(policy, outcome):
    # Every round's ratio exactly at the threshold (both sides drawn alike), 5% noise: no budget can decide it.
    fixture, launches, _ = compare({"ib": 1000.0, "eth": 950.0}, inconclusive=policy, noise=0.05, paired=True)
    with pytest.raises(outcome, match="inconclusive after the launch budget"):
        fixture.within(CAND, REF, rel=0.05)
    assert len(launches.order) == 2 * 6  # extended from --repeats 3 to --max-repeats 6


def test_inconclusive_warn_passes_with_a_warning():
    from pytest_fabric.deciding.gates import InconclusiveWarning

    fixture, _, _ = compare({"ib": 1000.0, "eth": 950.0}, inconclusive="warn", noise=0.05, paired=True)
    with pytest.warns(InconclusiveWarning, match="inconclusive"):
        result = fixture.within(CAND, REF, rel=0.05)
    assert result.verdict is Verdict.INCONCLUSIVE


# -- few launches, identical launches, launches set aside --------------------------------------------


@pytest.mark.parametrize(("max_repeats", "rounds"), [(1, 1), (6, 1)])
def test_one_launch_per_side_decides_a_wide_gap(max_repeats, rounds):
    # One launch per side and no learned noise: the interval rests on the noise bound (15% per
    # round), and a 4x gap decides at the first look, whether the budget is one launch or six (the
    # first look of six spends almost none of the error allowance, and 4x is still far beyond it).
    fixture, launches, item = compare({"ib": 4000.0, "eth": 1000.0}, repeats=1, max_repeats=max_repeats)
    result = fixture.ahead(REF, CAND, by=0.20)
    assert result.verdict is Verdict.PASS and result.interval.launches == (rounds, rounds)
    assert launches.order == [("eth", 0), ("ib", 0), ("ib", 1), ("eth", 1)][:2 * rounds]
    assert 1.2 < result.interval.low < result.interval.point < result.interval.high
    line = said(item)[0]
    assert re.match(r"pass: ib/eth = (3\.9|4\.0)", line)
    assert "too few rounds for tonight's own noise (1 of 3)" in line
    assert "judged against the noise bound, 15% per round" in line
    # The JUnit testcase line names the bound as the noise's source.
    assert "on 1000 df (the noise bound, 15% per round)" in result.render("testcase")


def test_one_launch_per_side_needs_a_learned_noise_for_a_small_effect():
    # 8% apart, one launch per side: with nothing learned it will not decide, and says why...
    fixture, _, item = compare({"ib": 1000.0, "eth": 920.0}, repeats=1, max_repeats=1, noise=0.0)
    with pytest.raises(pytest.xfail.Exception, match="judged against the noise bound"):
        fixture.within(CAND, REF, rel=0.05)
    # ... while a noise learned from three nights of these configurations decides it.
    learned = {"sigma": 0.01, "df": 12.0, "nights": 3,
               "cases": {REF.id: {"sigma": 0.01, "df": 6.0, "nights": 3}, CAND.id: {"sigma": 0.01, "df": 6.0,
                                                                                     "nights": 3}}}
    fixture, _, _ = compare({"ib": 1000.0, "eth": 920.0}, repeats=1, max_repeats=1, noise=0.0,
                            baseline=Baseline("b.json", {}, {}, {}, learned))
    with pytest.raises(pytest.fail.Exception, match="wholly below"):
        fixture.within(CAND, REF, rel=0.05)


@pytest.mark.parametrize("noise", [0.0, 0.01, 0.05])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("repeats", [1, 3])
def test_identical_a_a_launches_never_fail(noise, seed, repeats):
    """The same values on both sides: the ratio is exactly 1, and no gate whose threshold is at
    most 1 may fail it; with no margin to show, ``ahead(by=0)`` cannot pass either."""
    def fixture():
        f, _, _ = compare({"ib": 1000.0, "eth": 1000.0}, noise=noise, paired=True, seed=seed, repeats=repeats,
                          inconclusive="warn")
        return f

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rel in (0.0, 0.01, 0.05, 0.2):
            result = fixture().within(CAND, REF, rel=rel)
            assert result.verdict is not Verdict.FAIL, result.interval
            assert result.interval.point == pytest.approx(1.0) and result.interval.low <= 1.0 <= result.interval.high
        result = fixture().ahead(REF, CAND, by=0.0)
        assert result.verdict is Verdict.INCONCLUSIVE and result.interval.point == pytest.approx(1.0)


def test_a_round_with_a_disturbed_launch_is_launched_again_and_not_counted():
    # eth's first launch is disturbed throughout (and a quarter as fast): its whole round runs again
    # (launch number 2), the round counted is the clean one, and the line says which ran again and why.
    fixture, launches, item = compare({"ib": 1000.0, "eth": 1000.0}, repeats=1, max_repeats=1,
                                      disturbed={("eth", 0)}, noise=0.0, inconclusive="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fixture.within(CAND, REF, rel=0.15)
    assert launches.order == [("ib", 0), ("eth", 0), ("eth", 1), ("ib", 1)]
    assert result.interval.launches == (1, 1) and result.interval.point == pytest.approx(1.0)
    assert result.values == pytest.approx((1000.0, 1000.0))
    assert result.reruns == ("re-run: m-n2-eth launch 1: 4 of 4 steps disturbed (cpu steal: 4)",)
    assert "(re-run: m-n2-eth launch 1: 4 of 4 steps disturbed (cpu steal: 4))" in said(item)[0]
    assert machine_fields(result.record())["reruns"] == "1"


def test_once_its_reruns_are_spent_a_disturbed_round_counts_and_the_line_says_so():
    # Every eth launch disturbed (a quarter as fast): two re-runs, then the rounds count as they are,
    # unweighted, and a 4x gap that the disturbance made is what the gate sees and names.
    fixture, launches, item = compare({"ib": 1000.0, "eth": 1000.0}, repeats=2, max_repeats=2, reruns=2,
                                      disturbed={("eth", i) for i in range(6)}, inconclusive="warn")
    with pytest.raises(pytest.fail.Exception) as info:
        fixture.within(CAND, REF, rel=0.05)
    assert len(launches.order) == 2 * 4  # 2 rounds counted + 2 re-run
    (outcome,) = item.stash[OUTCOMES_KEY]
    assert [r.split(":")[0] for r in outcome.reruns] == ["re-run", "re-run", "counted although disturbed (re-runs spent)",
                                                         "counted although disturbed (re-runs spent)"]
    assert "counted although disturbed (re-runs spent): m-n2-eth launch 4" in str(info.value)
    assert outcome.interval.point == pytest.approx(0.25, rel=0.05)


# -- the learned launch noise -------------------------------------------------------------------------


def test_a_learned_noise_decides_sooner_than_tonight_alone():
    learned = {"sigma": 0.01, "df": 40.0, "nights": 5,
               "cases": {REF.id: {"sigma": 0.01, "df": 20.0, "nights": 5}, CAND.id: {"sigma": 0.01, "df": 20.0,
                                                                                     "nights": 5}}}
    spent = {}
    for name, baseline in (("tonight", None), ("learned", Baseline("b.json", {}, {}, {}, learned))):
        fixture, launches, _ = compare({"ib": 1000.0, "eth": 1000.0}, baseline=baseline, repeats=2)
        assert fixture.within(CAND, REF, rel=0.05).verdict is Verdict.PASS
        spent[name] = len(launches.order)
    assert spent["learned"] < spent["tonight"]


def test_the_baseline_noise_is_the_one_used_and_none_without_a_baseline():
    # Learned per configuration: a gate takes its own configurations' noise, else the pooled one.
    learned = {"sigma": 0.03, "df": 12.0, "nights": 3,
               "cases": {REF.id: {"sigma": 0.01, "df": 6.0, "nights": 3},
                         CAND.id: {"sigma": 0.02, "df": 2.0, "nights": 1}}}
    baseline = Baseline("b.json", {}, {}, {}, learned)
    session = StandInSession(options=options(baseline=baseline))
    own = session.noise((CAND, REF))
    assert own.df == 8.0 and own.sigma == pytest.approx(math.sqrt((6 * 0.01 ** 2 + 2 * 0.02 ** 2) / 8))
    assert session.noise((REF,)).sigma == pytest.approx(0.01)
    other = session.noise((REF.with_fabric("roce").with_nodes(4),))
    assert (other.sigma, other.df) == (0.03, 12.0)
    assert session.noise().sigma == 0.03
    assert StandInSession(options=options()).noise((REF,)) is None


def test_a_gate_uses_the_noise_learned_for_its_configurations():
    learned = {"sigma": 0.2, "df": 40.0, "nights": 5, "cases": {REF.id: {"sigma": 0.01, "df": 40.0, "nights": 5}}}
    fixture, _, _ = compare({"ib": 1000.0, "eth": 1000.0}, baseline=Baseline("b.json", {}, {}, {}, learned))
    result = fixture.within(CAND, REF, rel=0.05)
    assert result.noise.sigma == pytest.approx(0.01) and "these 2 configurations" in result.noise.source
    # Learned for one of the two only: not "nights of these configurations" for one launch per side.
    assert "1 of these 2" in result.noise.source and result.noise.nights == 0
    both = {**learned, "cases": {**learned["cases"], CAND.id: {"sigma": 0.02, "df": 10.0, "nights": 3}}}
    fixture, _, _ = compare({"ib": 1000.0, "eth": 1000.0}, baseline=Baseline("b.json", {}, {}, {}, both))
    assert fixture.within(CAND, REF, rel=0.05).noise.nights == 3  # the fewer of the two


# -- against a baseline -------------------------------------------------------------------------------


def regression(tonight, past, noise=0.01, regression_on="scaling", gpus=None, by_night=False):
    """``tonight``: mean tokens/s per case id; ``past``: the baseline's values per case id (with
    ``by_night``, value i of every case is night i's, as a built baseline records them)."""
    launches = FakeLaunches(tonight, noise)
    nights = {cid: {f"night {i}": v for i, v in enumerate(values)} for cid, values in past.items()} if by_night else {}
    baseline = Baseline("b.json", past, gpus or {cid: int(cid.split("-n")[1].split("-")[0]) for cid in past},
                        {"cluster_kind": "emulated"}, None, nights)
    session = StandInSession(options=options(inconclusive="fail", baseline=baseline, regression_on=regression_on),
                             store=SimpleNamespace(all=lambda: {}))
    item = SimpleNamespace(stash={})
    return CompareFixture(launches, session, item), launches, item


def test_regression_against_baseline_is_caught():
    fixture, launches, _ = regression({"m-n2-ib": 700.0}, {"m-n2-ib": [1000.0, 1010.0, 990.0]})
    with pytest.raises(pytest.fail.Exception, match=r"tonight/baseline = 0\.70.*at most 10% below") as info:
        fixture.no_regression(REF)
    assert len(launches.order) == 3  # decided at the first look
    # No one-node measurement in the baseline: judged on raw tokens/s, and the line says why.
    assert "judged on raw tokens/s: the baseline has no one-node measurement of m" in str(info.value)


def test_same_as_baseline_passes_and_missing_case_skips():
    fixture, _, item = regression({"m-n2-ib": 1000.0}, {"m-n2-ib": [1000.0, 1010.0, 990.0]})
    assert fixture.no_regression(REF).verdict is Verdict.PASS
    assert said(item)[0].startswith("pass: tonight/baseline = 1.0")
    with pytest.raises(pytest.skip.Exception, match="no measurement of m-n2-eth"):
        fixture.no_regression(CAND)


def test_no_baseline_skips():
    fixture, _, _ = compare({"ib": 1000.0})
    with pytest.raises(pytest.skip.Exception, match="no --fabric-baseline given"):
        fixture.no_regression(REF)


PAST = {"m-n1-ib": [1000.0, 1005.0, 995.0], "m-n2-ib": [1800.0, 1790.0, 1810.0]}  # scaling efficiency 0.9


def test_a_machine_slower_all_night_is_no_regression_of_scaling():
    # Tonight everything runs at 70%: one node and two nodes alike. The fabric scales as before.
    fixture, launches, item = regression({"m-n1-ib": 700.0, "m-n2-ib": 1260.0}, PAST)
    result = fixture.no_regression(REF)
    assert result.verdict is Verdict.PASS
    assert result.interval.point == pytest.approx(1.0, abs=0.03)
    # One-node and two-node launches in paired rounds, which goes first alternating by round.
    assert launches.ids[:4] == [("m-n1-ib", 0), ("m-n2-ib", 0), ("m-n2-ib", 1), ("m-n1-ib", 1)]
    assert result.values[0] == pytest.approx(0.9, abs=0.03) and result.values[1] == pytest.approx(0.9, abs=0.01)
    line = said(item)[0]
    assert "scaling at most 10% below the baseline" in line
    assert "scaling efficiency (n2 over n1 tokens/s/GPU)" in line
    assert "raw tokens/s tonight/baseline = 0.70" in line and "tonight 12" in line and "baseline 1800.0" in line


def test_the_baselines_efficiency_is_taken_night_by_night():
    # The machine's speed moved both values of each baseline night by up to 10%, but each night's
    # efficiency is 0.9: taken night by night, the baseline's efficiency varies 0.1% between nights
    # (the nights' spread then carries its uncertainty); taken from the two cases' values apart,
    # the speed's moves count twice (about 7% each, and as much again as each side's night-to-night
    # component), which leaves that gate undecided.
    speed = [1.0, 0.9, 1.08, 0.95]
    past = {"m-n1-ib": [1000.0 * f for f in speed], "m-n2-ib": [1800.0 * f * (1 + d) for f, d in
                                                          zip(speed, (0.001, -0.001, 0.0005, 0.0))]}
    widths = {}
    for by_night in (True, False):
        fixture, _, item = regression({"m-n1-ib": 1000.0, "m-n2-ib": 1800.0}, past, by_night=by_night, noise=0.002)
        if by_night:
            outcome = fixture.no_regression(REF)
        else:
            with pytest.raises(pytest.fail.Exception, match="inconclusive"):
                fixture.no_regression(REF)
            (outcome,) = item.stash[OUTCOMES_KEY]
        assert outcome.interval.point == pytest.approx(1.0, abs=0.01)
        widths[by_night] = outcome.interval.width
        assert outcome.values[1] == pytest.approx(0.9, abs=0.001 if by_night else 0.02)
    assert widths[True] < 0.7 * widths[False]


def test_the_same_night_judged_on_raw_tokens_fails():
    fixture, launches, _ = regression({"m-n1-ib": 700.0, "m-n2-ib": 1260.0}, PAST, regression_on="tokens")
    with pytest.raises(pytest.fail.Exception, match=r"tonight/baseline = 0\.70.*tokens/s at most 10% below"):
        fixture.no_regression(REF)
    assert {cid for cid, _ in launches.ids} == {"m-n2-ib"}  # no one-node launch needed


def test_a_loss_of_scaling_fails_although_one_node_is_as_fast_as_ever():
    fixture, _, item = regression({"m-n1-ib": 1000.0, "m-n2-ib": 1260.0}, PAST)  # efficiency 0.63 vs 0.9
    with pytest.raises(pytest.fail.Exception, match=r"tonight/baseline = 0\.70.*scaling at most 10% below"):
        fixture.no_regression(REF)
    (outcome,) = item.stash[OUTCOMES_KEY]
    assert outcome.verdict is Verdict.FAIL and outcome.interval.launches == (3, 3)


def test_scaling_counts_every_gpu():
    # 2 nodes x 4 GPUs against 1 node x 4 GPUs: efficiency is per GPU on both sides.
    past = {"m-n1-ib": [4000.0] * 3, "m-n2-ib": [7200.0] * 3}
    fixture, _, _ = regression({"m-n1-ib": 4000.0, "m-n2-ib": 7200.0}, past, gpus={"m-n1-ib": 4, "m-n2-ib": 8})
    result = fixture.no_regression(REF)
    assert result.verdict is Verdict.PASS and result.interval.point == pytest.approx(1.0, abs=0.03)


# A communication-bound job, as llama-wide at n2 on the emulated link: 450 tokens/s/GPU on one
# node, 110 per GPU on two (4 x 55 ms of link time added to each 2.2 ms of compute per token).
LINK_BOUND = {"m-n1-ib": [450.0, 452.0, 448.0], "m-n2-ib": [220.0, 221.0, 219.0]}


def test_a_faster_machine_is_no_fabric_regression_of_a_communication_bound_job():
    # Tonight the one-node launch runs 12% faster (the CPU), the link-bound two-node one 1% faster.
    # Scaling efficiency reads that as a 10% loss; the time the fabric adds to a step has not moved.
    tonight = {"m-n1-ib": 504.0, "m-n2-ib": 222.2}
    by = {}
    for measure in ("fabric-time", "scaling"):
        fixture, _, item = regression(tonight, LINK_BOUND, noise=0.005, regression_on=measure, by_night=True)
        try:
            by[measure] = fixture.no_regression(REF, rel=0.05)
        except pytest.fail.Exception:
            by[measure] = item.stash[OUTCOMES_KEY][0]
    assert by["scaling"].verdict is Verdict.FAIL and by["scaling"].interval.point == pytest.approx(0.90, abs=0.02)
    assert by["fabric-time"].verdict is Verdict.PASS
    assert by["fabric-time"].interval.point == pytest.approx(1.0, abs=0.02)


def test_the_fabric_adding_time_fails_and_the_line_shows_every_measure():
    # The link got slower: 10% less at two nodes, one node as fast as ever.
    fixture, launches, item = regression({"m-n1-ib": 450.0, "m-n2-ib": 198.0}, LINK_BOUND, noise=0.005,
                                         regression_on="fabric-time", by_night=True)
    with pytest.raises(pytest.fail.Exception, match=r"tonight/baseline = 0\.9.*fabric time at most 5% below") as info:
        fixture.no_regression(REF, rel=0.05)
    (outcome,) = item.stash[OUTCOMES_KEY]
    assert outcome.verdict is Verdict.FAIL and outcome.values[1] == pytest.approx(110.0, rel=0.01)
    assert launches.ids[:2] == [("m-n1-ib", 0), ("m-n2-ib", 0)]
    line = str(info.value)
    assert "tokens/s/GPU at the baseline's one-node speed" in line
    assert "scaling efficiency tonight/baseline = 0.9" in line and "raw tokens/s tonight/baseline = 0.9" in line


def test_fabric_time_is_the_default_and_a_single_saved_night_serves_too():
    from pytest_fabric.running.option_table import DEFAULTS
    from pytest_fabric.running.options import FabricOptions

    default = DEFAULTS["regression-on"]
    assert default == "fabric-time" == FabricOptions.__dataclass_fields__["regression_on"].default
    fixture, _, item = regression({"m-n1-ib": 504.0, "m-n2-ib": 222.2}, LINK_BOUND, noise=0.005, by_night=False,
                                  regression_on=default)
    outcome = fixture.no_regression(REF, rel=0.05)
    assert outcome.verdict is Verdict.PASS and "fabric time at most 5% below" in said(item)[0]


def test_one_node_is_judged_on_tokens_per_s():
    fixture, launches, item = regression({"m-n1-ib": 1000.0}, PAST)
    assert fixture.no_regression(Case("m", 1, "ib")).verdict is Verdict.PASS
    assert "tokens/s at most 10% below the baseline" in said(item)[0]
    assert "judged on raw tokens/s" not in said(item)[0]


# -- the model's prediction next to the measurement --------------------------------------------------

class ModelLaunches:
    """Launches whose step times the analytical model itself generates (plus noise), so the
    prediction next to the comparison is known: the measured penalty, within the noise."""

    def __init__(self, model, rates_gbit, flops_per_s=2e10, noise=0.005, seed=2):
        from pytest_fabric.core.models import get_model
        from pytest_fabric.physics.step_model import JobShape, predict_step

        self.spec = get_model(model)
        self.steps = {f: predict_step(JobShape(self.spec, 2, dtype="fp32"), flops_per_s=flops_per_s, inter_gbit=g).step_s
                      for f, g in rates_gbit.items()}
        self.noise, self.rng = noise, random.Random(seed)

    def __call__(self, case, launch=0, partners=()):
        step = self.steps[case.fabric] * (1 + self.rng.gauss(0, self.noise))
        tokens = case.nodes * self.spec.batch_size * self.spec.seq_len
        return train_measurement(case.model, case.nodes, case.fabric, tokens / step, launch=launch,
                                 tokens_per_step=tokens, batch_size=self.spec.batch_size, seq_len=self.spec.seq_len)


def test_model_launches_record_the_model_shape():
    # ModelLaunches relies on train_record passing TrainResult fields through: the prediction reads them.
    record = train_record(Case("m", 2, "ib"), 100.0, batch_size=3, seq_len=7)
    assert (record["result"]["batch_size"], record["result"]["seq_len"]) == (3, 7)


def predicting(model, rates_mbit, cluster="emulated", fabric_flops=None, inconclusive="fail"):
    from pytest_fabric.core.fabrics import build_table

    table = build_table(rates=rates_mbit)
    gbit = {f: (table[f].emulated_mbit / 1000 if cluster == "emulated" else table[f].nominal_gbit)
            for f in ("ib", "eth")}
    launches = ModelLaunches(model, gbit)
    opts = options(repeats=3, max_repeats=4, inconclusive=inconclusive, flops_per_rank=fabric_flops,
                   settings=LaunchSettings(fabric_table=table))
    item = SimpleNamespace(stash={})
    session = StandInSession(options=opts, cluster=SimpleNamespace(name=cluster))
    return CompareFixture(launches, session, item), item


def test_prediction_sits_next_to_the_measurement_with_the_emulated_rates():
    fixture, item = predicting("llama-wide", {"eth": 200})  # --fabric-rate eth=200
    fixture.ahead(Case("llama-wide", 2, "ib"), Case("llama-wide", 2, "eth"), by=0.20)
    (passed,), (predicted,) = said(item), item.stash[NOTES_KEY]
    assert passed.startswith("pass: ib/eth")
    assert predicted.startswith("predicted: eth ") and "% slower than ib" in predicted
    assert "eth 0.2 vs ib 2 Gbit/s per node" in predicted and "fitted to ib's measured step" in predicted
    assert "communication-bound" in predicted and "cannot tell" not in predicted
    # The steps came from the model itself: the prediction from the ib side alone meets the eth side.
    off = float(predicted.rsplit("prediction off by ", 1)[1].split()[0])
    assert abs(off) < 2.0
    assert "measured: eth " in predicted and "% CI of the slowdown [+" in predicted


def test_failure_message_carries_the_prediction():
    fixture, item = predicting("llama-wide", {})
    with pytest.raises(pytest.fail.Exception) as info:
        fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    first, second, *floors = str(info.value).splitlines()
    assert first.startswith("interval wholly below the threshold: eth/ib")
    assert second.startswith("predicted: eth ") and "measured: eth " in second
    # Each side's step next to its physical floor, under the prediction.
    assert [f.split(" measured ")[0] for f in floors] == ["floor: eth", "floor: ib"]
    assert "over eth's 0.4 Gbit/s link" in floors[0] and floors[0].endswith(": plausible")
    assert item.stash[NOTES_KEY] == ["\n".join([second, *floors])]  # in system-out as well


def test_deeply_compute_bound_comparison_is_labelled():
    fixture, item = predicting("qwen2-tiny", {})
    fixture.within(Case("qwen2-tiny", 2, "eth"), Case("qwen2-tiny", 2, "ib"), rel=0.05)
    predicted = item.stash[NOTES_KEY][-1]
    assert "compute-bound: cannot tell the fabrics apart" in predicted


def test_off_the_emulated_cluster_the_nominal_rates_and_a_given_throughput_are_used():
    fixture, item = predicting("llama-wide", {}, cluster="slurm", fabric_flops=2e10, inconclusive="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    predicted = item.stash[NOTES_KEY][-1]
    assert "eth 100 vs ib 3200 Gbit/s per node" in predicted and "20 GFLOP/s per rank given" in predicted
    # Transfer hides behind compute, but the first all-gather and last reduce-scatter cannot: a few %.
    assert "compute-bound: only the unhidden first all-gather" in predicted


def test_equal_rates_predict_no_difference():
    fixture, item = predicting("llama-wide", {"eth": 2000})
    fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    predicted = item.stash[NOTES_KEY][-1]
    assert predicted.startswith("predicted: no difference (") and "cannot tell the fabrics apart" in predicted


def test_prediction_reads_real_measurements_as_the_store_records_them():
    from pytest_fabric.core.fabrics import build_table

    def runs(fabric, tokens_per_s):
        return [train_measurement("qwen2-tiny", 2, fabric, tokens_per_s, launch=i) for i in range(3)]

    session = StandInSession(options=options(settings=LaunchSettings(fabric_table=build_table())),
                             cluster=SimpleNamespace(name="emulated"))
    interval = Interval(low=0.93, point=1700 / 1800, high=0.96, confidence=0.95, df=8.0, sigma=0.02,
                        launches=(3, 3))
    line = FabricSession.predicted(session, Case("qwen2-tiny", 2, "eth"), Case("qwen2-tiny", 2, "ib"),
                                   runs("eth", 1700.0), runs("ib", 1800.0), interval)
    assert line.startswith("predicted: eth ") and "eth 0.4 vs ib 2 Gbit/s per node" in line, line
    assert "measured: eth 5.6% slower, 95% CI of the slowdown [+4.0%, +7.0%]" in line
