"""Every file a user hands the plugin, broken in every way we could think of: one clear usage error
(what is wrong, with which file, what to give instead), never a traceback, and nothing launched.

Option values (numbers, choices) are covered in test_options.py, suite file contents in
test_references.py, results files read by the ``pytest-fabric`` command in test_cli.py; this module
covers the files given to pytest and the output paths.
"""

from __future__ import annotations

import pickle

import pytest
from helpers import saved

from pytest_fabric.deciding.gates import REGRESSION_MEASURES

BASELINE_FORMAT = '{"format": "pytest-fabric-baseline", "version": 1, "cases": {"x": {"model": "m"}}}'

# name -> content (bytes or text); "DIR" makes a directory.
FILES = {
    "corrupt.json": '{"format": "pytest-fabric-results", "cases": {',
    "truncated.xml": '<?xml version="1.0"?><testsuites><testsuite name="x"><testcase name="a"',
    "plain-junit.xml": '<testsuites><testsuite name="x" tests="1"><testcase classname="t" name="a"/></testsuite>'
                       '</testsuites>',
    "html.xml": "<html><body>not junit</body></html>",
    "empty.json": "",
    "list.json": "[1, 2, 3]",
    "future.json": '{"format": "pytest-fabric-results", "version": 99}',
    "bad-baseline.json": BASELINE_FORMAT,
    "results.pkl": pickle.dumps({"cases": {}}),
    "binary.dat": b"\xff\xfe\x00\x01garbage",
    "adir": "DIR",
    "suite-bad.toml": "[[gate]\n",
    "suite-unknown.toml": "[gates]\nx = 1\n",
    "suite-binary.toml": b"\xff\xfe\x00",
    "hosts-empty": "# nobody here\n",
    "hosts-option": "-oProxyCommand=touch /tmp/pwned\n",
    "hosts-slots": "node1 slots=0\n",
    "hosts-junk": "node1 gpus=8\n",
    "hosts-dup": "node1\nnode1 slots=2\n",
    "hosts-binary": b"\xff\xfe\x00",
    "model-file": "a file, not a directory",
    "model-noconfig": "DIR",
    "model-badconfig/config.json": '{"model_type": ',
    "model-listconfig/config.json": "[1]",
}

BAD = [
    # --fabric-baseline: any form of broken results file
    (["--fabric-baseline", "corrupt.json"], ["--fabric-baseline: ", "corrupt.json: invalid JSON", "truncated"]),
    (["--fabric-baseline", "truncated.xml"], ["--fabric-baseline: ", "truncated.xml: not readable as JUnit XML"]),
    (["--fabric-baseline", "plain-junit.xml"], ["--fabric-baseline: ", "no testcase carries pytest-fabric measurements"]),
    (["--fabric-baseline", "html.xml"], ["--fabric-baseline: ", "XML but not JUnit"]),
    (["--fabric-baseline", "empty.json"], ["--fabric-baseline: ", "empty.json: neither JSON nor XML"]),
    (["--fabric-baseline", "list.json"], ["--fabric-baseline: ", "the JSON is a list"]),
    (["--fabric-baseline", "future.json"], ["--fabric-baseline: ", "upgrade pytest-fabric"]),
    (["--fabric-baseline", "bad-baseline.json"], ["--fabric-baseline: ", "bad-baseline.json: baseline case 'x'"]),
    (["--fabric-baseline", "results.pkl"], ["--fabric-baseline: ", "looks like a Python pickle"]),
    (["--fabric-baseline", "binary.dat"], ["--fabric-baseline: ", "not UTF-8 text"]),
    (["--fabric-baseline", "adir"], ["--fabric-baseline: ", "adir: cannot read (Is a directory)"]),
    (["--fabric-baseline", "missing.json"], ["--fabric-baseline: ", "missing.json: cannot read (No such file"]),
    # --fabric-suite
    (["--fabric-suite", "missing.toml"], ["--fabric-suite: suite file", "does not exist"]),
    (["--fabric-suite", "adir"], ["--fabric-suite: suite file", "adir", "is a directory"]),
    (["--fabric-suite", "suite-bad.toml"], ["--fabric-suite: suite file", "is not valid TOML"]),
    (["--fabric-suite", "suite-unknown.toml"], ["--fabric-suite: ", "unknown section(s) gates"]),
    (["--fabric-suite", "suite-binary.toml"], ["--fabric-suite: suite file", "is not valid TOML"]),
    # --hostfile
    (["--hostfile", "missing-hosts"], ["--hostfile missing-hosts: no such file"]),
    (["--hostfile", "adir"], ["--hostfile adir: ", "directory"]),
    (["--hostfile", "hosts-empty"], ["--cluster auto: hosts-empty lists no hosts"]),
    (["--hostfile", "hosts-option"], ["hosts-option, line 1: '-oProxyCommand=touch' is not a host name"]),
    (["--hostfile", "hosts-slots"], ["hosts-slots, line 1: slots must be at least 1"]),
    (["--hostfile", "hosts-junk"], ["hosts-junk, line 1: unexpected 'gpus=8' after the host"]),
    (["--hostfile", "hosts-dup"], ["hosts-dup, line 2: node1 is already listed on line 1"]),
    (["--hostfile", "hosts-binary"], ["cannot read the hostfile hosts-binary: not UTF-8 text"]),
    (["--cluster", "ssh"], ["--cluster ssh: the ssh cluster needs --hostfile FILE"]),
    # --ssh-config
    (["--ssh-config", "missing-config"], ["--ssh-config missing-config: no such file"]),
    (["--ssh-config", "adir"], ["--ssh-config adir: ", "directory"]),
    # --model-path (and --models)
    (["--model-path", "missing-model"], ["--model-path missing-model: no config.json there"]),
    (["--model-path", "model-file"], ["--model-path model-file: no config.json there"]),
    (["--model-path", "model-noconfig"], ["--model-path model-noconfig: no config.json there"]),
    (["--model-path", "model-badconfig"], ["--model-path model-badconfig: ", "config.json is not valid JSON"]),
    (["--model-path", "model-listconfig"], ["--model-path model-listconfig: ", "config.json is not a JSON object"]),
    (["--models", ""], ["--models: unknown empty value; choose from: "]),
    (["--models", "qwen2-tiny,../../etc/passwd"], ["--models: unknown '../../etc/passwd'; choose from: "]),
    # --fabric-save
    (["--fabric-save", "no-such-dir/night.json"], ["--fabric-save no-such-dir/night.json: the directory",
                                                   "does not exist"]),
    (["--fabric-save", "adir"], ["--fabric-save adir: is a directory; give a file path"]),
    # fabric settings and definitions
    (["--fabric-env", "eth.NCCL_X"], ["fabric setting 'eth.NCCL_X': write 'FABRIC.VARIABLE=VALUE'"]),
    (["--fabric-env", "nvlink.NCCL_X=1"], ["fabric setting 'nvlink.NCCL_X=1': write 'FABRIC.VARIABLE=VALUE'"]),
    (["--fabric-env", "eth.$(touch x)=1"], ["fabric setting 'eth.$(touch x)=1': write 'FABRIC.VARIABLE=VALUE'"]),
    (["-o", "fabric_define=Bad Name: eth"], ["fabric definition 'Bad Name: eth': write 'NAME: BASE'"]),
    (["-o", "fabric_define=dc2: nvlink"], ["fabric definition 'dc2: nvlink': write 'NAME: BASE'"]),
    (["-o", "fabric_inventory=ib.nics = eight"], ["fabric inventory 'ib.nics = eight': write 'FABRIC.nics = N'"]),
    (["-o", "fabric_inventory=nvlink.nics = 8"], ["fabric inventory 'nvlink.nics = 8': write"]),
    (["-o", "fabric_inventory=ib.gbit_per_nic = -400"], ["fabric inventory 'ib.gbit_per_nic = -400'"]),
    (["-o", "fabric_inventory=ib.ports = 8"], ["fabric inventory 'ib.ports = 8': write"]),
    (["-o", "fabric_accept_no_gdr=maybe"], ["ini fabric_accept_no_gdr: 'maybe' is not a boolean"]),
    # choices and thresholds not covered elsewhere
    (["--regression-threshold", "1.5"], ["--regression-threshold must be a fraction in (0, 1)"]),
    (["--regression-threshold", "ten"], ["--regression-threshold must be a fraction in (0, 1)"]),
    (["--regression-on", "speed"], [f"--regression-on: 'speed' is not one of {', '.join(REGRESSION_MEASURES)}"]),
    (["--reruns", "-1"], ["--reruns must be an integer >= 0"]),
    (["--measure-seconds", "-1"], ["--measure-seconds must be a number of seconds >= 0"]),
    (["--measure-seconds", "inf"], ["--measure-seconds must be a number of seconds >= 0"]),
    (["--repeats", "5", "--max-repeats", "3"], ["--max-repeats 3 is below --repeats 5"]),
    (["--inconclusive", "ignore"], ["--inconclusive: 'ignore' is not one of xfail, fail, warn"]),
    (["--device", "gpu"], ["--device: 'gpu' is not one of auto, cpu, cuda"]),
    (["--fsdp", "3"], ["--fsdp: '3' is not one of 2, 1"]),
    (["--fsdp", "1", "--device", "cpu"], ["--fsdp 1 needs GPUs"]),
    (["--mixed-precision", "fp16"], ["--mixed-precision: 'fp16' is not one of auto, bf16, fp32"]),
    (["--ssh-host-key-checking", "ask"], ["--ssh-host-key-checking: 'ask' is not one of accept-new, yes, no"]),
    (["-o", "fabric_activation_checkpointing=maybe"], ["ini fabric_activation_checkpointing: 'maybe' is not a "
                                                       "boolean; write true or false"]),
]


def make_files(directory):
    for name, content in FILES.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "DIR":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.fixture
def files(pytester):
    make_files(pytester.path)
    pytester.makepyfile(test_any="def test_nothing(): pass")
    return pytester


@pytest.mark.parametrize(("args", "fragments"), BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_bad_input_is_one_clear_usage_error(files, args, fragments):
    result = files.runpytest(*args)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    assert "Traceback" not in err and "INTERNALERROR" not in result.stdout.str() + err
    line = next((x for x in err.splitlines() if x.startswith("ERROR: ")), "")
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in the error: {err}"


# -- the pytest-fabric command: every broken results file, every subcommand that reads one ----------

# file -> what the one-line error says about it (as any of report, trend, baseline reads it)
CLI_READ = {
    "corrupt.json": "invalid JSON",
    "truncated.xml": "not readable as JUnit XML",
    "plain-junit.xml": "no testcase carries pytest-fabric measurements",
    "html.xml": "XML but not JUnit",
    "empty.json": "neither JSON nor XML",
    "list.json": "the JSON is a list",
    "future.json": "upgrade pytest-fabric",
    "bad-baseline.json": "baseline case 'x'",
    "results.pkl": "looks like a Python pickle",
    "binary.dat": "not UTF-8 text",
    "adir": "cannot read (Is a directory)",
    "missing.json": "cannot read (No such file or directory)",
}
# merge reads JUnit only
CLI_MERGE = {**{name: "not readable as JUnit XML" for name in CLI_READ},
             "plain-junit.xml": None, "html.xml": "XML but not JUnit", "adir": "cannot read", "missing.json": "cannot read"}


def _cli(capsys, *argv):
    from pytest_fabric.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "trend", "baseline", "merge"])
@pytest.mark.parametrize("name", sorted(CLI_READ))
def test_the_command_refuses_a_broken_file_in_one_line(capsys, tmp_path, monkeypatch, command, name):
    monkeypatch.chdir(tmp_path)
    make_files(tmp_path)
    argv = {"report": ["report", name, "-o", "out"], "trend": ["trend", name, name, "-o", "out"],
            "baseline": ["baseline", "out.json", name], "merge": ["merge", "out.xml", name]}[command]
    expected = (CLI_MERGE if command == "merge" else CLI_READ)[name]
    code, err = _cli(capsys, *argv)
    if expected is None:  # plain JUnit is fine to merge
        assert code == 0, err
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"pytest-fabric {command}: error: {name}") and expected in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json").exists()


def test_the_command_checks_where_it_writes_before_reading_anything(capsys, tmp_path):

    night = saved(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    cases = [
        (["report", night, "-o", tmp_path / "a-file"], f"-o {tmp_path / 'a-file'}: {tmp_path / 'a-file'} is a file"),
        (["report", night, "-o", tmp_path / "a-file" / "sub"], f"{tmp_path / 'a-file'} is a file; give a directory"),
        (["trend", night, night, "-o", tmp_path / "a-file"], "is a file; give a directory"),
        (["baseline", tmp_path / "a-dir", night], f"OUT {tmp_path / 'a-dir'} is a directory; give a file path"),
        (["baseline", tmp_path / "a-file" / "b.json", night], f"{tmp_path / 'a-file'} is a file, not a directory"),
        (["merge", tmp_path / "a-dir", night], f"OUT {tmp_path / 'a-dir'} is a directory"),
        (["report", night, "--price", "ib=inf"], "--price 'ib=inf': write FABRIC=USD_PER_GPU_HOUR with a positive"),
        (["report", night, "--price", "ib=nan"], "--price 'ib=nan'"),
    ]
    for argv, expected in cases:
        code, err = _cli(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, (argv, err)
