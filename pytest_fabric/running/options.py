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

from ..cluster import CLUSTER_KINDS, ClusterOptions, cluster_kinds
from ..cluster.base import check_rank_env
from ..cluster.slurm import check_srun_args
from ..physics.floor import DEFAULT_RATE_TOLERANCE
from ..core.fabrics import DEFAULT_FABRICS, FABRICS, FabricConfigError, build_table, fabric_value
from ..cluster.ssh import STRICT_HOST_KEY_CHECKING
from ..deciding.gates import INCONCLUSIVE_POLICIES, REGRESSION_MEASURES
from ..measuring.measure import LaunchSettings
from ..core.models import DEFAULT_CPU_MODELS, MODELS
from ..deciding.references import References
from ..history.baselines import Baseline
from ..deciding.sequential import FAMILY_RULES
from ..deciding.rounds import RERUNS
from ..workload.config import DEVICES, FSDP_VERSIONS, MIXED_PRECISION
from ..measuring.nic_inventory import parse_inventory
from ..core.units import GIB

# Where the launches' files go unless --run-dir says: under the rootdir, which on a cluster is
# usually a checkout on shared storage (each node's token proves it; session.check_nodes).
DEFAULT_RUN_DIR = "fabric-runs"


# name, help, default (as the ini string)
_OPTIONS: list[tuple[str, str, str | None]] = [
    ("nodes", "cluster size N: the matrix's nodes axis is the powers of two up to N "
              "(default: the Slurm allocation or hostfile size, else 2)", None),
    ("gpus-per-node", "ranks per node (GPUs per node; processes per emulated node) (default: the Slurm "
                      "allocation's GPUs per node, the hostfile's slots, else the GPUs each node shows, else 1)",
     None),
    ("fabrics", f"comma-separated fabrics to test: {', '.join(FABRICS)} or one defined in fabric_define "
                f"(default {','.join(DEFAULT_FABRICS)})", ",".join(DEFAULT_FABRICS)),
    ("models", f"comma-separated models, from: {', '.join(MODELS)} (default {','.join(DEFAULT_CPU_MODELS)})", None),
    ("cluster", f"how ranks start: {', '.join(CLUSTER_KINDS)} (default auto: slurm inside an allocation, "
                "ssh with --hostfile, else emulated)", "auto"),
    ("hostfile", "ssh cluster: file with one host per line ([user@]HOST [slots=N])", None),
    ("ssh-config", "ssh cluster: ssh_config file passed to ssh -F", None),
    ("ssh-host-key-checking", "ssh cluster: StrictHostKeyChecking yes|accept-new|no (default accept-new)",
     "accept-new"),
    ("srun-args", "slurm cluster: more srun options for the step that runs ranks, as a shell would split them "
                  "(pyxis: --srun-args=\"--container-image=IMAGE --container-mounts=/lustre:/lustre\"); not the "
                  "options the launcher sets (--nodes, --ntasks, --ntasks-per-node, --nodelist, --jobid, "
                  "--job-name)", None),
    ("launch-prefix", "ssh and slurm clusters: words before each node's rank command, as a shell would split them "
                      "(e.g. \"apptainer exec --nv IMAGE\", \"docker exec -i CONTAINER\")", None),
    ("rank-env", "ssh and slurm clusters: comma-separated variables every rank gets from this environment by "
                 "name, besides NCCL_*, TORCH_NCCL_*, GLOO_*, FI_* (e.g. LD_LIBRARY_PATH,HF_HOME); never a "
                 "secret-looking name", None),
    ("run-dir", "directory for the launches' files (configs, results, logs, NCCL logs), on storage every node "
                "sees (Lustre, GPFS, an NFS home); each node writes a token there at session start and one that "
                "cannot is refused (default: fabric-runs under the rootdir)", None),
    ("exclude-nodes", "comma-separated nodes never to launch on (Slurm node names, hostfile hosts), as srun "
                      "--exclude; nodes that fail the node check at session start are left out too", None),
    ("steps", "measured training steps per launch at least, after warm-up (default 10)", "10"),
    ("measure-seconds", "after --steps, each launch measures until this many seconds of measured steps, the same "
                        "window for every launch (default 6; 0: exactly --steps steps)", "6"),
    ("warmup-steps", "warm-up steps per launch, excluded from the figures (default 2)", "2"),
    ("batch-size", "micro-batch per rank (default: the model's own)", None),
    ("seq-len", "sequence length (default: the model's own)", None),
    ("launch-timeout", "seconds one launch may take before every rank is killed (default 300)", "300"),
    ("repeats", "launches per side before a comparison is first judged (default 2)", "2"),
    ("max-repeats", "launches per side a comparison may take while inconclusive (default 6)", "6"),
    ("reruns", "rounds a comparison may launch again because one of its launches was disturbed as a whole "
               f"(most steps taken by something outside the job); after these a disturbed round counts and the "
               f"verdict says so (default {RERUNS})", str(RERUNS)),
    ("throughput-launches", "launches of each configuration in the throughput suite (default 1; with 2 or more, "
                            "`pytest-fabric baseline` learns each configuration's launch noise from the saved "
                            "night)", "1"),
    ("inconclusive", "what an inconclusive comparison becomes: xfail, fail or warn (default xfail)", "xfail"),
    ("undecided-night", "exit status of a night that decides no gate (every gate inconclusive, or comparisons "
                        "skipped because the run fell back to local processes): fail (exit 1, one line says why) "
                        "or pass (default fail)", "fail"),
    ("fabric-rate", "emulated link rate override NAME=MBIT, comma-separated (e.g. eth=200)", None),
    ("fabric-link-gbit", "declared per-node link rate NAME=GBIT, comma-separated (e.g. eth=80,ib=3200): what the "
                         "physical floor and the prediction assume for that fabric (default: the emulated rate on "
                         "the emulated cluster, else the fabric's nominal rate)", None),
    ("floor-tolerance", "how far a measured step may appear to beat the physical floor, as a fraction of the link "
                        f"rate, before it is an error (default {DEFAULT_RATE_TOLERANCE:.2f})",
     f"{DEFAULT_RATE_TOLERANCE:.2f}"),
    ("device", "where ranks compute: auto (cuda when visible, else cpu), cpu, cuda (default auto)", "auto"),
    ("fsdp", "FSDP version: 2 (fully_shard, default) or 1 (FullyShardedDataParallel, size-based wrap; GPU only)",
     "2"),
    ("mixed-precision", "auto (bf16 on GPU, fp32 on CPU), bf16 or fp32 (default auto)", "auto"),
    ("gpu-memory", "GiB of memory per GPU for the pre-launch memory check (a shape predicted not to fit is "
                   "refused with what to change) (default: what nvidia-smi reports where ranks run on this "
                   "machine's GPUs, else no check)", None),
    ("fabric-save", "write this run's results to this JSON file (atomically) for later baselines and reports", None),
    ("fabric-metrics", "write the night as OpenMetrics text to this file (GitLab metrics report, node_exporter "
                       "textfile collector)", None),
    ("fabric-benchmark-json", "write the night in Bencher Metric Format to this file (value with lower and upper "
                              "bounds per measure, for benchmark trackers)", None),
    ("fabric-baseline", "a previous run (saved JSON, JUnit XML, or a `pytest-fabric baseline` file) to test "
                        "for regressions against", None),
    ("regression-on", "what the regression gate judges: fabric-time (the time crossing the fabric adds to a "
                      "step: tonight's n-node step less the same night's one-node step, on the baseline's "
                      "one-node step, so a faster or slower machine cancels), scaling (n-node over one-node "
                      "tokens/s/GPU) or tokens (raw tokens/s) (default fabric-time)", "fabric-time"),
    ("family-wise", "how the night's gates share the allowance for false failures: bonferroni (a failure must "
                    "hold at the error allowance over the number of gates collected) or none (each gate alone) "
                    "(default bonferroni)", "bonferroni"),
    ("regression-threshold", "fail a configuration whose tokens/s fell more than this fraction below its "
                             "baseline (default 0.10)", "0.10"),
    ("fabric-suite", "TOML file of gate thresholds and expected values per model x nodes x fabric", None),
    ("model-path", "directory of a Hugging Face checkpoint to load (global rank 0 reads it and broadcasts); "
                   "default: random weights from the config", None),
    ("fabric-flops", "FLOP/s one rank achieves, for the prediction shown next to each comparison (e.g. the "
                     "fitted value `pytest-fabric calibrate` prints); default: fitted to the faster fabric's "
                     "measured step", None),
]
# Each option's default, from its row above: the one place it is written.
_DEFAULTS = {name: default for name, _, default in _OPTIONS if default is not None}
_FLAGS = [
    ("activation-checkpointing", "recompute each decoder layer's activations in backward (non-reentrant)"),
    ("accept-no-gdr", "accept GPU runs on RDMA fabrics (ib, roce, efa) without GPUDirect RDMA (by default the "
                      "NCCL log must show /GDRDMA channels and pre-flight must find nvidia_peermem or DMA-BUF)"),
]
# On/off switches whose default is decided per run: --NAME and --no-NAME (ini fabric_NAME: auto, on, off).
_TOGGLES = [
    ("compile", "per-block torch.compile in torchtitan's order (activation checkpointing, compile each decoder "
                "block, then fully_shard); --no-compile runs eager (default: on GPUs, off on CPU)"),
]
_LINELISTS = [
    ("fabric_define", "user fabrics, one 'NAME: BASE' per line (e.g. 'roce-dc2: roce')"),
    ("fabric_env", "fabric settings, one 'FABRIC.VARIABLE=VALUE' per line (e.g. 'ib.NCCL_IB_HCA==mlx5_0,mlx5_1')"),
    ("fabric_price", "price of a GPU-hour in USD per fabric, one 'FABRIC = USD' per line (e.g. 'ib = 3.50')"),
    ("fabric_inventory", "NICs each node has per fabric, one 'FABRIC.nics = N' or 'FABRIC.gbit_per_nic = GBIT' per "
                         "line (e.g. 'ib.nics = 8', 'ib.gbit_per_nic = 400'): the transport proof fails a run that "
                         "used fewer or slower ones (default: what each node's sysfs shows)"),
]
# Each choice list from its owner, the default first.
_CHOICES = {"inconclusive": INCONCLUSIVE_POLICIES, "compile": ("auto", "on", "off"), "undecided-night": ("fail", "pass"),
            "ssh-host-key-checking": STRICT_HOST_KEY_CHECKING, "device": DEVICES,
            "fsdp": tuple(str(v) for v in FSDP_VERSIONS), "mixed-precision": MIXED_PRECISION,
            "regression-on": REGRESSION_MEASURES, "family-wise": FAMILY_RULES}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("fabric", "pytest-fabric: interconnect fabric comparisons")
    for name, help_text, default in _OPTIONS:
        dest = _dest(name)
        group.addoption(f"--{name}", dest=dest, default=None, help=help_text)
        parser.addini(dest, help=f"default for --{name}: {help_text}", default=default)
    for name, help_text in _FLAGS:
        dest = _dest(name)
        group.addoption(f"--{name}", dest=dest, action="store_true", default=None, help=help_text)
        # A string, parsed by _flag: pytest's own bool parsing (and its wording) changes between versions.
        parser.addini(dest, help=f"default for --{name}: {help_text} (true/false)", type="string", default="false")
    group.addoption("--fabric-price", dest="fabric_price_cli", default=None, metavar="FABRIC=USD,...",
                    help="price of a GPU-hour per fabric, comma-separated (e.g. ib=3.50,eth=2.90); overrides ini "
                         "fabric_price per fabric; saved with --fabric-save, priced in the summary and reports")
    group.addoption("--fabric-env", dest="fabric_env_cli", action="append", default=[],
                    metavar="FABRIC.VAR=VALUE", help="override one fabric setting (repeatable); adds to ini fabric_env")
    for name, help_text in _TOGGLES:
        dest = _dest(name)
        group.addoption(f"--{name}", dest=dest, action="store_const", const="on", default=None, help=help_text)
        group.addoption(f"--no-{name}", dest=dest, action="store_const", const="off", help=f"see --{name}")
        parser.addini(dest, help=f"default for --{name}: auto, on or off", default="auto")
    for dest, help_text in _LINELISTS:
        parser.addini(dest, help=help_text, type="linelist", default=[])


def _dest(name: str) -> str:
    """The option's dest and ini key: fabric_<name> (``--fabric-rate`` is ``fabric_rate``)."""
    name = name.replace("-", "_")
    return name if name.startswith("fabric_") else f"fabric_{name}"


def _raw(config: pytest.Config, name: str) -> str | None:
    """The command line's value, else the ini's, else the option's default in ``_OPTIONS`` (its one
    definition; an empty ini value also falls back to it); None when none gives one."""
    cli = config.getoption(_dest(name))
    if cli is not None:
        return str(cli)
    ini = config.getini(_dest(name))
    return str(ini) if ini not in (None, "") else _DEFAULTS.get(name)


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
    value = _raw(config, name) or _CHOICES[name][0]
    if value not in _CHOICES[name]:
        raise pytest.UsageError(f"--{name}: {value!r} is not one of {', '.join(_CHOICES[name])}")
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
    if config.getoption(_dest(name)):
        return True
    value = str(config.getini(_dest(name))).strip()
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise pytest.UsageError(f"ini {_dest(name)}: {value!r} is not a boolean; write true or false")


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

    def cluster_options(self) -> ClusterOptions:
        """What the cluster is built with (make_cluster)."""
        return ClusterOptions(self.hostfile, self.ssh_config, self.ssh_host_key_checking, self.srun_args,
                              self.launch_prefix, self.rank_env)


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
        fabric_table=table,
        device=device,
        fsdp=fsdp,
        mixed_precision=_choice(config, "mixed-precision"),
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
    hostfile = _raw(config, "hostfile")
    _check_file(hostfile, "hostfile", "write one host per line")
    ssh_config = _raw(config, "ssh-config")
    _check_file(ssh_config, "ssh-config", "give an ssh_config file (ssh -F), or leave the option out")
    return FabricOptions(
        nodes=_int(config, "nodes", 1),
        fabrics=fabrics or DEFAULT_FABRICS,
        models=models or DEFAULT_CPU_MODELS,
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
