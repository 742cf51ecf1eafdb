"""Gates: plain functions that turn two measurements into a pass or a failure with the numbers.

A failure is ``pytest.fail(..., pytrace=False)``: CI dashboards show the message, so the message
carries both values, the ratio and the threshold, and no traceback buries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

import pytest

from .contrasts import Interval, NoisePrior, Verdict, ahead_gate, within_gate


@runtime_checkable
class Measured(Protocol):
    """A training launch's value as the gates read it (``measurement.Measurement``): its tokens/s, its
    case (model, nodes, fabric) and GPUs. The gates sit below the measuring code and take any such."""

    @property
    def tokens_per_s(self) -> float: ...

    @property
    def gpus(self) -> int: ...

    case: Any


@dataclass(frozen=True)
class NamedValue:
    """A named number for the gates, when it is not a training Measurement's tokens/s."""

    name: str
    value: float


Value = Union[Measured, NamedValue, float, int]
# The gates' defaults, defined once: the candidate at most 5% slower (parity), the reference at least
# 20% ahead (advantage). The fixtures, the suites and the suite file's fallbacks use these names.
DEFAULT_WITHIN = 0.05
DEFAULT_AHEAD = 0.20


def busbw(m: Any, op: str = "all_reduce") -> NamedValue:
    """The busbw (Gbit/s) of ``op`` at its largest payload of a ``measurement.BandwidthMeasurement``,
    named by the fabric, for the gates."""
    return NamedValue(m.case.fabric, m.busbw_gbit(op))


def _value(x: Value) -> float:
    if isinstance(x, Measured):
        return x.tokens_per_s
    return x.value if isinstance(x, NamedValue) else float(x)


def _name(x: Value, default: str) -> str:
    if isinstance(x, Measured):
        return x.case.fabric
    return x.name if isinstance(x, NamedValue) else default


def _context(a: Value, b: Value) -> str:
    for x in (a, b):
        if isinstance(x, Measured):
            return f" [{x.case.model}, {x.case.nodes} node(s), {x.gpus} GPU(s)]"
    return ""


def ratio(candidate: Value, reference: Value) -> float:
    ref = _value(reference)
    if ref <= 0:
        raise ValueError(f"reference throughput must be positive, got {ref}")
    return _value(candidate) / ref


def assert_within(candidate: Value, reference: Value, rel: float = DEFAULT_WITHIN, unit: str = "tokens/s") -> float:
    """The candidate is at most ``rel`` slower than the reference (faster never fails).

    Returns the ratio candidate/reference.
    """
    threshold, _ = within_gate(rel)
    r = ratio(candidate, reference)
    c, ref = _name(candidate, "candidate"), _name(reference, "reference")
    if r < threshold:
        pytest.fail(
            f"{c}/{ref} = {r:.3f} < {threshold:.3f}: {c} {_value(candidate):.1f} {unit} is "
            f"{(1 - r) * 100:.1f}% below {ref} {_value(reference):.1f} {unit} "
            f"(allowed: {rel * 100:g}% slower){_context(candidate, reference)}",
            pytrace=False,
        )
    return r


def assert_at_least(measured: Value, floor: float, what: str, unit: str = "Gbit/s") -> float:
    """``measured`` reaches ``floor`` (e.g. busbw >= 85% of the link rate). Returns measured/floor."""
    value = _value(measured)
    if value < floor:
        pytest.fail(f"{_name(measured, 'measured')}: {value:.3f} {unit} < {floor:.3f} {unit} ({what}); "
                    f"ratio {value / floor:.3f}", pytrace=False)
    return value / floor


def assert_ahead(reference: Value, candidate: Value, by: float = DEFAULT_AHEAD, unit: str = "tokens/s") -> float:
    """The reference is at least ``by`` faster than the candidate (reference >= (1+by) x candidate).

    This is the gate that catches a degraded fast fabric: where the job is communication-bound the
    fast fabric must show its advantage. Returns the ratio reference/candidate.
    """
    threshold, _ = ahead_gate(by)
    r = ratio(reference, candidate)
    ref, c = _name(reference, "reference"), _name(candidate, "candidate")
    if r < threshold:
        pytest.fail(
            f"{ref}/{c} = {r:.3f} < {threshold:.3f}: {ref} {_value(reference):.1f} {unit} is only "
            f"{(r - 1) * 100:+.1f}% ahead of {c} {_value(candidate):.1f} {unit} "
            f"(required: at least {by * 100:g}% ahead){_context(reference, candidate)}",
            pytrace=False,
        )
    return r


# -- gates on repeated launches ------------------------------------------------------------------

INCONCLUSIVE_POLICIES = ("xfail", "fail", "warn")
# What a regression gate judges (CompareFixture.no_regression), the default first.
REGRESSION_MEASURES = ("fabric-time", "scaling", "tokens")


# What a verdict's sentence starts with, in the terminal and a failure's message.
VERDICT_WORDS = {Verdict.PASS: "pass", Verdict.FAIL: "interval wholly below the threshold",
                 Verdict.INCONCLUSIVE: "inconclusive after the launch budget"}


class InconclusiveWarning(UserWarning):
    """A comparison whose interval still straddles its threshold after the launch budget."""


@dataclass(frozen=True)
class GateOutcome:
    """A comparison as the gate decided it: the numbers every renderer shows.

    ``interval`` is of ``a_name`` / ``b_name`` (tokens/s, or the regression gate's measure for a regression
    gate); ``values`` are the two sides' estimates (``contrasts.configuration_value`` of the same launches,
    so that the ratio shown is the ratio of the values shown); ``reruns`` lists the rounds launched
    again (a launch disturbed as a whole) and any disturbed round counted, and why
    (``rounds.Rounds.notes``); ``noise``: the noise a baseline learned, None where none was.
    """

    a_name: str
    b_name: str
    threshold: float
    requirement: str
    interval: Interval
    verdict: Verdict
    values: tuple[float, float]
    unit: str
    context: str  # "[qwen2-tiny, 2 node(s)]"
    noise: NoisePrior | None
    reruns: tuple[str, ...] = ()  # rounds launched again, disturbed rounds counted, and why
    extra: str = ""  # a second figure shown beside the gated one (raw tokens/s of a regression)
    family: int = 1  # gates sharing the night's allowance for false failures (Bonferroni)

    def render(self, detail: str = "full", note: str | None = None) -> str:
        """The one renderer of a decided gate's sentence; every place that shows a verdict calls it.

        ``full``: the terminal's and the failure message's sentence (``VERDICT_WORDS`` of the verdict;
        why rounds ran again; the noise with its note; ``note``, the model's prediction, on a line of
        its own below it); ``testcase``: the JUnit testcase output's line, short enough for a
        dashboard (how many rounds were re-run, not why; the noise with its source); ``headline``:
        the one-line JUnit message part (ratio, interval, threshold, verdict, launches).
        """
        iv = self.interval
        launches = "+".join(map(str, iv.launches))
        if detail == "headline":
            return (f"{self.a_name}/{self.b_name} = {iv.point:.3f} [{iv.low:.3f}, {iv.high:.3f}] vs threshold "
                    f"{self.threshold:.3f} {self.context}: {self.verdict} after {launches} launches")
        if detail not in ("full", "testcase"):
            raise ValueError(f"unknown detail {detail!r}: full, testcase or headline")
        full = detail == "full"
        if full:
            aside = f" ({'; '.join(self.reruns)})" if self.reruns else ""
            noise = f"launch noise {iv.sigma * 100:.1f}% on {iv.df:g} df: {iv.noise_note}"
            noise += f"; failures judged over {self.family} gates (Bonferroni)" if self.family > 1 else ""
        else:
            aside = f", {len(self.reruns)} re-run" if self.reruns else ""
            noise = f"noise {iv.sigma * 100:.1f}% on {iv.df:g} df ({iv.source})"
        return (f"{VERDICT_WORDS[self.verdict] if full else self.verdict}: {self.a_name}/{self.b_name} = "
                f"{iv.point:.3f}, {iv.confidence * 100:.4g}% CI [{iv.low:.3f}, {iv.high:.3f}] over {launches} "
                f"launches{aside}; required >= {self.threshold:.3f} ({self.requirement}); {self.a_name} "
                f"{self.values[0]:.1f} vs {self.b_name} {self.values[1]:.1f} {self.unit} {self.context}; {noise}"
                + (f"; {self.extra}" if self.extra else "") + (f"\n{note}" if note and full else ""))

    def record(self) -> dict[str, Any]:
        """The gate as data: the one record the saved night, the job summary, the metrics and JUnit's
        machine lines (``MACHINE_FIELDS`` of it, ``machine_fields``) are written from."""
        iv = self.interval
        return {"a": self.a_name, "b": self.b_name, "context": self.context, "outcome": str(self.verdict),
                "ratio": iv.point, "ci_low": iv.low, "ci_high": iv.high, "confidence": iv.confidence,
                "threshold": self.threshold, "requirement": self.requirement, "a_value": self.values[0],
                "b_value": self.values[1], "unit": self.unit, "launches": list(iv.launches),
                "reruns": len(self.reruns), "launch_noise": iv.sigma, "noise_df": iv.df, "noise_source": iv.source,
                "noise_note": iv.noise_note, "family": self.family}


# The record's fields a JUnit machine line carries (``fabric.gate.<a>_vs_<b>.<name>=``), each with
# its type: the line's name is the record's key, but ``verdict`` for ``outcome``.
MACHINE_FIELDS: dict[str, type] = {"verdict": str, "ratio": float, "ci_low": float, "ci_high": float,
                                   "confidence": float, "threshold": float, "launches": list, "reruns": int,
                                   "launch_noise": float, "noise_df": float, "noise_source": str, "family": int}


def machine_fields(record: Mapping[str, Any]) -> dict[str, str]:
    """A gate record's machine fields as text (name -> value), in ``MACHINE_FIELDS`` order."""
    out = {}
    for name, kind in MACHINE_FIELDS.items():
        value = record["outcome" if name == "verdict" else name]
        out[name] = ("+".join(map(str, value)) if kind is list else f"{value:.6g}" if kind is float else str(value))
    return out


def record_from_fields(a: str, b: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """The gate record a JUnit file's machine fields hold (the inverse of ``machine_fields``); a field
    that does not read as its type is kept as text."""
    record: dict[str, Any] = {"a": a, "b": b}
    for name, value in fields.items():
        kind = MACHINE_FIELDS.get(name, str)
        try:
            record["outcome" if name == "verdict" else name] = (
                [int(n) for n in value.split("+")] if kind is list else kind(value))
        except ValueError:
            record[name] = value
    return record


def apply_verdict(outcome: GateOutcome, inconclusive: str = "xfail", note: str | None = None) -> str:
    """Turn a decided comparison into the test's outcome.

    Pass returns the verdict sentence (``outcome.render()``); fail is a pytest failure whose message
    carries the ratio, its interval, the launches and the threshold; inconclusive follows
    ``inconclusive``: ``xfail`` (reported, not failing the night), ``fail``, or ``warn`` (passes with a
    warning). ``note`` (the model's prediction) goes on a line of its own below a failure's or an
    inconclusive result's message; the pass line leaves it to the caller.

    The returned sentence is for people: the ``GateOutcome`` is the record (the plugin keeps it, and
    JUnit, the saved night and the summary render from it); nothing reads the sentence back.
    """
    verdict = outcome.verdict
    if verdict is Verdict.PASS:
        return outcome.render()
    message = outcome.render(note=note)
    if verdict is Verdict.FAIL or inconclusive == "fail":
        pytest.fail(message, pytrace=False)
    if inconclusive == "xfail":
        pytest.xfail(message)
    import warnings

    warnings.warn(InconclusiveWarning(message), stacklevel=2)
    return outcome.render()
