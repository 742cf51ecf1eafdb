"""A pytest plugin for benchmarks/nightly_resample.py: a session that judges launches already in a
prepared store instead of launching.

    FABRIC_REPLAY_DIR=DIR python -m pytest -p replay_plugin ...   (benchmarks/ on PYTHONPATH)

The session's results directory becomes DIR, whose ``measurements.json`` the resampler filled with
real launches drawn from earlier sessions (each under its store key, ``<case>#<set-up>@<index>``),
so the measurer finds every launch it asks for cached and every gate runs its own code on them: the
prior, the F-check, the sequential looks, the family-wise rule, the verdict. A launch the store lacks
is an error, never a launch: a replayed night measures nothing.

The pool's launches ran the windows they ran. Where a round of the pool measured a configuration
over its partner's longer window too (``Measurer.measure``'s ``@N~Ws``, a pool measured by the
gates' own sessions: ``nightly_resample.py --rounds``), the replay serves that matched launch to
the comparison whose partner's launch of the same round was stretched (``stored_match``), and the
plain one to every other comparison, as the night that measured them did. A pool without matched
launches gets none: its stretched side is judged against its reference's own window, the bias the
gates no longer have (a stretched side reads slower: README, "In interleaved rounds").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest


class ReplayMissing(RuntimeError):
    """The replayed store lacks a launch a gate asked for."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    import pytest_fabric.plugin as plugin
    from pytest_fabric.measuring.measure import Measurer

    directory = Path(os.environ["FABRIC_REPLAY_DIR"])
    plugin.session_directory = lambda config: directory

    def refuse(self, case, *args, **kwargs):
        raise ReplayMissing(f"{case.id}: not in the replayed store {directory / 'measurements.json'}")

    Measurer._launch = refuse
    Measurer.matched_window = lambda self, case, launch, partners: stored_match(
        self.store.all(), self.key(case), [self.key(p) for p in partners], launch)
    # A round's launches as the night measured them: a launch measured again for its round
    # (``...+partners``) where the store has one, the round's own launch otherwise; the pool's
    # launch times (rounds of different sessions) decide nothing here.
    Measurer.in_round = lambda self, key, partner_keys: True
    # Rounds taken in turns (``Measurer.measure_round``, keys ``...&partners``) where the night took
    # them so, one launch after the other where it did not: as the night measured them.
    from pytest_fabric.running.session import FabricSession

    FabricSession.interleaved = lambda self: took_turns(self.store.all())


def took_turns(store: Mapping[str, dict]) -> bool:
    """Whether the replayed store's rounds took turns (any key ``...&partners``)."""
    from pytest_fabric.measuring.measurement import LaunchKey

    return any(LaunchKey.parse(key).interleaved for key in store)


def stored_match(store: Mapping[str, dict], key: str, partner_keys: Sequence[str], launch: int) -> float:
    """The matched window (seconds) at which the replayed store holds launch ``launch`` of the
    configuration keyed ``key`` for a comparison with ``partner_keys``; 0.0 for its plain launch.

    The store was filled with whole rounds of one measured night (or pool session): in that round
    the configuration measured its partner's window (``key@launch~Ws``) exactly where a partner's own
    launch of the round was stretched for its stalls (a plain record with ``measured_longer``; only
    a stall stretches a later launch, ``steps.measure_window``), and its plain launch served every
    other comparison."""
    from pytest_fabric.measuring.measurement import LaunchKey

    if not launch:
        return 0.0
    windows, stretched = [], False
    for stored_key, record in store.items():
        parsed = LaunchKey.parse(stored_key)
        if parsed.number != launch:
            continue
        if parsed.base == key and parsed.window:
            windows.append(parsed.window)
        elif parsed.base in partner_keys and not parsed.window:
            stretched = stretched or bool((record or {}).get("measured_longer"))
    return max(windows) if windows and stretched else 0.0
