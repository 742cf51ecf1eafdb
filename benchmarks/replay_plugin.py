"""A pytest plugin for benchmarks/nightly_resample.py: a session that judges launches already in a
prepared store instead of launching.

    FABRIC_REPLAY_DIR=DIR python -m pytest -p replay_plugin ...   (benchmarks/ on PYTHONPATH)

The session's results directory becomes DIR, whose ``measurements.json`` the resampler filled with
real launches drawn from earlier sessions (each under its store key, ``<case>#<set-up>@<index>``),
so the measurer finds every launch it asks for cached and every gate runs its own code on them: the
rounds and their re-runs, the noise, the sequential looks, the family-wise rule, the verdict. A
launch the store lacks is an error, never a launch: a replayed night measures nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


class ReplayMissing(RuntimeError):
    """The replayed store lacks a launch a gate asked for."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    import pytest_fabric.plugin as plugin
    from pytest_fabric.measuring.measure import Measurer

    directory = Path(os.environ["FABRIC_REPLAY_DIR"])
    plugin.session_directory = lambda config, run_dir=None: directory

    def refuse(self, case, *args, **kwargs):
        raise ReplayMissing(f"{case.id}: not in the replayed store {directory / 'measurements.json'}")

    Measurer._launch = refuse
    # A round's launches as the night measured them: a launch measured again for its round
    # (``...+partners``) where the store has one, the round's own launch otherwise; the pool's
    # launch times (rounds of different sessions) decide nothing here.
    Measurer.in_round = lambda self, key, partner_keys: True
