"""The options pytest-fabric declares: each one's name, help and default, written once.

Every option is a command-line flag and an ini / ``pyproject.toml`` key (``fabric_<name>``);
``options.parse`` reads them into a ``FabricOptions``.
"""

from __future__ import annotations


import pytest

from ..cluster import CLUSTER_KINDS
from ..physics.floor import DEFAULT_RATE_TOLERANCE
from ..core.fabrics import DEFAULT_FABRICS, FABRICS
from ..cluster.ssh import STRICT_HOST_KEY_CHECKING
from ..deciding.gates import INCONCLUSIVE_POLICIES, REGRESSION_MEASURES
from ..core.models import DEFAULT_CPU_MODELS, MODELS
from ..deciding.sequential import FAMILY_RULES
from ..deciding.rounds import RERUNS
from ..workload.config import DEVICES, FSDP_VERSIONS, MIXED_PRECISION, REDUCE_DTYPES

# name, help, default (as the ini string)
OPTIONS: list[tuple[str, str, str | None]] = [
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
    ("warmup-steps", "warm-up steps per launch at least, excluded from the figures; from 2, warm-up goes on until "
                     "two consecutive steps agree within 10%%, at most 10 steps (default 2)", "2"),
    ("batch-size", "micro-batch per rank (default: the model's own)", None),
    ("seq-len", "sequence length (default: the model's own)", None),
    ("launch-timeout", "seconds one launch may take before every rank is killed (default 300)", "300"),
    ("collective-timeout", "seconds a rank waits in one collective before its process group gives up with an "
                           "error naming it (gloo's timeout, NCCL's watchdog): it must be below --launch-timeout, "
                           "so that a hang ends there, with every rank's stack, before the deadline (default: a "
                           "third of --launch-timeout, at most 120; raise it where global rank 0 reads a large "
                           "checkpoint while the others wait)", None),
    ("repeats", "launches per side before a comparison is first judged (default 2)", "2"),
    ("max-repeats", "launches per side a comparison may take while inconclusive (default 6)", "6"),
    ("night-budget", "the night's wall time, such as 45m, 1h30m or 2700s: each comparison's most launches per side "
                     "are set from it before its first look, so that the night ends in time (never below --repeats, "
                     "never above --max-repeats; the plan printed before the first launch says how many)", None),
    ("night-costs", "a night saved with --fabric-save (or a session's results directory, or a baseline built "
                    "from such nights) on this cluster: the plan takes each launch's expected wall time from its "
                    "launches (default: the --fabric-baseline's, else a stated guess per launch kind)", None),
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
    ("sharding", "comma-separated layouts, an axis of the matrix: full (FSDP over every rank) and hybrid (HSDP: "
                 "sharded within a node, replicated across nodes; only gradients cross the fabric) (default full)",
     "full"),
    ("reduce-dtype", "what gradients are reduced in under bf16 compute: fp32 (torchtitan's default) or bf16 (half "
                     "the reduction's bytes) (default fp32)", "fp32"),
    ("grad-accum", "micro-batches per optimizer step: gradients accumulate unsharded and are reduced once per "
                   "step, so each exchange carries that much more compute (default 1)", "1"),
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
DEFAULTS = {name: default for name, _, default in OPTIONS if default is not None}
FLAGS = [
    ("activation-checkpointing", "recompute each decoder layer's activations in backward (non-reentrant)"),
    ("accept-no-gdr", "accept GPU runs on RDMA fabrics (ib, roce, efa) without GPUDirect RDMA (by default the "
                      "NCCL log must show /GDRDMA channels and pre-flight must find nvidia_peermem or DMA-BUF)"),
]
# On/off switches whose default is decided per run: --NAME and --no-NAME (ini fabric_NAME: auto, on, off).
TOGGLES = [
    ("compile", "per-block torch.compile in torchtitan's order (activation checkpointing, compile each decoder "
                "block, then fully_shard); --no-compile runs eager (default: on GPUs, off on CPU)"),
]
LINELISTS = [
    ("fabric_define", "user fabrics, one 'NAME: BASE' per line (e.g. 'roce-dc2: roce')"),
    ("fabric_env", "fabric settings, one 'FABRIC.VARIABLE=VALUE' per line (e.g. 'ib.NCCL_IB_HCA==mlx5_0,mlx5_1')"),
    ("fabric_price", "price of a GPU-hour in USD per fabric, one 'FABRIC = USD' per line (e.g. 'ib = 3.50')"),
    ("fabric_inventory", "NICs each node has per fabric, one 'FABRIC.nics = N' or 'FABRIC.gbit_per_nic = GBIT' per "
                         "line (e.g. 'ib.nics = 8', 'ib.gbit_per_nic = 400'): the transport proof fails a run that "
                         "used fewer or slower ones (default: what each node's sysfs shows)"),
]
# Each choice list from its owner, the default first.
CHOICES = {"inconclusive": INCONCLUSIVE_POLICIES, "compile": ("auto", "on", "off"), "undecided-night": ("fail", "pass"),
            "ssh-host-key-checking": STRICT_HOST_KEY_CHECKING, "device": DEVICES,
            "fsdp": tuple(str(v) for v in FSDP_VERSIONS), "mixed-precision": MIXED_PRECISION,
            "reduce-dtype": REDUCE_DTYPES,
            "regression-on": REGRESSION_MEASURES, "family-wise": FAMILY_RULES}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("fabric", "pytest-fabric: interconnect fabric comparisons")
    for name, help_text, default in OPTIONS:
        key = dest(name)
        group.addoption(f"--{name}", dest=key, default=None, help=help_text)
        parser.addini(key, help=f"default for --{name}: {help_text}", default=default)
    for name, help_text in FLAGS:
        key = dest(name)
        group.addoption(f"--{name}", dest=key, action="store_true", default=None, help=help_text)
        # A string, parsed by _flag: pytest's own bool parsing (and its wording) changes between versions.
        parser.addini(key, help=f"default for --{name}: {help_text} (true/false)", type="string", default="false")
    group.addoption("--fabric-price", dest="fabric_price_cli", default=None, metavar="FABRIC=USD,...",
                    help="price of a GPU-hour per fabric, comma-separated (e.g. ib=3.50,eth=2.90); overrides ini "
                         "fabric_price per fabric; saved with --fabric-save, priced in the summary and reports")
    group.addoption("--fabric-env", dest="fabric_env_cli", action="append", default=[],
                    metavar="FABRIC.VAR=VALUE", help="override one fabric setting (repeatable); adds to ini fabric_env")
    for name, help_text in TOGGLES:
        key = dest(name)
        group.addoption(f"--{name}", dest=key, action="store_const", const="on", default=None, help=help_text)
        group.addoption(f"--no-{name}", dest=key, action="store_const", const="off", help=f"see --{name}")
        parser.addini(key, help=f"default for --{name}: auto, on or off", default="auto")
    for key, help_text in LINELISTS:
        parser.addini(key, help=help_text, type="linelist", default=[])


def dest(name: str) -> str:
    """The option's dest and ini key: fabric_<name> (``--fabric-rate`` is ``fabric_rate``)."""
    name = name.replace("-", "_")
    return name if name.startswith("fabric_") else f"fabric_{name}"
