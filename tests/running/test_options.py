"""The plugin through pytest itself (in-process, nothing launched): options, bad input, ids, markers, header."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
import subprocess
import sys

import pytest
from helpers import needs

from pytest_fabric import FABRICS, MODELS

MATRIX_TEST = """
import pytest

@pytest.mark.fabric_matrix()
def test_step(fabric_case):
    pass
"""

CPUS = len(os.sched_getaffinity(0))


def collected_ids(result) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def ids(pytester, *args, source: str = MATRIX_TEST) -> list[str]:
    pytester.makepyfile(test_matrix_ids=source)
    result = pytester.runpytest("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    return [i.split("[", 1)[1].rstrip("]") if "[" in i else i for i in collected_ids(result)]


# -- options ---------------------------------------------------------------------------------------

def test_help_lists_every_option_in_its_group(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["pytest-fabric: interconnect fabric comparisons:"])
    text = result.stdout.str()
    for option in ("--nodes", "--gpus-per-node", "--fabrics", "--models", "--cluster", "--steps", "--warmup-steps",
                   "--batch-size", "--seq-len", "--launch-timeout", "--fabric-rate"):
        assert option in text, f"{option} missing from --help"
    # The help names what can be chosen.
    assert all(name in text for name in FABRICS)


BAD_INPUT = [
    (["--nodes", "0"], "--nodes must be an integer >= 1, got 0"),
    (["--nodes", "two"], "--nodes must be an integer >= 1, got 'two'"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be an integer >= 1, got 0"),
    (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["--warmup-steps", "-1"], "--warmup-steps must be an integer >= 0, got -1"),
    (["--batch-size", "1.5"], "--batch-size must be an integer >= 1, got '1.5'"),
    (["--seq-len", "0"], "--seq-len must be an integer >= 1, got 0"),
    (["--fabrics", "ib,infiniband"], "--fabrics: unknown 'infiniband'; choose from: ib, roce, efa, eth*"),
    (["--fabrics", ","], "--fabrics: unknown empty value; choose from: *"),
    (["--models", "gpt-5"], "--models: unknown 'gpt-5'; choose from: *qwen2-tiny*"),
    (["--cluster", "k8s"], "--cluster: unknown cluster 'k8s'; choose from: auto, emulated, local*"),
    (["--launch-timeout", "0"], "--launch-timeout must be a positive number of seconds, got '0'"),
    (["--launch-timeout", "soon"], "--launch-timeout must be a positive number of seconds, got 'soon'"),
    (["--collective-timeout", "0"], "--collective-timeout must be a positive number such as 60, got '0'"),
    (["--collective-timeout", "300"], "--collective-timeout 300 is not below --launch-timeout 300: *"
                                      "--collective-timeout 100) or raise --launch-timeout"),
    (["--launch-timeout", "60", "--collective-timeout", "90"], "--collective-timeout 90 is not below "
                                                                "--launch-timeout 60*--collective-timeout 20)*"),
    (["--fabric-rate", "eth"], "--fabric-rate: 'eth' is not NAME=MBIT*(e.g. --fabric-rate eth=200)"),
    (["--fabric-rate", "eth=fast"], "--fabric-rate: 'eth=fast' is not NAME=MBIT*"),
    (["--fabric-rate", "eth=0"], "--fabric-rate: 'eth=0' is not NAME=MBIT*"),
    (["--fabric-rate", "eth=-100"], "--fabric-rate: 'eth=-100' is not NAME=MBIT*"),
    (["--fabric-rate", "ib=4000,ethernet=100"], "*'ethernet'*ib, roce, efa, eth*"),
    (["--fabric-price", "ib"], "--fabric-price: 'ib' is not FABRIC = USD_PER_GPU_HOUR*'ib = 3.50'*"
                               "--fabric-price ib=3.50,eth=2.90"),
    (["--fabric-price", "ib=free"], "--fabric-price: 'ib=free' is not FABRIC = USD_PER_GPU_HOUR*"),
    (["--fabric-price", "ib=3.5,eth=0"], "--fabric-price: 'eth=0' is not FABRIC = USD_PER_GPU_HOUR*"),
    (["--fabric-price", "ib=3.5,myrinet=1"], "--fabric-price: 'myrinet=1' prices an unknown fabric 'myrinet'; "
                                             "known fabrics: ib, roce, efa, eth"),
    (["--fabric-link-gbit", "eth"], "--fabric-link-gbit: 'eth' is not NAME=GBIT*(e.g. --fabric-link-gbit eth=80)"),
    (["--fabric-link-gbit", "eth=0"], "--fabric-link-gbit: 'eth=0' is not NAME=GBIT*"),
    (["--fabric-link-gbit", "myrinet=10"], "*declared link rate for unknown fabric 'myrinet'; known fabrics: *"),
    (["--floor-tolerance", "1"], "--floor-tolerance must be a fraction in (0, 1), got '1'"),
    (["--floor-tolerance", "ten"], "--floor-tolerance must be a fraction in (0, 1), got 'ten'"),
    (["--fabric-flops", "fast"], "--fabric-flops must be a positive number such as 4e14, got 'fast'"),
    (["--fabric-flops", "0"], "--fabric-flops must be a positive number such as 4e14, got '0'"),
    (["--nodes", "251"], "--nodes 251: the emulated cluster has 250 nodes; use --nodes 250 or fewer"),
    (["--sharding", "zero3"], "--sharding: unknown 'zero3'; choose from: full, hybrid"),
    (["--reduce-dtype", "fp8"], "--reduce-dtype: 'fp8' is not one of fp32, bf16"),
    (["--grad-accum", "0"], "--grad-accum*"),
    # containers and the ranks' environment (a value that starts with '-' is given as --opt=VALUE)
    (["--launch-prefix", "apptainer exec '/images/pt.sif"], "--launch-prefix: cannot split *"),
    (["--srun-args=--container-image='nvcr.io#nvidia/pytorch"], "--srun-args: cannot split *"),
    (["--srun-args=--container-image=pt.sqsh --nodes=4"], "--srun-args: '--nodes=4': the launcher sets --nodes "
                                                           "itself*"),
    (["--srun-args=--nodel=gpu-001"], "--srun-args: '--nodel=gpu-001': the launcher sets --nodelist itself*"),
    (["--srun-args=-w gpu-001"], "--srun-args: '-w': -w is --nodelist, which the launcher sets itself*"),
    (["--srun-args=-N2"], "--srun-args: '-N2': -N is --nodes, which the launcher sets itself*"),
    (["--srun-args=--container-image=pt.sqsh -- sh"], "--srun-args: '--' would end srun's options*"),
    (["--rank-env", "LD_LIBRARY_PATH,2FAST"], "--rank-env: '2FAST' is not a variable name*"),
    (["--rank-env", "HF_HOME,HF_TOKEN"], "--rank-env: HF_TOKEN looks like a secret*"),
    (["--cluster", "local", "--launch-prefix", "apptainer exec --nv pt.sif"],
     "--cluster local: --launch-prefix is for the ssh and slurm clusters; the local cluster would start its "
     "ranks without it*"),
    (["--cluster", "local", "--srun-args=--container-image=pt.sqsh"],
     "--cluster local: --srun-args is for the slurm cluster's srun step*"),
    (["--cluster", "local", "--nodes", str(4 * CPUS + 1)],
     f"--nodes {4 * CPUS + 1}: the local cluster has {4 * CPUS} nodes; use --nodes {4 * CPUS} or fewer"),
    (["--nodes", "2", "--gpus-per-node", str(2 * CPUS + 1)],
     f"--nodes 2 x --gpus-per-node {2 * CPUS + 1} = {4 * CPUS + 2} ranks, but the emulated cluster runs every "
     f"rank on this machine and allows at most {4 * CPUS}; lower --nodes or --gpus-per-node"),
]


def test_the_collective_timeout_is_the_user_s_below_the_deadline(pytester):
    pytester.makeini("[pytest]\nfabric_collective_timeout = 45\n")
    pytester.makepyfile(test_opts="""
        from pytest_fabric.measuring.measure import LaunchSettings

        def test_options(fabric_session):
            s = fabric_session.options.settings
            assert (s.collective_timeout(), s.launch_timeout_s) == (45.0, 300.0)
            assert LaunchSettings(launch_timeout_s=3600).collective_timeout() == 120.0
    """)
    pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_a_usage_error_that_says_what_is_allowed(pytester, args, message):
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("args", [["--fabric-rate", "eth=nan"], ["--fabric-rate", "eth=inf"],
                                  ["--launch-timeout", "nan"], ["--launch-timeout", "inf"]],
                         ids=["rate-nan", "rate-inf", "timeout-nan", "timeout-inf"])
def test_non_finite_numbers_are_usage_errors(pytester, args):
    # float("nan") <= 0 is False: a plain positivity check lets NaN through to tc and torchrun.
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {args[0]}*"])


def test_ini_values_are_validated_like_the_command_line(pytester):
    pytester.makeini("[pytest]\nfabric_nodes = 0\n")
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --nodes must be an integer >= 1, got 0"])


def test_ini_prices_are_validated_and_say_what_to_write(pytester):
    pytester.makeini("[pytest]\nfabric_price =\n    ib = 3.50\n    eth: 2.90\n")
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini fabric_price: 'eth: 2.90' is not FABRIC = USD_PER_GPU_HOUR*"
                                 "'ib = 3.50' per line*"])


def test_prices_from_ini_and_command_line_per_fabric(pytester):
    pytester.makeini("[pytest]\nfabric_price =\n    ib = 3.50\n    # a comment\n    eth = 2.90\n")
    pytester.makepyfile(test_opts="""
        def test_options(fabric_session):
            assert fabric_session.options.prices == {"ib": 4.0, "eth": 2.9, "roce": 3.0}
            assert fabric_session.options.flops_per_rank == 2e10
    """)
    result = pytester.runpytest("--fabric-price", "ib=4, roce=3", "--fabric-flops", "2e10")
    result.assert_outcomes(passed=1)


def test_transport_proof_settings_from_ini_and_command_line(pytester):
    pytester.makeini("[pytest]\nfabric_inventory =\n    ib.nics = 8\n    ib.gbit_per_nic = 400\n    efa.nics = 32\n")
    pytester.makepyfile(test_opts="""
        from pytest_fabric.measuring.nic_inventory import NicInventory

        def test_options(fabric_session):
            settings = fabric_session.options.settings
            assert settings.inventory == {"ib": NicInventory(8, 400.0), "efa": NicInventory(32)}
            assert settings.require_gdr is EXPECTED
    """.replace("EXPECTED", "False"))
    pytester.runpytest("--accept-no-gdr").assert_outcomes(passed=1)
    pytester.makepyfile(test_opts=pytester.path.joinpath("test_opts.py").read_text().replace("is False", "is True"))
    pytester.runpytest().assert_outcomes(passed=1)


def test_ini_sets_defaults_and_the_command_line_wins(pytester):
    pytester.makeini("[pytest]\nfabric_fabrics = eth\nfabric_models = llama-wide\nfabric_nodes = 4\n")
    assert ids(pytester) == ["llama-wide-n1-eth", "llama-wide-n2-eth", "llama-wide-n4-eth"]
    assert ids(pytester, "--fabrics", "ib", "--nodes", "1") == ["llama-wide-n1-ib"]


# -- ids -------------------------------------------------------------------------------------------

def test_the_sharding_axis_names_its_layout_in_the_ids(pytester):
    got = ids(pytester, "--models", "qwen2-tiny", "--fabrics", "eth", "--sharding", "full,hybrid")
    assert got == ["qwen2-tiny-n1-eth", "qwen2-tiny-n2-eth", "qwen2-tiny-n2-eth-hybrid"]
    pytester.makeini("[pytest]\nfabric_sharding = hybrid\n")
    assert ids(pytester, "--models", "qwen2-tiny", "--fabrics", "eth") == ["qwen2-tiny-n1-eth", "qwen2-tiny-n2-eth-hybrid"]


def test_default_matrix_ids(pytester):
    assert ids(pytester) == [
        "qwen2-tiny-n1-ib", "qwen2-tiny-n1-eth", "qwen2-tiny-n2-ib", "qwen2-tiny-n2-eth",
        "llama-wide-n1-ib", "llama-wide-n1-eth", "llama-wide-n2-ib", "llama-wide-n2-eth",
    ]


@pytest.mark.parametrize(("nodes", "expected"), [("1", [1]), ("2", [1, 2]), ("3", [1, 2]), ("4", [1, 2, 4]),
                                                 ("8", [1, 2, 4, 8])])
def test_nodes_axis_is_powers_of_two_up_to_nodes(pytester, nodes, expected):
    got = ids(pytester, "--nodes", nodes, "--models", "qwen2-tiny", "--fabrics", "eth")
    assert got == [f"qwen2-tiny-n{n}-eth" for n in expected]


def test_session_order_of_models_and_fabrics_is_kept(pytester):
    got = ids(pytester, "--nodes", "2", "--models", "llama-wide,qwen2-tiny", "--fabrics", "eth,ib,eth")
    assert got == ["llama-wide-n1-eth", "llama-wide-n1-ib", "llama-wide-n2-eth", "llama-wide-n2-ib",
                   "qwen2-tiny-n1-eth", "qwen2-tiny-n1-ib", "qwen2-tiny-n2-eth", "qwen2-tiny-n2-ib"]


MARKED = """
import pytest

@pytest.mark.fabric_matrix(models=["llama-wide", "qwen2.5-72b"])
def test_models(fabric_case):
    pass

@pytest.mark.fabric_matrix(fabrics=["eth", "roce"], min_nodes=2)
def test_fabrics(fabric_case):
    pass

@pytest.mark.fabric_matrix(nodes=[2, 3, 16])
def test_nodes(fabric_case):
    pass

@pytest.mark.fabric_matrix(models=["qwen2.5-72b"])
def test_nothing_selected(fabric_case):
    pass

def test_plain():
    pass
"""


def test_markers_only_restrict_what_the_session_selects(pytester):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest("--collect-only", "-q", "--nodes", "4", "--models", "qwen2-tiny,llama-wide",
                                "--fabrics", "ib,eth")
    got = collected_ids(result)
    # A model the session did not select gives an empty parameter set (skipped, not launched).
    empty = [i for i in got if i.startswith("test_marked.py::test_nothing_selected[")]
    assert len(empty) == 1
    assert [i for i in got if i not in empty] == [
        "test_marked.py::test_models[llama-wide-n1-ib]", "test_marked.py::test_models[llama-wide-n1-eth]",
        "test_marked.py::test_models[llama-wide-n2-ib]", "test_marked.py::test_models[llama-wide-n2-eth]",
        "test_marked.py::test_models[llama-wide-n4-ib]", "test_marked.py::test_models[llama-wide-n4-eth]",
        "test_marked.py::test_fabrics[qwen2-tiny-n2-eth]", "test_marked.py::test_fabrics[qwen2-tiny-n4-eth]",
        "test_marked.py::test_fabrics[llama-wide-n2-eth]", "test_marked.py::test_fabrics[llama-wide-n4-eth]",
        "test_marked.py::test_nodes[qwen2-tiny-n2-ib]", "test_marked.py::test_nodes[qwen2-tiny-n2-eth]",
        "test_marked.py::test_nodes[qwen2-tiny-n3-ib]", "test_marked.py::test_nodes[qwen2-tiny-n3-eth]",
        "test_marked.py::test_nodes[llama-wide-n2-ib]", "test_marked.py::test_nodes[llama-wide-n2-eth]",
        "test_marked.py::test_nodes[llama-wide-n3-ib]", "test_marked.py::test_nodes[llama-wide-n3-eth]",
        "test_marked.py::test_plain",
    ]


def test_empty_selection_is_skipped_not_launched(pytester):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest("-k", "nothing_selected", "-rs", "--nodes", "2")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*got empty parameter set*"])
    assert "fabric throughput" not in result.stdout.str()


def test_misspelled_marker_argument_is_reported(pytester):
    pytester.makepyfile(test_typo="""
        import pytest

        @pytest.mark.fabric_matrix(node=[2])
        def test_step(fabric_case):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_typo.py::test_step: fabric_matrix got unknown argument(s) node; "
                                 "allowed: models, nodes, fabrics, exclude_fabrics, min_nodes*"])


def test_exclude_fabrics_compares_every_other_selected_fabric_including_defined_ones(pytester):
    # The embedded comparison suites exclude the reference: a fabric defined in the ini is a candidate too.
    pytester.makeini("[pytest]\nfabric_define = roce-dc2: roce\n")
    pytester.makepyfile(test_candidates="""
        import pytest

        @pytest.mark.fabric_matrix(nodes=[2], exclude_fabrics=["ib"])
        def test_candidate(fabric_case):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q", "--nodes", "2", "--models", "qwen2-tiny",
                                "--fabrics", "ib,roce-dc2,eth")
    assert collected_ids(result) == ["test_candidates.py::test_candidate[qwen2-tiny-n2-roce-dc2]",
                                     "test_candidates.py::test_candidate[qwen2-tiny-n2-eth]"]


def test_every_known_model_and_fabric_can_be_selected(pytester):
    got = ids(pytester, "--nodes", "1", "--models", ",".join(MODELS), "--fabrics", ",".join(FABRICS))
    assert got == [f"{m}-n1-{f}" for m in MODELS for f in FABRICS]


# -- header, fixtures and skips ----------------------------------------------------------------------

def test_header_shows_cluster_fabrics_rates_and_results_directory(pytester):
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest("--nodes", "2", "--fabrics", "ib,eth", "--fabric-rate", "eth=200",
                                "--models", "qwen2-tiny", "--steps", "3", "--warmup-steps", "1")
    result.stdout.fnmatch_lines([
        "fabric: cluster emulated*; nodes up to 2 x 1 per node",
        f"fabric: fabrics ib, eth (emulated links: ib {FABRICS['ib'].emulated_mbit:g} Mbit/s, eth 200 Mbit/s)",
        "fabric: models qwen2-tiny; 1 warm-up + at least 3 measured steps, then until 6 s of measured steps "
        "(at most 200 steps), the same window for every launch; results in */fabric-runs/*",
    ])


def test_container_options_reach_the_cluster_and_its_header_line(pytester):
    """--launch-prefix and --rank-env from ini (several lines) or the command line: split as a shell
    would and shown in the header's cluster line (the cluster's describe(), also what every result
    records as its cluster). Collection only: no host is contacted."""
    pytester.path.joinpath("hosts").write_text("gpu-001\ngpu-002\n")
    pytester.makeini("[pytest]\nfabric_rank_env =\n    LD_LIBRARY_PATH,\n    HF_HOME\n"
                     "fabric_launch_prefix = apptainer exec --nv '/images/py torch.sif'\n")
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest("--collect-only", "--cluster", "ssh", "--hostfile", "hosts")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    # The quoted image path is one word: shown quoted again.
    result.stdout.fnmatch_lines(["fabric: cluster ssh (2 hosts from hosts; prefix apptainer exec --nv "
                                 "'/images/py torch.sif'; rank env LD_LIBRARY_PATH,HF_HOME); nodes up to 2 *"])
    # The command line wins; an empty value clears the ini's.
    result = pytester.runpytest("--collect-only", "--cluster", "ssh", "--hostfile", "hosts", "--launch-prefix=",
                                "--rank-env", "A_B")
    result.stdout.fnmatch_lines(["fabric: cluster ssh (2 hosts from hosts; rank env A_B); nodes up to 2 *"])


def test_srun_args_reach_the_slurm_cluster_and_its_header_line(pytester, monkeypatch):
    """pyxis's options as a user types them: one quoted value with spaces (taken as a value though it
    starts with '--'), or --srun-args=VALUE; nothing is launched, so no Slurm daemon is asked."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[001-008]")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "8")
    if shutil.which("srun") is None:
        needs("the Slurm client commands (the slurm cluster is built only where srun is on PATH)")
    pytester.makepyfile(test_any="def test_nothing(): pass")
    pyxis = "--container-image=nvcr.io#nvidia/pytorch:24.05-py3 --container-mounts=/lustre:/lustre"
    for args in (["--srun-args", pyxis], [f"--srun-args={pyxis}"]):
        result = pytester.runpytest("--collect-only", "--cluster", "slurm", *args)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        shown = shlex.join(pyxis.split())  # as a shell would take it back ('#' quoted)
        result.stdout.fnmatch_lines([f"fabric: cluster slurm (job 4242 on gpu-[[]001-008]; srun {shown}); "
                                     "nodes up to 8 *"])


def test_header_shows_a_fixed_step_count_without_adaptive_measuring(pytester):
    pytester.makepyfile(test_any="def test_nothing(): pass")
    result = pytester.runpytest("--nodes", "2", "--models", "qwen2-tiny", "--steps", "3", "--warmup-steps", "1",
                                "--measure-seconds", "0")
    result.stdout.fnmatch_lines(["fabric: models qwen2-tiny; 1 warm-up + 3 measured steps; results in */fabric-runs/*"])


COMPARISON = """
import pytest

@pytest.mark.fabric_comparison
@pytest.mark.fabric_matrix(min_nodes=2, fabrics=["eth"])
def test_compare(fabric_case):
    pass

@pytest.mark.fabric_matrix(min_nodes=2, fabrics=["eth"])
def test_throughput(fabric_case, fabric_cluster):
    assert fabric_cluster.name == "local"
"""


def test_comparisons_are_skipped_on_the_local_cluster_with_the_reason(pytester):
    pytester.makepyfile(test_cmp=COMPARISON)
    result = pytester.runpytest("--cluster", "local", "--models", "qwen2-tiny", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*fabric comparison needs distinct fabrics: the local cluster runs every "
                                 "fabric over the same links*"])
    # No emulated link rates are claimed for a cluster that does not shape links.
    assert "emulated links" not in result.stdout.str()


def test_comparisons_run_on_the_emulated_cluster(pytester):
    pytester.makepyfile(test_cmp=COMPARISON.replace('"local"', '"emulated"'))
    result = pytester.runpytest("--cluster", "emulated", "--models", "qwen2-tiny")
    result.assert_outcomes(passed=2)


def test_session_fixture_exposes_the_parsed_options(pytester):
    pytester.makepyfile(test_opts="""
        def test_options(fabric_session):
            o = fabric_session.options
            assert o.fabrics == ("eth", "ib")
            assert o.models == ("llama-wide",)
            s = o.settings
            assert (s.steps, s.warmup_steps, s.batch_size, s.seq_len, s.launch_timeout_s) == (5, 0, 3, 128, 42.0)
            assert s.fabric("eth").emulated_mbit == 123
            # Not given: a third of the launch deadline, at most 120 s.
            assert s.collective_timeout_s is None and s.collective_timeout() == 14.0
    """)
    result = pytester.runpytest("--fabrics", "eth,ib", "--models", "llama-wide", "--steps", "5",
                                "--warmup-steps", "0", "--batch-size", "3", "--seq-len", "128",
                                "--launch-timeout", "42", "--fabric-rate", "eth=123")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_run_without_measurements_reports_nothing_and_writes_nothing(pytester, tmp_path, monkeypatch, xdist):
    """The plugin is installed machine-wide: unrelated runs (also under xdist) must leave nothing in $TMPDIR
    or in the run directory."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    pytester.makepyfile(test_matrix_ids=MATRIX_TEST)
    result = pytester.runpytest_subprocess("--models", "qwen2-tiny", "--junitxml", str(tmp_path / "j.xml"), *xdist)
    result.assert_outcomes(passed=4)
    assert "fabric throughput" not in result.stdout.str()
    assert "launch logs and results" not in result.stdout.str()
    assert "system-out" not in (tmp_path / "j.xml").read_text()
    assert not list(tmp_path.glob("pytest-fabric-*")), "a run that measured nothing left a results directory"
    assert not (pytester.path / "fabric-runs").exists(), "a run that measured nothing left a run directory"


def run_as_non_root(pytester, *args):
    """pytest in a user namespace: this process is not root there, so the emulated cluster is unavailable."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "true"]).returncode != 0:
        needs("cannot create a user namespace here (unshare --user)")
    return pytester.run("unshare", "--user", sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args)


def test_auto_falls_back_to_local_and_says_why(pytester):
    pytester.makepyfile(test_cmp=COMPARISON)
    result = run_as_non_root(pytester, "-rs", "--models", "qwen2-tiny")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "fabric: cluster local*",
        "fabric: NOTE emulated cluster unavailable (*needs root*); using local processes without link shaping",
        "SKIPPED*fabric comparison needs distinct fabrics: emulated cluster unavailable (*needs root*",
    ])


def test_explicit_emulated_cluster_without_root_is_a_usage_error(pytester):
    pytester.makepyfile(test_cmp=COMPARISON)
    result = run_as_non_root(pytester, "--cluster", "emulated")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --cluster emulated: the emulated cluster needs root*--cluster local*"])


def test_the_familys_size_is_what_the_suites_collected_whatever_k_selects(pytester):
    """The same launches must get the same verdict under any -k: m counts the comparison tests the
    suites collected, before -k and -m select, and regression gates only where a baseline is given."""
    pytester.makeconftest("""
        from pytest_fabric.running.session import SESSION_KEY

        def pytest_collection_finish(session):
            print("GATES", session.config.stash[SESSION_KEY].gates)
    """)
    pytester.makepyfile(test_night_gates="""
        import pytest

        @pytest.mark.fabric_matrix(nodes=[2], fabrics=["eth"])
        def test_one(fabric_case, fabric_compare):
            pass

        @pytest.mark.fabric_matrix(nodes=[2], fabrics=["eth"])
        def test_two(fabric_case, fabric_compare):
            pass

        @pytest.mark.fabric_regression
        @pytest.mark.fabric_matrix(nodes=[2], fabrics=["eth"])
        def test_regression(fabric_case, fabric_compare):
            pass
    """)
    for selection in ([], ["-k", "one"], ["-k", "not one and not two"]):
        result = pytester.runpytest("--collect-only", "--models", "qwen2-tiny", *selection)
        result.stdout.fnmatch_lines(["GATES 2"])


# -- the pre-night check ---------------------------------------------------------------------------

EXPECTING = """
import pytest
from pytest_fabric import REFERENCE_FABRIC


@pytest.mark.fabric_comparison(expect="within")
@pytest.mark.fabric_matrix(models=["qwen2.5-7b"], exclude_fabrics=[REFERENCE_FABRIC], min_nodes=2)
def test_parity(fabric_case, fabric_compare):
    fabric_compare.within(fabric_case, fabric_case.with_fabric(REFERENCE_FABRIC))


@pytest.mark.fabric_comparison(expect="ahead")
@pytest.mark.fabric_matrix(models=["qwen2.5-7b"], exclude_fabrics=[REFERENCE_FABRIC], min_nodes=2)
def test_advantage(fabric_case, fabric_compare):
    fabric_compare.ahead(fabric_case.with_fabric(REFERENCE_FABRIC), fabric_case)
"""
EIGHT_GPUS = ("--collect-only", "-q", "--nodes", "8", "--gpus-per-node", "8", "--device", "cuda", "--fabrics", "ib,eth")
FLOPS = ("--fabric-flops", "4e14")


def test_a_gate_the_model_predicts_to_fail_is_announced_before_the_night(pytester):
    # 8 GPUs per node on 50 Gbit/s Ethernet against 8 x 400G InfiniBand: a 7B model cannot keep up.
    pytester.makepyfile(test_mine=EXPECTING)
    result = pytester.runpytest(*EIGHT_GPUS, *FLOPS, "--models", "qwen2.5-7b", "--fabric-link-gbit", "ib=3200,eth=50",
                                "--sharding", "full,hybrid")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["fabric: predicted to fail: parity qwen2.5-7b n8 full: predicted eth 9?% slower than "
                                 "ib on 50 against 3200 Gbit/s per node (communication-bound here); the gate needs eth "
                                 "at most 5% slower; hybrid sharding predicted 9?% slower"])
    lines = [line for line in result.stdout.lines if line.startswith("fabric: predicted to fail")]
    assert len(lines) == 6 and all(" parity " in line for line in lines)  # n2, n4, n8 x full, hybrid; advantage holds
    # The same links at the same rate: now the advantage is the gate that cannot hold.
    result = pytester.runpytest(*EIGHT_GPUS, *FLOPS, "--models", "qwen2.5-7b", "--fabric-link-gbit", "ib=3200,eth=3200")
    lines = [line for line in result.stdout.lines if line.startswith("fabric: predicted to fail")]
    assert len(lines) == 3 and all(" advantage " in line and "the gate needs ib at least 20% ahead" in line
                                   for line in lines)


def test_the_shipped_suites_agree_with_the_model_on_the_seed_studys_cluster(pytester):
    pytester.copy_example(str(Path(__file__).resolve().parents[2] / "suites"))
    result = pytester.runpytest(*EIGHT_GPUS, *FLOPS, "--models", "qwen2.5-1.5b,qwen2.5-7b,llama-3.1-8b,qwen2.5-72b,llama-3.1-70b",
                                "--fabric-link-gbit", "ib=3200,eth=50", "--sharding", "full,hybrid")
    result.stdout.fnmatch_lines(["fabric: pre-night check: the model predicts all 30 comparison(s) as their gates expect*"])
    assert "predicted to fail" not in result.stdout.str()


def test_without_a_compute_throughput_nothing_is_predicted(pytester):
    pytester.makepyfile(test_mine=EXPECTING)
    result = pytester.runpytest(*EIGHT_GPUS, "--models", "qwen2.5-7b", "--fabric-link-gbit", "ib=3200,eth=50")
    assert result.ret == pytest.ExitCode.OK and "pre-night" not in result.stdout.str()
    assert "predicted to fail" not in result.stdout.str()


def test_an_unknown_expectation_is_a_usage_error(pytester):
    pytester.makepyfile(test_mine=EXPECTING.replace('expect="ahead"', 'expect="faster"'))
    result = pytester.runpytest("--collect-only", "-q", "--models", "qwen2.5-7b")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *fabric_comparison(expect='faster'): use one of 'within', 'ahead'"])


def test_a_gate_predicted_to_fail_is_named_in_junit(pytester):
    # The local cluster runs no comparison (its fabrics share one link): the prediction still lands.
    pytester.makepyfile(test_mine=EXPECTING)
    junit = pytester.path / "junit.xml"
    pytester.runpytest("--cluster", "local", "--nodes", "2", "--fabrics", "ib,eth", "--models", "qwen2.5-7b",
                       "--fabric-link-gbit", "ib=3200,eth=50", *FLOPS, f"--junitxml={junit}")
    from junitparser import JUnitXml

    props = {p.name: p.value for suite in JUnitXml.fromfile(str(junit)) for p in suite.properties()}
    said = props["fabric.predicted_to_fail.test_parity[qwen2.5-7b-n2-eth]"]
    assert said.startswith("parity qwen2.5-7b n2 full: predicted eth ") and "the gate needs eth at most 5% slower" in said
    assert not any(name.startswith("fabric.predicted_to_fail.test_advantage") for name in props)


def test_the_pre_night_check_covers_the_selected_gates_only(pytester):
    pytester.makepyfile(test_mine=EXPECTING)
    result = pytester.runpytest(*EIGHT_GPUS, *FLOPS, "--models", "qwen2.5-7b", "--fabric-link-gbit", "ib=3200,eth=50",
                                "-k", "advantage")
    result.stdout.fnmatch_lines(["fabric: pre-night check: the model predicts all 3 comparison(s) as their gates expect*"])
