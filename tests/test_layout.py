"""The package's shape, as docs/architecture.md states it: role folders in one order, each module
importing only its own folder and the folders before it (no exemptions), no import cycle, no module
over 500 lines, the rank programs never import pytest, and ``plugin.py`` is glue (hooks, fixtures
and their registration, nothing else).

Read from the source with ``ast``, every import counted, those inside functions too (a lazy import
hides a cycle at import time, not in the design), so a change that breaks a rule fails here,
whatever runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_fabric"
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Modules of the package (and outside names, as written) ``name`` imports, anywhere in it."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in MODULES else target)
    return found


GRAPH = {name: {m for m in _imports(name) if m in MODULES and m != name} for name in MODULES}


def mod(short: str) -> str:
    """The full name of the module whose last part is ``short``, wherever its role folder put it."""
    (name,) = [m for m in MODULES if m.rsplit(".", 1)[-1] == short]
    return name


def test_the_layout_is_read_from_the_whole_package():
    assert {"pytest_fabric.plugin", "pytest_fabric.cluster.base", "pytest_fabric.workload.train"} <= set(MODULES)
    assert "pytest_fabric.running.session" in GRAPH["pytest_fabric.plugin"]
    # Imports inside functions count: night_files.load_results imports junit lazily, and that edge is seen.
    assert "pytest_fabric.history.junit_read" in GRAPH["pytest_fabric.history.night_files"]


def test_the_table_model_reads_the_night_model_only():
    # tables.py builds every output's rows from a SavedRun: it reads no file, store or JUnit (the
    # renderers above it do), so each number is computed once.
    assert {m for m in GRAPH[mod("tables")] if _folder(m) != "core"} <= {mod("night_model"), mod("cost"), mod("hostbound"),
                                                                     mod("contrasts"), mod("stragglers")}
    for renderer in ("terminal", "htmlreport", "dashboards"):
        assert mod("tables") in GRAPH[mod(renderer)], renderer


def test_no_import_cycle():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])
    assert cycles == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("pytest_fabric.workload")))
def test_rank_programs_never_import_pytest(name):
    assert not {m for m in _imports(name) if m == "pytest" or m.startswith("pytest.") or m.startswith("_pytest")}


def _is_fixture(node: ast.FunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def test_plugin_holds_hooks_and_fixtures_only():
    tree = ast.parse(MODULES["pytest_fabric.plugin"].read_text())
    others = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            others.append(f"class {node.name}")
        elif isinstance(node, ast.FunctionDef) and not (node.name.startswith("pytest_") or _is_fixture(node)):
            others.append(f"def {node.name}")
    assert others == []


def test_the_value_types_sit_below_the_launch_machinery():
    # measurement.py (Measurement, LaunchRecord, launch_value) uses only leaves and the rank programs'
    # typed results: the readers of a night get it without filelock, a launcher or a node probe.
    assert {_folder(m) for m in GRAPH["pytest_fabric.measuring.measurement"]} <= {"core", "workload", "deciding"}
    assert {m for m in _imports("pytest_fabric.measuring.measurement") if m.split(".")[0] == "filelock"} == set()
    for reader in ("pytest_fabric.history.nights", "pytest_fabric.history.junit", "pytest_fabric.history.junit_read",
                   "pytest_fabric.deciding.gates"):
        assert "pytest_fabric.measuring.measure" not in GRAPH[reader], reader


def _calls(name: str | Path, callee: str) -> int:
    """How many times module ``name`` (or the file at a path) calls ``callee`` (``Class.method`` or a
    bare function name)."""
    owner, _, attr = callee.rpartition(".")
    found = 0
    for node in ast.walk(ast.parse((MODULES[name] if isinstance(name, str) else name).read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if owner and isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name) \
                and f.value.id == owner:
            found += 1
        elif not owner and isinstance(f, ast.Name) and f.id == attr:
            found += 1
    return found


def _callers(callee: str) -> set[str]:
    return {name for name in MODULES if _calls(name, callee)}


def test_a_measurement_takes_four_forms_from_the_ranks_to_junit():
    # TrainResult (the rank's result.json) -> LaunchRecord (the store's record, decoded once) ->
    # Measurement / SavedRun (a case's value; the night) -> JUnit's machine lines. Each step has its
    # owners: a rank's result is decoded only into a LaunchRecord (the measurer reads result.json),
    # a LaunchRecord only by the measurer, the night's builder and calibration...
    results = {"pytest_fabric.measuring.measurement", "pytest_fabric.workload.result"}
    assert _callers("TrainResult.from_dict") | _callers("CollectivesResult.from_dict") <= results
    assert _callers("LaunchRecord.from_dict") == {"pytest_fabric.measuring.measurement", "pytest_fabric.measuring.measure",
                                                  "pytest_fabric.history.nights", "pytest_fabric.history.calibration"}
    # ... a record becomes a Measurement in the measurer and in the night's builder (dashboards'
    # busbw rows still read the raw records: the table model's part) ...
    assert _callers("Measurement.from_record") == {"pytest_fabric.measuring.measure", "pytest_fabric.history.nights"}
    assert _callers("BandwidthMeasurement.from_record") <= {"pytest_fabric.measuring.measure", "pytest_fabric.history.nights",
                                                            "pytest_fabric.reporting.dashboards"}
    # ... and a session's night is built from its store in one place, once: the reporter's
    # ``night``, which the terminal, the suite properties, dashboards, cost lines and --fabric-save take.
    # (A store file read back as a night, night_files.load_results, goes through the same builder.)
    assert _callers("run_from_store") == {"pytest_fabric.history.nights", "pytest_fabric.history.night_files"}
    assert _callers("session_night") == {"pytest_fabric.reporting.reporter"}
    assert _calls("pytest_fabric.reporting.reporter", "session_night") == 1


def test_a_launch_has_one_value_function():
    # measurement.launch_value: the gates, calibration and the benchmarks value a launch with it;
    # only it calls steps.launch_estimate on a result.
    assert _callers("launch_estimate") == {"pytest_fabric.measuring.measurement"}
    benchmarks = Path(__file__).resolve().parent.parent / "benchmarks"
    for path in sorted(benchmarks.glob("*.py")):
        assert _calls(path, "launch_estimate") == 0, path.name


def test_test_modules_take_shared_builders_from_helpers_only():
    # A builder imported from another test module drags that module's tests in with it and hides
    # where the builder lives: tests/helpers.py holds every shared one.
    tests = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert offenders == []


def _reachable(name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in GRAPH[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


# Modules split out of a larger one by role, each below the module that kept the rest (which
# re-exports their public names): the split module never reaches back up.
SPLIT_BELOW = {"nccl_logs": "nccl_evidence", "nic_inventory": "nccl_evidence", "report_document": "htmlreport",
               "report_plots": "htmlreport", "tables": "terminal"}


@pytest.mark.parametrize("low", sorted(SPLIT_BELOW))
def test_a_split_module_sits_below_the_one_it_came_from(low):
    high = mod(SPLIT_BELOW[low])
    assert mod(low) in _reachable(high)
    assert high not in _reachable(mod(low))
    if SPLIT_BELOW[low] == "nccl_evidence":  # what NCCL wrote and what a node has: facts, read from leaves only
        assert {_folder(m) for m in GRAPH[mod(low)]} <= {"core"}


# The package order, lowest first ("" is the top level): a module imports modules of its own folder
# or of one before it, nothing else; the top level holds the front doors only. The deciding rules
# (a launch's value from its steps, rounds, intervals) sit below the measuring code that uses them.
PACKAGE_ORDER = ("core", "cluster", "workload", "physics", "deciding", "measuring", "history",
                 "running", "reporting", "")
FRONT_DOORS = {"pytest_fabric", "pytest_fabric.plugin", "pytest_fabric.cli"}


def _folder(name: str) -> str:
    return "" if MODULES[name].parent == PACKAGE else MODULES[name].relative_to(PACKAGE).parts[0]


def test_every_module_sits_in_a_role_folder():
    assert {n for n in MODULES if _folder(n) == ""} <= FRONT_DOORS
    assert {_folder(n) for n in MODULES} <= set(PACKAGE_ORDER)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_follow_the_package_order(name):
    rank = PACKAGE_ORDER.index(_folder(name))
    upwards = {m for m in GRAPH[name] if PACKAGE_ORDER.index(_folder(m)) > rank}
    assert upwards == set(), f"{name} imports {sorted(upwards)}, above its folder in {PACKAGE_ORDER}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_500_lines(name):
    assert len(MODULES[name].read_text().splitlines()) <= 500, f"{name}: split it by role"
