"""Secrets never leave the harness: not in failure reports, the store, saved results, JUnit or reports.

Every test plants a secret where it could leak (a rank printing its environment, an error record, a
verdict message) and greps what the harness wrote for it; without ``redact`` each one fails.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from pytest_fabric.core import redact as redact_module
from pytest_fabric.cluster import supervisor
from pytest_fabric.cluster.supervisor import ProcSpec, supervise
from pytest_fabric.core.redact import MASK, is_secret_name, redact, redact_data, remember
from pytest_fabric.history.night_model import CaseResult, SavedRun
from pytest_fabric.history.nights import save_results
from pytest_fabric.measuring.store import ResultStore

SECRET = "hf_S3cr3tV4lue&xyz"  # '&' also checks the XML-escaped form
AWS = "wJalrXUtnFEMI/K7MDENG"
ENV_SECRETS = {"HF_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": AWS}


@pytest.fixture
def secrets_in_env(monkeypatch):
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KEYBOARD_LAYOUT", "dvorak-programmer")  # not a secret: must stay readable
    monkeypatch.setattr(redact_module, "_extra", set())
    return ENV_SECRETS


def assert_clean(text: str, where: str) -> None:
    assert text.strip(), f"nothing was written to {where}: an empty text would pass every check below"
    for value in (SECRET, AWS, "hf_S3cr3tV4lue&amp;xyz"):
        assert value not in text, f"a secret leaked into {where}:\n{text[:3000]}"


# -- names and text ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["HF_TOKEN", "GITHUB_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                  "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "OPENAI_API_KEY", "APIKEY", "DB_PASSWORD",
                                  "PGPASSWORD", "MYSQL_PWD_PASS", "GOOGLE_APPLICATION_CREDENTIALS", "CLIENT_SECRET",
                                  "WANDB_API_KEY", "NCCL_TEST_TOKEN", "hf_token", "ghtoken", "SSH_PRIVATE_KEY",
                                  "KEY", "api_key", "db_pass", "aws_region", "password", "token"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["KEYBOARD", "KEYBOARD_LAYOUT", "MONKEY", "tokens_per_s", "tokens_per_step",
                                  "NCCL_IB_HCA", "PATH", "PWD", "SSH_AUTH_SOCK", "PASSENGER", "TOKENIZERS_PARALLELISM",
                                  "HF_HOME", "NCCL_SOCKET_IFNAME", "key", "auth", "keys"])
def test_names_that_are_not_secrets(name):
    assert not is_secret_name(name)


def test_values_and_assignments_are_masked_and_nothing_else(secrets_in_env):
    text = (f"token {SECRET} in prose; export HF_TOKEN={SECRET}; {{'AWS_SECRET_ACCESS_KEY': '{AWS}'}}; "
            "password=hunter2 API_KEY=\"two words\" KEYBOARD_LAYOUT=dvorak-programmer "
            "fabric.qwen2-tiny-n2-eth.tokens_per_s=123.4 SHORT_TOKEN= escaped hf_S3cr3tV4lue&amp;xyz")
    out = redact(text)
    assert_clean(out, "redact()")
    assert "hunter2" not in out and "two words" not in out
    assert "export HF_TOKEN=***;" in out and "'AWS_SECRET_ACCESS_KEY': '***'" in out and 'API_KEY="***"' in out
    # What is not a secret stays as it was.
    assert "KEYBOARD_LAYOUT=dvorak-programmer" in out and "tokens_per_s=123.4" in out and "SHORT_TOKEN= " in out
    assert redact(out) == out  # idempotent


def test_short_values_are_not_masked_in_text(monkeypatch):
    """A 1-character token would turn every '1' of a report into '***'."""
    monkeypatch.setenv("TINY_TOKEN", "1")
    assert redact("step 1 of 10") == "step 1 of 10"


def test_fabric_env_values_are_remembered(monkeypatch):
    monkeypatch.setattr(redact_module, "_extra", set())
    remember({"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_PLUGIN_TOKEN": "fabric-secret-42"})
    assert redact("mlx5_0,mlx5_1 fabric-secret-42") == f"mlx5_0,mlx5_1 {MASK}"


def test_recorded_env_dicts_keep_names_only(secrets_in_env):
    record = {"result": {"fabric": {"nccl_env": {"NCCL_IB_HCA": "=mlx5_0", "NCCL_NET_TOKEN": "abc"}},
                         "tokens_per_step": 128, "note": f"started with {SECRET}"}}
    out = redact_data(record)
    assert out["result"]["fabric"]["nccl_env"] == {"NCCL_IB_HCA": "=mlx5_0", "NCCL_NET_TOKEN": MASK}
    assert out["result"]["tokens_per_step"] == 128 and out["result"]["note"] == f"started with {MASK}"
    assert record["result"]["note"].endswith(SECRET), "the caller's record is not modified"


# -- where text leaves the harness --------------------------------------------------------------

PRINTS_ENV = ("import os, sys\n"
              "print('\\n'.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k.isupper() and k[0] in 'AHK'))\n"
              "print('bare values:', os.environ['HF_TOKEN'], os.environ['AWS_SECRET_ACCESS_KEY'])\n"
              "raise SystemExit(f'failing with settings {dict(os.environ)!r}')\n")


def test_a_rank_that_prints_its_environment_leaks_nothing_into_the_failure_report(
        secrets_in_env, tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "FAILURE_GRACE_S", 0.5)
    outcome = supervise([ProcSpec("node0", [sys.executable, "-c", PRINTS_ENV], dict(os.environ))],
                        tmp_path / "logs", deadline_s=30)
    assert not outcome.ok
    assert SECRET in (tmp_path / "logs" / "node0.log").read_text(), "the rank did print it (the log is local)"
    report = outcome.describe()
    assert_clean(report, "LaunchOutcome.describe()")
    assert "bare values: *** ***" in report and "KEYBOARD_LAYOUT=dvorak-programmer" in report
    assert_clean(outcome.procs[0].tail(), "ProcOutcome.tail()")


def test_the_store_never_holds_a_secret(secrets_in_env, tmp_path):
    store = ResultStore(tmp_path)
    store.put("failed", {"case": {"model": "m", "nodes": 2, "fabric": "eth"},
                         "error": f"launch failed: HF_TOKEN={SECRET}\n{AWS}"})
    record, computed = store.get_or_compute("k", lambda: {"result": {"fabric": {"nccl_env": {"X_TOKEN": "t0ken-val"}}}})
    assert computed and record["result"]["fabric"]["nccl_env"] == {"X_TOKEN": MASK}
    text = store.path.read_text()
    assert_clean(text, "the result store")
    assert "t0ken-val" not in text


def test_saved_results_never_hold_a_secret(secrets_in_env, tmp_path):
    records = {"qwen2-tiny-n2-eth#abc": {"case": {"model": "qwen2-tiny", "nodes": 2, "fabric": "eth"},
                                         "error": f"qwen2-tiny-n2-eth on the local cluster: deadline; {SECRET}"}}
    verdicts = [{"test": "t.py::test_x", "outcome": "failed", "message": f"measurement failed: AWS key {AWS}"}]
    path = tmp_path / "night.json"
    save_results(path, records, {"cluster": "local", "note": f"HF_TOKEN={SECRET}"}, verdicts)
    text = path.read_text()
    assert_clean(text, "--fabric-save results")
    assert json.loads(text)["errors"] == ["qwen2-tiny-n2-eth on the local cluster: deadline; ***"]


def test_reports_never_show_a_secret(secrets_in_env, tmp_path):
    from pytest_fabric.reporting.htmlreport import write_report

    run = SavedRun({"cluster": f"local {SECRET}", "fabrics": ["ib", "eth"]},
                   {"qwen2-tiny-n2-eth": CaseResult("qwen2-tiny", 2, "eth", 2, [100.0], [50.0])},
                   verdicts=[{"test": "t.py::test_x[qwen2-tiny-n2-eth]", "outcome": "failed",
                              "message": f"measurement failed: {AWS}"}],
                   errors=[f"launch failed: {SECRET}"])
    written = write_report([run], tmp_path / "report")
    for path in (written.markdown, written.html):
        text = path.read_text()
        assert_clean(text, path.name)
        # Written, masked: the cluster, the failed launch and the verdict's message are all there.
        assert "local ***" in text and "launch failed: ***" in text and "measurement failed: ***" in text, text


def test_merged_junit_never_shows_a_secret(secrets_in_env, tmp_path):
    from pytest_fabric.history.junit import merge_junit

    junit = tmp_path / "in.xml"
    escaped = SECRET.replace("&", "&amp;")
    junit.write_text(f'<testsuites><testsuite name="pytest" tests="1"><testcase classname="t" name="test_x">'
                     f'<failure message="measurement failed: {escaped}">HF_TOKEN={escaped}</failure>'
                     f'<system-out>{AWS}</system-out></testcase></testsuite></testsuites>')
    merge_junit([junit], tmp_path / "merged.xml")
    merged = (tmp_path / "merged.xml").read_text()
    assert_clean(merged, "merged JUnit")
    # Written, masked: the failure's message and body and the output are all there.
    assert 'message="measurement failed: ***"' in merged and "HF_TOKEN=***" in merged and "test_x" in merged, merged


# -- a whole pytest run: a launch that fails fast, its JUnit and saved results ------------------

SITECUSTOMIZE = """
import os
if os.environ.get("PYTEST_FABRIC_NODE"):  # only in what the harness launches, not the harness itself
    print("rank environment:", sorted(os.environ.items()), flush=True)
    print("bare:", os.environ.get("HF_TOKEN"), os.environ.get("NCCL_TEST_TOKEN"), flush=True)
"""

MEASURES = """
from pytest_fabric import Case

def test_measure(fabric_measure):
    fabric_measure(Case("qwen2-tiny", 2, "eth"))
"""


def test_a_failing_run_leaks_no_secret_into_junit_saved_results_or_the_terminal(pytester, monkeypatch):
    """Ranks print their environment (a sitecustomize on PYTHONPATH), the launch exceeds its 1 s
    deadline, and the failure with the ranks' log tails goes to the terminal, JUnit and --fabric-save."""
    fabric_secret = "fabric-env-secret-77"
    site = pytester.mkdir("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS)
    tmp = pytester.mkdir("tmp")
    monkeypatch.setenv("TMPDIR", str(tmp))
    pytester.makepyfile(test_leak=MEASURES)
    junit, saved = pytester.path / "junit.xml", pytester.path / "saved.json"
    result = pytester.runpytest_subprocess(
        "--cluster", "local", "--nodes", "2", "--fabrics", "eth", "--launch-timeout", "1",
        "--fabric-env", f"eth.NCCL_TEST_TOKEN={fabric_secret}", "-o", "junit_logging=all",
        f"--junitxml={junit}", f"--fabric-save={saved}", f"--run-dir={tmp}", timeout=120)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert "measurement failed" in output and "deadline exceeded" in output
    launched_logs = "".join(p.read_text() for p in tmp.rglob("node*.log"))
    assert SECRET in launched_logs and fabric_secret in launched_logs, "the ranks must have printed the secrets"
    shown = {"the terminal": output, "the JUnit file": junit.read_text(), "--fabric-save": saved.read_text(),
             "the session store": "".join(p.read_text() for p in tmp.rglob("measurements.json"))}
    for where, text in shown.items():
        assert_clean(text, where)
        assert fabric_secret not in text, f"the --fabric-env secret leaked into {where}"
    assert "bare: *** ***" in shown["the JUnit file"]
