"""Paired rounds (``deciding/rounds.py``) on simulated launches: re-runs of disturbed rounds, and the
cap a night's budget puts on the rounds launched, re-runs included."""

from __future__ import annotations

import math

from pytest_fabric.deciding.contrasts import Verdict
from pytest_fabric.deciding.rounds import run_rounds
from pytest_fabric.deciding.sequential import SequentialGate


def night(disturbed: set[tuple[int, int]]):
    """Launches of two equal sides, each 1% above or below by turns: (log value, variance, why disturbed)."""
    launched: list[tuple[int, int]] = []

    def launch(side: int, number: int) -> tuple[float, float, str]:
        launched.append((side, number))
        return (math.log(1000.0 * (1.01 if (side + number) % 2 else 0.99)), 1e-6,
                "steps disturbed" if (side, number) in disturbed else "")
    return launch, launched


def rounds(disturbed, start=2, budget=3, reruns=2, launch_cap=None):
    launch, launched = night(disturbed)
    # Held within 0.01%: equal sides never pass it, and a 2% spread never fails it, so the gate runs on.
    gate = SequentialGate(0.9999, ">=", start=start, budget=budget)
    result = run_rounds(launch, 2, gate, signs=(-1.0, +1.0), sample=lambda m: (m[0], m[1]), disturbed=lambda m: m[2],
                        reruns=reruns, launch_cap=launch_cap)
    return result, launched


def test_without_a_cap_disturbed_rounds_are_run_again_beyond_the_budget_of_counted_rounds():
    result, launched = rounds({(1, 0), (1, 1)})
    assert result.look.verdict is Verdict.INCONCLUSIVE
    assert len(result.runs[0]) == 3 and result.launched == 5 and len(result.reruns) == 2
    assert len(launched) == 2 * 5


def test_a_cap_counts_reruns_as_rounds_launched_and_keeps_room_for_the_first_look():
    # Capped at 3 rounds launched: the first disturbed round is run again (the first look still fits),
    # the second counts as it is, and the gate stops after its first look, at 3 rounds launched.
    result, launched = rounds({(1, 0), (1, 1)}, launch_cap=3)
    assert result.launched == 3 and len(launched) == 2 * 3
    assert len(result.reruns) == 1 and len(result.kept) == 1 and len(result.runs[0]) == 2
    assert result.look is not None and result.look.verdict is Verdict.INCONCLUSIVE


def test_a_cap_never_skips_the_first_look():
    # Every round disturbed, capped below what a re-run would need: no re-run, and the first look is had.
    result, _ = rounds({(1, n) for n in range(10)}, start=2, budget=2, launch_cap=2)
    assert result.launched == 2 and not result.reruns and len(result.kept) == 2
    assert result.look.launches == 2


def test_a_cap_of_rounds_not_disturbed_stops_where_the_budget_does():
    capped, _ = rounds(set(), budget=4, launch_cap=4)
    free, _ = rounds(set(), budget=4)
    assert capped.launched == free.launched == 4
