#!/usr/bin/env python
"""A chaos night: random faults over many launches under -n 2, the harness killed and restarted.

    python benchmarks/chaos_night.py --out /tmp/chaos-night     # the night (root, alone on the machine)
    python benchmarks/chaos_night.py [--seed 0] [--launches 60] [--per-run 6] [--deadline 60]
                                     [--kill-p 0.3] [--out DIR] [--smoke]

The night (the defaults: 60 launches in 10 runs under -n 2, deadline 60 s, about 3 runs killed) takes
about 25 minutes on this 2-core machine, estimated from the smoke run (seed 2: 6 launches with a hang
and a linkcut, a SIGKILL and the gate in 242 s): launches run one at a time; a healthy launch, or one
that fails at once (crash, abort, garbage, truncate), takes 10-20 s, a nojoin about 25 s (the node's
20 s rendezvous timeout), a hang or linkcut its deadline (~7 of them: 400 s); 50 other launches
~750 s, 10 pytest starts ~100 s, the kills and restarts ~150 s, the gate ~25 s. Its tables are
printed at the end; the runs' logs, JUnit and saved nights are under --out.

Each launch is one emulated 2-node `qwen2-tiny` training launch of `suites/test_throughput.py` on a
fabric of its own (``c00``, ``c01``, ...: copies of ib defined in the ini), so that a fault can be
aimed at one launch through ``PYTEST_FABRIC_FAULT``'s ``fabric=``. About half the launches draw a
fault, every kind in turn before any repeats (crash, abort, hang, nojoin, slow, stall, garbage,
truncate, linkcut), with a random rank, node and step. Launches are grouped into pytest runs of
``--per-run`` under ``-n 2`` (the xdist workers share the session's store), each with its own
``--fabric-save`` and JUnit. A run drawn for a kill (``--kill-p``) gets SIGINT at a random moment (the
whole process group, as Ctrl-C does), then SIGKILL if it is still there 15 s later, or SIGKILL at
once; every store and saved night must then be valid JSON; the run is restarted with the same
``--fabric-save`` until it completes. Then one gate (advantage: llama-wide ib at least 20% ahead of eth)
runs with faults aimed at other fabrics in the environment.

Checks, printed as a table; exit 1 when one fails:
  - every launch with an error-making fault (crash, abort, hang, nojoin, garbage, truncate, linkcut)
    is reported as an error, within its deadline + 10% (the time the report states, the stop
    included), with one line that names both the node the fault hit and the fault's kind (the rank's
    own line lifted from that node's log, or the harness's note of what it did to that node);
  - every launch without a fault, and with a planted slowdown (slow, stall), passes;
  - the unfaulted gate decides (pass or fail);
  - 0 namespaces, veths, processes, temp files and held locks left;
  - every configuration that completed has its launch in its run's saved night (0 lost), every
    launch a killed attempt completed is reused by the restart (the same run directory), not
    measured again, and every saved night and store parses as JSON after every kill and at the end.
Needs root. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from pytest_fabric.workload.faults import KINDS  # noqa: E402

# Faults after which the launch must be an error; slow and stall are planted slowdowns: it passes.
ERROR_KINDS = ("crash", "abort", "hang", "nojoin", "garbage", "truncate", "linkcut")


def names_node_and_fault(text: str, kind: str, node: int) -> str | None:
    """The report's line that names both the fault's kind and the node it hit, or None: the rank's
    own line lifted to the report's head from that node's log (``node1: pytest-fabric: injected
    fault: hang on rank 1 at step 1 (fabric c04), on node1/198.18.0.2``), or the harness's note of
    what it did to that node (``injected fault: linkcut: node1's link cut by the harness at 21.4s``).
    The node's name must be the one the fault hit, twice over for a rank's line: the log it came
    from and where the rank says it ran."""
    line = re.search(rf"^(?:node{node}: pytest-fabric: injected fault: {kind}\b[^\n]*, on node{node}/[^\n]*"
                     rf"|injected fault: {kind}: node{node}'s [^\n]*)$", text, re.M)
    return line.group(0) if line else None


LAUNCH = ["--models", "qwen2-tiny", "--nodes", "2", "--steps", "2", "--measure-seconds", "0", "--warmup-steps", "0",
          "--batch-size", "1", "--seq-len", "64"]
INT_GRACE_S = 15.0


def draw_schedule(rng: random.Random, launches: int) -> list[dict]:
    """Per launch: its fabric and its fault (None: healthy). About half faulty, every kind in turn."""
    faulty = sorted(rng.sample(range(launches), launches // 2))
    kinds: list[str] = []
    while len(kinds) < len(faulty):
        kinds += rng.sample(KINDS, len(KINDS))
    schedule = []
    for j in range(launches):
        fabric = f"c{j:02d}"
        kind = kinds[faulty.index(j)] if j in faulty else None
        fault = None
        if kind:
            rank, step = rng.randint(0, 1), rng.randint(0, 1)
            params = {"crash": [f"rank={rank}", f"step={step}"], "abort": [f"rank={rank}", f"step={step}"],
                      "hang": [f"rank={rank}", f"step={step}"], "nojoin": ["node=1"], "slow": ["factor=1.2"],
                      "stall": ["p=0.5"], "garbage": [f"rank={rank}", f"step={step}", "mb=40"], "truncate": [],
                      "linkcut": ["node=1", f"step={step}"]}[kind]
            node = 1 if kind in ("nojoin", "linkcut") else 0 if kind == "truncate" else rank
            fault = {"kind": kind, "node": node, "spec": f"{kind}:" + ",".join([f"fabric={fabric}", *params])}
        schedule.append({"fabric": fabric, "fault": fault})
    return schedule


def fault_env(launches: list[dict]) -> str:
    return "; ".join(item["fault"]["spec"] for item in launches if item["fault"])


def json_problems(out: Path) -> list[str]:
    """Every saved night and session store under ``out`` that does not parse."""
    bad = []
    for path in [*out.glob("night-*.json"), *out.glob("tmp/**/measurements.json")]:
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            bad.append(f"{path}: {exc}")
    return bad


def completed_launches(stores: set[Path]) -> dict[str, str]:
    """Store key -> run directory of every completed launch in ``stores`` (unreadable ones skipped:
    ``json_problems`` reports them)."""
    found = {}
    for store in stores:
        try:
            records = json.loads(store.read_text())
        except (OSError, ValueError):
            continue
        found.update({k: r["result"].get("run_dir", "") for k, r in records.items() if isinstance(r.get("result"), dict)})
    return found


def run_pytest(cmd: list[str], env: dict, log: Path, kill: dict | None) -> tuple[int | None, str]:
    """One attempt; ``kill``: {"at": seconds, "how": "int"|"kill"}. Returns (exit code, how it ended)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            proc.wait(timeout=kill["at"] if kill else None)
            return proc.returncode, "completed"
        except subprocess.TimeoutExpired:
            pass
        if kill["how"] == "int":
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=INT_GRACE_S)
                return proc.returncode, f"SIGINT at {kill['at']:.0f}s"
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, f"SIGKILL at {kill['at']:.0f}s" + (" (after SIGINT)" if kill["how"] == "int" else "")


def outcomes(junit: Path) -> dict[str, tuple[str, str, float]]:
    """test id fragment (fabric) -> (outcome, message + text, seconds) for each testcase."""
    found = {}
    if not junit.exists():
        return found
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            match = re.search(r"-n2-(\w+)\]", case.name)
            if not match:
                continue
            outcome, text = "pass", ""
            for r in case.result:
                if isinstance(r, (Failure, Error)):
                    outcome, text = ("fail" if isinstance(r, Failure) else "error"), f"{r.message}\n{r.text}"
                elif isinstance(r, Skipped):
                    outcome = "inconclusive" if "inconclusive" in (r.message or "").lower() else "skipped"
            found[match.group(1)] = (outcome, text, case.time or 0.0)
    return found


def leftovers(out: Path, veths_before: int) -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    namespaces = [n.split()[0] for n in netns if n.startswith("pf")
                  and not os.path.exists(f"/proc/{n[2:].split('-')[0]}")]
    veth = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    procs = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(out) in cmdline and "chaos_night.py" not in cmdline:  # this benchmark and its callers aside
            procs.append(f"{entry}: {cmdline[:120]}")
    temp = [str(p) for p in out.rglob("*.tmp")]
    held = []
    for lock in out.rglob("*.lock"):
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            except OSError:
                held.append(str(lock))
    return {"namespaces": namespaces, "veths": ["+%d" % (len(veth.splitlines()) - veths_before)]
            if len(veth.splitlines()) > veths_before else [],
            "processes": procs, "temp files": temp, "locks": held}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launches", type=int, default=60)
    parser.add_argument("--per-run", type=int, default=6, help="launches per pytest run")
    parser.add_argument("--deadline", type=int, default=60, help="--launch-timeout, seconds")
    parser.add_argument("--kill-p", type=float, default=0.3, help="share of runs killed once")
    parser.add_argument("--out", default="chaos-night")
    parser.add_argument("--smoke", action="store_true", help="a small night: 6 launches in 2 runs, one killed")
    parser.add_argument("--no-gate", action="store_true", help="skip the parity gate run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.launches, args.per_run = min(args.launches, 6), 3
    rng = random.Random(args.seed)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "tmp").mkdir(exist_ok=True)
    veths_before = len(subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True,
                                      text=True).stdout.splitlines())
    schedule = draw_schedule(rng, args.launches)
    groups = [schedule[i:i + args.per_run] for i in range(0, len(schedule), args.per_run)]
    killed_runs = {i for i in range(len(groups)) if rng.random() < args.kill_p}
    if args.smoke and not killed_runs:
        killed_runs = {0}
    base_env = {**os.environ, "TMPDIR": str(out / "tmp"), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    rows, kills, problems = [], [], []
    remeasured = reused = 0
    for g, group in enumerate(groups):
        fabrics = ",".join(item["fabric"] for item in group)
        junit, save = out / f"run-{g}.xml", out / f"night-{g}.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "suites/test_throughput.py",
               # The 2-node cases alone ("n2" alone matches qwen2's one-node cases too: a launch
               # of no use here, and one a rank-0 fault aimed at its fabric would hit).
               *LAUNCH, "-k", "tiny-n2", "--fabrics", fabrics, "--launch-timeout", str(args.deadline),
               "-o", "fabric_define=" + "\n".join(f"{item['fabric']}: ib" for item in group),
               f"--fabric-save={save}", f"--junitxml={junit}"]
        env = {**base_env, "PYTEST_FABRIC_FAULT": fault_env(group)}
        # A moment inside the run (a smoke run's 3 launches may all end within 25 s).
        latest = 20 if args.smoke else len(group) * 15
        kill = {"at": rng.uniform(8, latest), "how": rng.choice(["int", "kill"])} if g in killed_runs else None
        attempt = 0
        killed_completed: dict[str, str] = {}  # launches a killed attempt completed: store key -> its run dir
        while True:
            attempt += 1
            stores_before = set(out.glob("tmp/**/measurements.json"))
            code, how = run_pytest(cmd, env, out / f"run-{g}.log", kill)
            print(f"run {g} attempt {attempt}: {how} (exit {code})", flush=True)
            mine = completed_launches(set(out.glob("tmp/**/measurements.json")) - stores_before)
            if how == "completed":
                break
            kills.append(how)
            problems += [f"after {how}: {p}" for p in json_problems(out)]
            killed_completed.update(mine)
            kill = None
        # The restart must reuse what the killed attempts completed (the same launch: its run
        # directory), not launch it again, and lose none of it.
        for key, run_dir in killed_completed.items():
            if key not in mine:
                problems.append(f"run {g}: {key}, completed before a kill, is not in the restart's store")
            elif mine[key] == run_dir:
                reused += 1
            else:
                remeasured += 1
        results = outcomes(junit)
        saved = json.loads(save.read_text()) if save.exists() else {}
        saved_fabrics = {r["case"]["fabric"] for r in saved.get("records", {}).values()}
        for item in group:
            outcome, text, seconds = results.get(item["fabric"], ("missing", "", 0.0))
            fault = item["fault"]
            kind = fault["kind"] if fault else "none"
            row = {"fabric": item["fabric"], "kind": kind, "outcome": outcome, "seconds": seconds, "ok": True,
                   "why": "", "names": None}
            reported = re.search(r"(?:launch failed|deadline exceeded|log limit exceeded) after ([\d.]+)s", text)
            row["report_s"] = float(reported.group(1)) if reported else None
            if kind in ERROR_KINDS:
                row["names"] = names_node_and_fault(text, kind, fault["node"])
                if outcome not in ("fail", "error"):
                    row.update(ok=False, why=f"not reported as an error ({outcome})")
                elif not row["names"]:
                    row.update(ok=False, why=f"no line of the report names both node{fault['node']} and {kind}")
                elif (row["report_s"] is None or row["report_s"] > args.deadline * 1.1):
                    row.update(ok=False, why=f"reported after {row['report_s']}s (deadline {args.deadline}s)")
                elif len(text) > 100_000:
                    row.update(ok=False, why=f"report of {len(text)} characters")
            elif outcome != "pass":
                row.update(ok=False, why=f"{outcome}: {text.splitlines()[0] if text else ''}")
            if outcome == "pass" and item["fabric"] not in saved_fabrics:
                row.update(ok=False, why="completed, not in the saved night (lost)")
            rows.append(row)
            shown = "-" if row["report_s"] is None else f"{row['report_s']}s"
            print(f"  {item['fabric']} {kind:9s} {outcome:8s} report {shown} {'ok' if row['ok'] else 'BAD: ' + row['why']}"
                  + (f"\n      says: {row['names'][:160]}" if row["names"] else ""), flush=True)

    gate = None
    if not args.no_gate:
        # A gate that one launch per side decides (ib about 4x ahead of eth on llama-wide), its fabrics
        # unfaulted while the environment aims every fault of the night at the other fabrics.
        junit = out / "gate.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "suites/test_advantage.py",
               *LAUNCH, "--models", "llama-wide", "--fabrics", "ib,eth", "--repeats", "1", "--max-repeats", "2",
               "-k", "n2", "--launch-timeout", str(args.deadline), f"--fabric-save={out / 'night-gate.json'}",
               f"--junitxml={junit}"]
        run_pytest(cmd, {**base_env, "PYTEST_FABRIC_FAULT": fault_env(schedule)}, out / "gate.log", None)
        gate = outcomes(junit).get("eth", ("missing", "", 0.0))[0]
    problems += [f"at the end: {p}" for p in json_problems(out)]
    left = leftovers(out, veths_before)

    kinds = Counter(r["kind"] for r in rows)
    print(f"\nchaos night: seed {args.seed}, {len(rows)} launches in {len(groups)} runs under -n 2, deadline "
          f"{args.deadline}s, {len(kills)} kill(s): {', '.join(kills) or 'none'}")
    print("\n| fault | launches | reported as expected | report names node + fault | report s (max) | deadline + 10% |")
    print("|---|---|---|---|---|---|")
    for kind in ("none", *KINDS):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        times = [r["report_s"] for r in mine if r["report_s"] is not None]
        expect = "error" if kind in ERROR_KINDS else "pass"
        named = f"{sum(bool(r['names']) for r in mine)}" if kind in ERROR_KINDS else "-"
        print(f"| {kind} ({expect}) | {len(mine)} | {sum(r['ok'] for r in mine)} | {named} | "
              f"{max(times) if times else '-'} | {args.deadline * 1.1:.1f} |")
    lost = sum("lost" in r["why"] for r in rows)
    print("\n| check | value |\n|---|---|")
    print(f"| launches | {len(rows)} ({sum(k != 'none' for k in kinds.elements())} faulty) |")
    print(f"| launches not as expected | {sum(not r['ok'] for r in rows)} |")
    print(f"| unfaulted gate (advantage llama-wide n2: ib ahead of eth) | {gate or 'skipped'} |")
    print(f"| completed launches lost from the saved night | {lost} |")
    print(f"| launches completed by a killed session, reused by its restart | {reused} |")
    print(f"| launches completed by a killed session, measured again after restart | {remeasured} |")
    print(f"| stores / saved nights not valid JSON (after kills, at the end) | {len(problems)} |")
    for what, found in left.items():
        print(f"| leftover {what} | {len(found)} |")
    for r in rows:
        if not r["ok"]:
            print(f"BAD {r['fabric']} {r['kind']}: {r['why']}")
    for p in problems + [f"{w}: {x}" for w, f in left.items() for x in f]:
        print(f"BAD {p}")
    ok = all(r["ok"] for r in rows) and not problems and not remeasured and not any(left.values()) and gate in (None, "pass", "fail")
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
