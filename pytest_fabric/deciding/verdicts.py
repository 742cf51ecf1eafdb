"""One outcome word per test, the same in every place a team looks: terminal, JUnit, saved night,
report, job summary and metrics.

pytest has six outcomes (passed, failed, error, skipped, xfailed, xpassed) and dashboards map
them differently: Codecov counts an xfail as a pass, GitLab shows it among ordinary skips. A gate
has four: ``pass``, ``fail``, ``inconclusive`` (its interval still straddles the threshold after
the launch budget) and ``error`` (it could not be measured: a launch failed, setup broke). A test
that never ran a gate is ``skipped``. This module decides the word from a test's report and the
gates it decided; every renderer reads the word instead of pytest's outcome.

Plain Python on duck-typed reports: no pytest import, so scripts can use it too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from .gates import GateOutcome
from .contrasts import MIN_LEARNED_NIGHTS, MIN_ROUNDS, QUICK_LOOK_ROUND_SD, Verdict

PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED = "pass", "fail", "inconclusive", "error", "skipped"
OUTCOMES = (PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED)
# How an inconclusive comparison's JUnit <skipped> message starts: no parser counts it as a pass.
INCONCLUSIVE_PREFIX = "INCONCLUSIVE:"


def outcome_of(report: Any, gates: Sequence[GateOutcome] = (), errored: bool = False) -> str:
    """The word for one phase's report (setup, call or teardown) of a test.

    ``gates``: the comparisons the test decided; ``errored``: a measurement it needed failed.
    A failure in setup or teardown, or of a measurement, is an ``error``; a failure of the test
    body is ``fail`` unless its only gates were inconclusive (``--inconclusive fail``).
    """
    verdicts = {g.verdict for g in gates}
    if report.when != "call":
        if report.failed:
            return ERROR
        return SKIPPED if report.skipped else PASS
    if report.failed:
        if Verdict.FAIL in verdicts:
            return FAIL
        if errored:
            return ERROR
        return INCONCLUSIVE if Verdict.INCONCLUSIVE in verdicts else FAIL
    if Verdict.INCONCLUSIVE in verdicts:  # an xfail (--inconclusive xfail) or a warning (warn)
        return INCONCLUSIVE
    return SKIPPED if report.skipped else PASS  # an xfail that is no gate's is no verdict either


def verdict_line(g: GateOutcome) -> str:
    """A gate's verdict for its testcase's output (``GateOutcome.render("testcase")``)."""
    return g.render("testcase")


def headline(gates: Sequence[GateOutcome]) -> str:
    """One short line per test: each gate's ratio, interval and threshold (the JUnit message)."""
    return "; ".join(g.render("headline") for g in gates)


def counts(words: Iterable[str]) -> dict[str, int]:
    """Every outcome word with its count (zeros included, so a dashboard's series never vanish)."""
    found = Counter(words)
    return {word: found.get(word, 0) for word in OUTCOMES}


def undecided_night(gate_outcomes: Sequence[str], comparisons_without_fabrics: int, note: str | None,
                    one_launch: bool = False) -> str | None:
    """Why a night decided nothing, or None when it did.

    A night decides nothing when every gate it ran was inconclusive, or when comparisons were
    skipped because the run had no distinct fabrics (``auto`` fell back to local processes).
    ``one_launch``: the night allowed fewer than ``contrasts.MIN_ROUNDS`` rounds (--max-repeats), which
    without a learned noise decide only effects beyond the noise bound (``contrasts.bound_prior``).
    """
    if comparisons_without_fabrics:
        why = note or "the cluster runs every fabric over the same links"
        return (f"{comparisons_without_fabrics} fabric comparison(s) skipped: {why}; run as root (the emulated "
                f"cluster needs network namespaces) or on a real cluster")
    if gate_outcomes and all(o == INCONCLUSIVE for o in gate_outcomes) and one_launch:
        return (f"all {len(gate_outcomes)} gate(s) inconclusive: fewer than {MIN_ROUNDS} rounds (--max-repeats) decide "
                f"only effects beyond the noise bound ({QUICK_LOOK_ROUND_SD:.0%} per round) unless the noise was learned "
                f"from {MIN_LEARNED_NIGHTS} nights of the configurations (pytest-fabric baseline, --fabric-baseline); "
                f"or raise --max-repeats to {MIN_ROUNDS} or more")
    if gate_outcomes and all(o == INCONCLUSIVE for o in gate_outcomes):
        return (f"all {len(gate_outcomes)} gate(s) inconclusive: raise --max-repeats, or lower the launch noise "
                f"(a quieter machine, a --fabric-baseline that learned it)")
    return None
