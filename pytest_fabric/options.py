"""Command-line and ini options, parsed once into a typed ``FabricOptions`` and validated.

Every option can be given on the command line or in ini / ``pyproject.toml`` (``fabric_<name>``);
the command line wins. Bad values raise ``pytest.UsageError`` naming what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .cluster import CLUSTER_KINDS
from .fabrics import DEFAULT_FABRICS, FABRICS
from .measure import Settings
from .models import DEFAULT_CPU_MODELS, MODELS

DEFAULT_NODES = 2

# name, help, default (as the ini string)
_OPTIONS: list[tuple[str, str, str | None]] = [
    ("nodes", "cluster size N: the matrix's nodes axis is the powers of two up to N (default 2)", None),
    ("gpus-per-node", "ranks per node (GPUs per node; processes per emulated node) (default 1)", "1"),
    ("fabrics", f"comma-separated fabrics to test, from: {', '.join(FABRICS)} (default {','.join(DEFAULT_FABRICS)})",
     ",".join(DEFAULT_FABRICS)),
    ("models", f"comma-separated models, from: {', '.join(MODELS)} (default {','.join(DEFAULT_CPU_MODELS)})", None),
    ("cluster", f"how ranks start: {', '.join(CLUSTER_KINDS)} (default auto)", "auto"),
    ("steps", "measured training steps per launch, after warm-up (default 8)", "8"),
    ("warmup-steps", "warm-up steps per launch, excluded from the figures (default 2)", "2"),
    ("batch-size", "micro-batch per rank (default: the model's own)", None),
    ("seq-len", "sequence length (default: the model's own)", None),
    ("launch-timeout", "seconds one launch may take before every rank is killed (default 300)", "300"),
    ("fabric-rate", "emulated link rate override NAME=MBIT, comma-separated (e.g. eth=200)", None),
]


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("fabric", "pytest-fabric: interconnect fabric comparisons")
    for name, help_text, default in _OPTIONS:
        dest = "fabric_" + name.replace("-", "_")
        flag = f"--{name}"
        group.addoption(flag, dest=dest, default=None, help=help_text)
        parser.addini(dest, help=f"default for {flag}: {help_text}", default=default)


def _raw(config: pytest.Config, name: str) -> tuple[str | None, bool]:
    """(value, given_on_command_line)."""
    dest = "fabric_" + name.replace("-", "_")
    cli = config.getoption(dest)
    if cli is not None:
        return str(cli), True
    ini = config.getini(dest)
    return (str(ini) if ini not in (None, "") else None), False


def _int(config: pytest.Config, name: str, minimum: int, default: int | None = None) -> int | None:
    value, _ = _raw(config, name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise pytest.UsageError(f"--{name} must be an integer >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise pytest.UsageError(f"--{name} must be an integer >= {minimum}, got {n}")
    return n


def _names(config: pytest.Config, name: str, known: dict) -> tuple[tuple[str, ...] | None, bool]:
    value, explicit = _raw(config, name)
    if value is None:
        return None, explicit
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise pytest.UsageError(
            f"--{name}: unknown {', '.join(map(repr, unknown)) or 'empty value'}; choose from: {', '.join(known)}")
    return names, explicit


def _rates(config: pytest.Config) -> tuple[tuple[str, float], ...]:
    value, _ = _raw(config, "fabric-rate")
    if not value:
        return ()
    rates = []
    for item in value.split(","):
        name, sep, mbit = item.strip().partition("=")
        try:
            rate = float(mbit)
        except ValueError:
            rate = -1.0
        if not sep or name not in FABRICS or rate <= 0:
            raise pytest.UsageError(
                f"--fabric-rate: {item.strip()!r} is not NAME=MBIT with NAME one of {', '.join(FABRICS)} "
                f"and MBIT a positive number (e.g. --fabric-rate eth=200)")
        rates.append((name, rate))
    return tuple(rates)


@dataclass(frozen=True)
class FabricOptions:
    nodes: int
    fabrics: tuple[str, ...]
    models: tuple[str, ...]
    cluster: str
    settings: Settings


def parse(config: pytest.Config) -> FabricOptions:
    cluster, _ = _raw(config, "cluster")
    cluster = cluster or "auto"
    if cluster not in CLUSTER_KINDS:
        raise pytest.UsageError(f"--cluster: unknown cluster {cluster!r}; choose from: {', '.join(CLUSTER_KINDS)}")
    fabrics, _ = _names(config, "fabrics", FABRICS)
    models, _ = _names(config, "models", MODELS)
    timeout_value, _ = _raw(config, "launch-timeout")
    try:
        timeout = float(timeout_value or 300)
    except ValueError:
        timeout = -1.0
    if timeout <= 0:
        raise pytest.UsageError(f"--launch-timeout must be a positive number of seconds, got {timeout_value!r}")
    settings = Settings(
        gpus_per_node=_int(config, "gpus-per-node", 1, default=1),
        steps=_int(config, "steps", 1, default=8),
        warmup_steps=_int(config, "warmup-steps", 0, default=2),
        batch_size=_int(config, "batch-size", 1),
        seq_len=_int(config, "seq-len", 1),
        launch_timeout_s=timeout,
        fabric_rates=_rates(config),
    )
    return FabricOptions(
        nodes=_int(config, "nodes", 1, default=DEFAULT_NODES),
        fabrics=fabrics or DEFAULT_FABRICS,
        models=models or DEFAULT_CPU_MODELS,
        cluster=cluster,
        settings=settings,
    )
