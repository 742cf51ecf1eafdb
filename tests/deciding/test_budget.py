"""--night-budget's arithmetic: durations read, rounds allotted from a budget, a budget too small."""

from __future__ import annotations

import pytest

from pytest_fabric.deciding.budget import BudgetTooSmall, GateWork, allot, format_duration, parse_duration


@pytest.mark.parametrize("text, seconds", [("45m", 2700), ("1h30m", 5400), ("2700s", 2700), ("1h", 3600),
                                           ("90", 90), ("1m30s", 90), ("2.5m", 150), (" 3M ", 180)])
def test_durations_in_every_accepted_form(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "45min", "1m1h", "1h1h", "0m", "-5m", "soon", "45 minutes"])
def test_anything_else_is_refused_with_the_forms_accepted(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert "45m, 1h30m or 2700s" in str(info.value)


def test_format_duration():
    assert [format_duration(s) for s in (40, 60, 250, 3900)] == ["40 s", "1 min", "4 min 10 s", "1 h 5 min"]


def gates(n: int, round_s: float = 30.0, first: int = 2, most: int = 6) -> list[GateWork]:
    return [GateWork(f"g{i}", round_s, first, most) for i in range(n)]


def test_the_rounds_left_after_first_looks_are_split_evenly():
    # 100 s of other launches, 2 gates at 30 s a round: first looks 120 s; 400 s leaves 180 s = 6 rounds.
    assert allot(gates(2), 100.0, 400.0) == [5, 5]
    # One round fewer: the first gate in order takes the odd round.
    assert allot(gates(2), 100.0, 370.0) == [5, 4]


def test_never_above_max_repeats_nor_below_the_first_look():
    assert allot(gates(2), 0.0, 10_000.0) == [6, 6]
    assert allot(gates(2), 100.0, 220.0) == [2, 2]  # exactly the first looks


def test_a_cheap_gate_takes_the_rounds_a_dear_one_cannot_fit():
    work = [GateWork("dear", 100.0, 2, 6), GateWork("cheap", 10.0, 2, 6)]
    # first looks 220 s; 60 s left: no round of the dear gate fits, four of the cheap one do.
    assert allot(work, 0.0, 280.0) == [2, 6]


def test_a_budget_too_small_for_the_first_looks_says_what_fits():
    with pytest.raises(BudgetTooSmall) as info:
        allot(gates(2), 100.0, 200.0)
    message = str(info.value)
    assert "does not hold the first looks" in message
    assert "need ~3 min 40 s" in message  # 100 + 2 x 2 x 30
    assert "--night-budget 5m or more" in message  # 220 s x 1.1, whole minutes up


def test_a_night_already_over_its_budget_still_gives_first_looks():
    assert allot(gates(3), 100.0, -50.0, strict=False) == [2, 2, 2]


def test_no_gates_fit_whatever_the_budget():
    assert allot([], 50.0, 100.0) == []
    with pytest.raises(BudgetTooSmall):
        allot([], 150.0, 100.0)
