"""Command-line and ini options, parsed once into a typed ``FabricOptions`` and validated.

Every option can be given on the command line or in ini / ``pyproject.toml`` (``fabric_<name>``);
the command line wins. Bad values raise ``pytest.UsageError`` naming what is allowed.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from ..cluster import ClusterOptions, cluster_kinds
from ..cluster.base import check_rank_env
from ..cluster.slurm import check_srun_args
from ..physics.floor import DEFAULT_RATE_TOLERANCE
from ..core.fabrics import DEFAULT_FABRICS, FabricConfigError, build_table, fabric_value
from ..deciding.gates import REGRESSION_MEASURES
from ..measuring.measure import DEFAULT_COLLECTIVE_TIMEOUT_S, LaunchSettings
from ..core.models import DEFAULT_CPU_MODELS, MODELS
from ..deciding.references import References
from ..history.baselines import Baseline
from ..deciding.sequential import FAMILY_RULES
from ..deciding.rounds import RERUNS
from ..deciding.budget import parse_duration
from ..measuring.nic_inventory import parse_inventory
from ..core.case import SHARDINGS
from ..core.units import GIB
from .option_table import CHOICES, DEFAULTS, dest

# Where the launches' files go unless --run-dir says: under the rootdir, which on a cluster is
# usually a checkout on shared storage (each node's token proves it; session.check_nodes).
DEFAULT_RUN_DIR = "fabric-runs"


def _raw(config: pytest.Config, name: str) -> str | None:
    """The command line's value, else the ini's, else the option's default in ``option_table.OPTIONS`` (its one
    definition; an empty ini value also falls back to it); None when none gives one."""
    cli = config.getoption(dest(name))
    if cli is not None:
        return str(cli)
    ini = config.getini(dest(name))
    return str(ini) if ini not in (None, "") else DEFAULTS.get(name)


def _int(config: pytest.Config, name: str, minimum: int) -> int | None:
    value = _raw(config, name)
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise pytest.UsageError(f"--{name} must be an integer >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise pytest.UsageError(f"--{name} must be an integer >= {minimum}, got {n}")
    return n


def _choice(config: pytest.Config, name: str) -> str:
    value = _raw(config, name) or CHOICES[name][0]
    if value not in CHOICES[name]:
        raise pytest.UsageError(f"--{name}: {value!r} is not one of {', '.join(CHOICES[name])}")
    return value


def _names(config: pytest.Config, name: str, known: dict) -> tuple[str, ...] | None:
    value = _raw(config, name)
    if value is None:
        return None
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise pytest.UsageError(
            f"--{name}: unknown {', '.join(map(repr, unknown)) or 'empty value'}; choose from: {', '.join(known)}")
    return names


def _rates(config: pytest.Config, name: str = "fabric-rate", unit: str = "MBIT", example: str = "eth=200",
           ) -> dict[str, float]:
    """``NAME=NUMBER,...`` per fabric (--fabric-rate in Mbit/s, --fabric-link-gbit in Gbit/s)."""
    value = _raw(config, name)
    rates: dict[str, float] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        try:
            fabric, rates_value = fabric_value(item)
        except ValueError:
            raise pytest.UsageError(f"--{name}: {item.strip()!r} is not NAME={unit} with {unit} a positive "
                                    f"number (e.g. --{name} {example})") from None
        rates[fabric] = rates_value
    return rates


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(config: pytest.Config, name: str) -> bool:
    if config.getoption(dest(name)):
        return True
    value = str(config.getini(dest(name))).strip()
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise pytest.UsageError(f"ini {dest(name)}: {value!r} is not a boolean; write true or false")


def _words(config: pytest.Config, name: str) -> tuple[str, ...]:
    """A value split into words as a shell would (--srun-args, --launch-prefix): quotes keep a word
    with spaces whole; unbalanced quotes are refused rather than guessed at."""
    value = _raw(config, name) or ""
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise pytest.UsageError(f"--{name}: cannot split {value!r} into words ({exc}); quote it as a shell "
                                "would") from None


def _srun_args(config: pytest.Config) -> tuple[str, ...]:
    words = _words(config, "srun-args")
    try:
        check_srun_args(words)
    except ValueError as exc:
        raise pytest.UsageError(f"--srun-args: {exc}") from None
    return words


def _rank_env(config: pytest.Config) -> tuple[str, ...]:
    """--rank-env names, separated by commas or white space (an ini value may take several lines)."""
    names = [name for name in re.split(r"[,\s]+", _raw(config, "rank-env") or "") if name]
    try:
        return check_rank_env(names)
    except ValueError as exc:
        raise pytest.UsageError(f"--rank-env: {exc}") from None


def _check_file(path: str | None, name: str, hint: str) -> None:
    if path is None or Path(path).is_file():
        return
    what = "is a directory" if Path(path).is_dir() else "no such file"
    raise pytest.UsageError(f"--{name} {path}: {what}; {hint}")


def _check_checkpoint(model_path: str) -> None:
    """The checkpoint's config.json is there and is a JSON object (the ranks read the rest)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        raise pytest.UsageError(f"--model-path {model_path}: no config.json there; give the directory of a "
                                f"Hugging Face checkpoint (config.json + *.safetensors)")
    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise pytest.UsageError(f"--model-path {model_path}: config.json is not valid JSON ({exc}); give the "
                                f"directory of a Hugging Face checkpoint saved with save_pretrained") from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"--model-path {model_path}: config.json is not a JSON object; give the "
                                f"directory of a Hugging Face checkpoint saved with save_pretrained")


def _positive(config: pytest.Config, name: str, example: str) -> float | None:
    value = _raw(config, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < math.inf:
        raise pytest.UsageError(f"--{name} must be a positive number such as {example}, got {value!r}")
    return number


def _fraction_or_seconds(config: pytest.Config, name: str, upper: float | None) -> float | None:
    """A number >= 0 (seconds) or, with ``upper``, in (0, upper) (a fraction); None where the option
    has no default and is not given."""
    value = _raw(config, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    ok = 0 < number < upper if upper is not None else 0 <= number < math.inf
    if not ok:
        what = f"a fraction in (0, {upper:g})" if upper is not None else "a number of seconds >= 0"
        raise pytest.UsageError(f"--{name} must be {what}, got {value!r}")
    return number


def _prices(config: pytest.Config, fabrics: dict) -> dict[str, float]:
    """USD per GPU-hour by fabric: ini ``fabric_price`` lines, then --fabric-price items over them."""
    prices: dict[str, float] = {}
    cli = config.getoption("fabric_price_cli")
    for where, items in (("ini fabric_price", config.getini("fabric_price")),
                         ("--fabric-price", (cli or "").split(","))):
        for item in (i.strip() for line in items for i in line.split(",")):
            if not item or item.startswith("#"):
                continue
            try:
                name, price = fabric_value(item)
            except ValueError:
                raise pytest.UsageError(
                    f"{where}: {item!r} is not FABRIC = USD_PER_GPU_HOUR with a positive price; write one "
                    f"'ib = 3.50' per line under fabric_price in ini, or --fabric-price ib=3.50,eth=2.90") from None
            if name not in fabrics:
                raise pytest.UsageError(f"{where}: {item!r} prices an unknown fabric {name!r}; known fabrics: "
                                        f"{', '.join(fabrics)}")
            prices[name] = price
    return prices


@dataclass(frozen=True)
class FabricOptions:
    nodes: int | None  # None: the cluster's own size (Cluster.default_nodes: the allocation, the hostfile, else 2)
    fabrics: tuple[str, ...]
    models: tuple[str, ...]
    cluster: str
    hostfile: str | None
    ssh_config: str | None
    run_dir: Path  # --run-dir, resolved: each session's directory is made under it
    exclude_nodes: tuple[str, ...]  # --exclude-nodes
    gpus_per_node_given: bool  # --gpus-per-node given: else the cluster's own count wins over the default 1
    ssh_host_key_checking: str
    settings: LaunchSettings
    srun_args: tuple[str, ...] = ()  # --srun-args, split into words and checked
    launch_prefix: tuple[str, ...] = ()  # --launch-prefix, split into words
    rank_env: tuple[str, ...] = ()  # --rank-env names, checked
    # The files named by --fabric-suite and --fabric-baseline; their owners read them
    # (``session.with_inputs``: References.load, baselines.Baseline.load), never parse().
    suite_path: str | None = None
    baseline_path: str | None = None
    references: References = field(default_factory=References)
    save: str | None = None
    metrics: str | None = None  # --fabric-metrics: OpenMetrics text of the night
    benchmark_json: str | None = None  # --fabric-benchmark-json: Bencher Metric Format
    baseline: Baseline | None = None  # read from baseline_path by session.with_inputs
    regression_threshold: float = 0.10
    repeats: int = 2
    max_repeats: int = 6
    night_budget: float | None = None  # --night-budget, seconds (running/plan.py)
    night_costs: str | None = None  # --night-costs: launch wall times measured before (running/plan.py)
    throughput_launches: int = 1
    inconclusive: str = "xfail"
    reruns: int = RERUNS  # disturbed rounds a gate may launch again (rounds.run_rounds)
    undecided_night: str = "fail"  # a night that decides no gate: "fail" exits 1, "pass" leaves the status
    # USD per GPU-hour by fabric (ini fabric_price, --fabric-price); empty: no cost figures.
    prices: dict[str, float] = field(default_factory=dict)
    # Per-rank FLOP/s the comparison predictions assume; None: fitted to the faster side's step.
    flops_per_rank: float | None = None
    regression_on: str = REGRESSION_MEASURES[0]
    family_wise: str = FAMILY_RULES[0]  # sequential.FAMILY_RULES
    # How far a step may appear to beat the physical floor before it is an error (floor.py).
    floor_tolerance: float = DEFAULT_RATE_TOLERANCE
    shardings: tuple[str, ...] = ("full",)  # --sharding: an axis of the matrix (core.case.SHARDINGS)

    def cluster_options(self) -> ClusterOptions:
        """What the cluster is built with (make_cluster)."""
        return ClusterOptions(self.hostfile, self.ssh_config, self.ssh_host_key_checking, self.srun_args,
                              self.launch_prefix, self.rank_env)


def _collective_timeout(config: pytest.Config, launch_timeout: float) -> float | None:
    """--collective-timeout in seconds, below the launch deadline; None where not given
    (LaunchSettings.collective_timeout: a third of the deadline, at most DEFAULT_COLLECTIVE_TIMEOUT_S)."""
    seconds = _positive(config, "collective-timeout", "60")
    if seconds is not None and seconds >= launch_timeout:
        raise pytest.UsageError(
            f"--collective-timeout {seconds:g} is not below --launch-timeout {launch_timeout:g}: a hung collective "
            f"would reach the launch deadline before its own error names it; give a collective timeout well below "
            f"the deadline (e.g. --collective-timeout {min(DEFAULT_COLLECTIVE_TIMEOUT_S, launch_timeout / 3):g}) "
            f"or raise --launch-timeout")
    return seconds


def parse(config: pytest.Config) -> FabricOptions:
    cluster = _raw(config, "cluster") or "auto"
    if cluster not in cluster_kinds():  # a plugin may have registered a launcher since import
        raise pytest.UsageError(f"--cluster: unknown cluster {cluster!r}; choose from: {', '.join(cluster_kinds())}")
    try:
        table = build_table(config.getini("fabric_define"),
                            [*config.getini("fabric_env"), *config.getoption("fabric_env_cli")],
                            _rates(config), _rates(config, "fabric-link-gbit", "GBIT", "eth=80"))
    except FabricConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        inventory = parse_inventory(config.getini("fabric_inventory"), table)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    fabrics = _names(config, "fabrics", table)
    models = _names(config, "models", MODELS)
    timeout_value = _raw(config, "launch-timeout")
    try:
        timeout = float(timeout_value)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout < math.inf:
        raise pytest.UsageError(f"--launch-timeout must be a positive number of seconds, got {timeout_value!r}")
    collective_timeout = _collective_timeout(config, timeout)
    model_path = _raw(config, "model-path")
    if model_path is not None:
        _check_checkpoint(model_path)
    device = _choice(config, "device")
    fsdp = int(_choice(config, "fsdp"))
    if fsdp == 1 and device == "cpu":
        raise pytest.UsageError("--fsdp 1 needs GPUs (FSDP1 refuses to run without an accelerator); "
                                "use --fsdp 2 on CPU")
    settings = LaunchSettings(
        gpus_per_node=_int(config, "gpus-per-node", 1) or 1,
        steps=_int(config, "steps", 1),
        measure_s=_fraction_or_seconds(config, "measure-seconds", upper=None),
        warmup_steps=_int(config, "warmup-steps", 0),
        batch_size=_int(config, "batch-size", 1),
        seq_len=_int(config, "seq-len", 1),
        launch_timeout_s=timeout,
        collective_timeout_s=collective_timeout,
        fabric_table=table,
        device=device,
        fsdp=fsdp,
        mixed_precision=_choice(config, "mixed-precision"),
        reduce_dtype=_choice(config, "reduce-dtype"),
        grad_accum=_int(config, "grad-accum", 1) or 1,
        activation_checkpointing=_flag(config, "activation-checkpointing"),
        compile=_choice(config, "compile"),
        gpu_memory_bytes=(gib * GIB if (gib := _positive(config, "gpu-memory", "80")) else None),
        model_path=str(Path(model_path).resolve()) if model_path else None,
        require_gdr=not _flag(config, "accept-no-gdr"),
        inventory=inventory,
    )
    threshold_value = _raw(config, "regression-threshold")
    try:
        regression_threshold = float(threshold_value)
    except ValueError:
        regression_threshold = -1.0
    if not 0 < regression_threshold < 1:
        raise pytest.UsageError(f"--regression-threshold must be a fraction in (0, 1) such as 0.10, "
                                f"got {threshold_value!r}")
    save = _output_file(config, "fabric-save", "night.json")
    repeats = _int(config, "repeats", 1)
    max_repeats = _int(config, "max-repeats", 1)
    if max_repeats < repeats:
        raise pytest.UsageError(f"--max-repeats {max_repeats} is below --repeats {repeats}; "
                                f"give --max-repeats >= --repeats")
    budget = _raw(config, "night-budget")
    try:
        night_budget = parse_duration(budget) if budget is not None else None
    except ValueError as exc:
        raise pytest.UsageError(f"--night-budget: {exc}") from None
    hostfile = _raw(config, "hostfile")
    _check_file(hostfile, "hostfile", "write one host per line")
    ssh_config = _raw(config, "ssh-config")
    _check_file(ssh_config, "ssh-config", "give an ssh_config file (ssh -F), or leave the option out")
    return FabricOptions(
        nodes=_int(config, "nodes", 1),
        fabrics=fabrics or DEFAULT_FABRICS,
        models=models or DEFAULT_CPU_MODELS,
        shardings=_names(config, "sharding", {s: s for s in SHARDINGS}) or ("full",),
        cluster=cluster,
        hostfile=hostfile,
        ssh_config=ssh_config,
        run_dir=Path(_raw(config, "run-dir") or config.rootpath / DEFAULT_RUN_DIR).expanduser().resolve(),
        gpus_per_node_given=_raw(config, "gpus-per-node") is not None,
        exclude_nodes=tuple(dict.fromkeys(n.strip() for n in (_raw(config, "exclude-nodes") or "").split(",")
                                          if n.strip())),
        ssh_host_key_checking=_choice(config, "ssh-host-key-checking"),
        settings=settings,
        srun_args=_srun_args(config),
        launch_prefix=_words(config, "launch-prefix"),
        rank_env=_rank_env(config),
        suite_path=_raw(config, "fabric-suite"),
        baseline_path=_raw(config, "fabric-baseline"),
        save=save,
        metrics=_output_file(config, "fabric-metrics", "metrics.txt"),
        benchmark_json=_output_file(config, "fabric-benchmark-json", "benchmark.json"),
        regression_threshold=regression_threshold,
        repeats=repeats,
        max_repeats=max_repeats,
        night_budget=night_budget,
        night_costs=_raw(config, "night-costs"),
        throughput_launches=_int(config, "throughput-launches", 1),
        inconclusive=_choice(config, "inconclusive"),
        reruns=_int(config, "reruns", 0),
        undecided_night=_choice(config, "undecided-night"),
        prices=_prices(config, table),
        flops_per_rank=_positive(config, "fabric-flops", "4e14"),
        regression_on=_choice(config, "regression-on"),
        family_wise=_choice(config, "family-wise"),
        floor_tolerance=_fraction_or_seconds(config, "floor-tolerance", upper=1.0),
    )


def _output_file(config: pytest.Config, name: str, example: str) -> str | None:
    """A file the run writes at its end: refused now if it could not be written then."""
    path = _raw(config, name)
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise pytest.UsageError(f"--{name} {path}: the directory {Path(path).resolve().parent} does not exist")
    if path is not None and Path(path).is_dir():
        raise pytest.UsageError(f"--{name} {path}: is a directory; give a file path such as {path}/{example}")
    return path


def with_gpus_per_node(options: FabricOptions, gpus: int) -> FabricOptions:
    """``options`` running ``gpus`` ranks per node: where --gpus-per-node was not given, the
    cluster's own count (``Cluster.gpus_per_node``, the node check's)."""
    return replace(options, settings=replace(options.settings, gpus_per_node=gpus))
