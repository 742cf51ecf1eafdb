"""tools/regroup.py on a tiny package made here: moves, rewrites, old paths, a second run, a refusal."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "regroup.py"
spec = importlib.util.spec_from_file_location("regroup", TOOL)
regroup = importlib.util.module_from_spec(spec)
sys.modules["regroup"] = regroup  # dataclasses look the module up by name
spec.loader.exec_module(regroup)

PLAN = regroup.Plan(mapping={"__init__": "", "cli": "", "units": "core", "measure": "measuring"},
                    roles={"core": "the leaves", "measuring": "a launch"}, order=("core", "measuring", ""),
                    front_doors=("__init__", "cli"))

FILES = {
    "pytest_fabric/__init__.py": '''"""A tiny package."""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0"
_EXPORTS = {"X": "units"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(name)
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
''',
    "pytest_fabric/units.py": "X = 1\n",
    "pytest_fabric/cli.py": "from .measure import twice\n",
    "pytest_fabric/measure.py": '''"""Run as ``python -m pytest_fabric.measure``."""
from .units import X
from . import units as u, __version__  # noqa: F401


def twice():
    from .units import X as Y

    return 2 * Y


if __name__ == "__main__":
    print("measured", twice(), u.X)
''',
    "tests/test_x.py": '''from pytest_fabric.measure import twice
from pytest_fabric import X, units

TARGET = "pytest_fabric.measure.twice"
ARGV = ["-m", "pytest_fabric.units"]
''',
    "tests/test_layout.py": "import pytest\n",
    "README.md": "# tiny\n\n## Layout\n\n    pytest_fabric/units.py     X\n    pytest_fabric/measure.py   twice\n"
                 "    tests/                     tests\n\n| to change | where |\n|---|---|\n| X | `units.py` |\n",
}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def tree(tmp_path):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "flat")
    return tmp_path


def _python(root: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, check=True, capture_output=True,
                          text=True).stdout


def test_moves_rewrites_and_keeps_the_old_paths(tree):
    said: list[str] = []
    assert regroup.regroup(tree, PLAN, out=said.append) == 0
    pkg = tree / "pytest_fabric"
    assert not (pkg / "units.py").exists() and (pkg / "core" / "units.py").read_text() == "X = 1\n"
    assert (pkg / "core" / "__init__.py").read_text() == '"""core/: the leaves."""\n'
    measure = (pkg / "measuring" / "measure.py").read_text()
    assert "from ..core.units import X\n" in measure
    assert "from ..core import units as u\nfrom .. import __version__  # noqa: F401\n" in measure
    assert "    from ..core.units import X as Y\n" in measure  # inside a function too
    assert "python -m pytest_fabric.measuring.measure" in measure
    assert (pkg / "cli.py").read_text() == "from .measuring.measure import twice\n"
    test = (tree / "tests" / "test_x.py").read_text()
    assert test.splitlines() == ["from pytest_fabric.measuring.measure import twice",
                                 "from pytest_fabric import X", "from pytest_fabric.core import units", "",
                                 'TARGET = "pytest_fabric.measuring.measure.twice"',
                                 'ARGV = ["-m", "pytest_fabric.core.units"]']
    init = (pkg / "__init__.py").read_text()
    assert '"X": "core.units"' in init and "'measure': 'measuring.measure'" in init
    assert 'PACKAGE_ORDER = ("core", "measuring", "")' in (tree / "tests" / "test_layout.py").read_text()
    readme = (tree / "README.md").read_text()
    assert "    pytest_fabric/core/" in readme and "        units.py" in readme and "`core/units.py`" in readme
    assert "R  pytest_fabric/units.py -> pytest_fabric/core/units.py" in _git(tree, "status", "--short")

    # Old paths are the moved modules themselves; `python -m` runs the moved module.
    _python(tree, "-c", "import pytest_fabric.measure as old, pytest_fabric.measuring.measure as new; "
                        "assert old is new and old.__spec__.name == 'pytest_fabric.measuring.measure'; "
                        "from pytest_fabric import X, units; assert X == 1 and units.__name__.endswith('core.units')")
    assert _python(tree, "-m", "pytest_fabric.measure") == "measured 2 1\n"
    assert _python(tree, "-m", "pytest_fabric.measuring.measure") == "measured 2 1\n"

    # A second run has nothing to do.
    before = _git(tree, "status", "--porcelain")
    said.clear()
    assert regroup.regroup(tree, PLAN, out=said.append) == 0
    assert said == ["tools/regroup.py: nothing to do (every module in MAPPING is in its folder, every "
                    "reference up to date)"]
    assert _git(tree, "status", "--porcelain") == before


def test_a_module_without_a_row_is_refused_by_name(tree):
    (tree / "pytest_fabric" / "tables.py").write_text("")
    with pytest.raises(regroup.Refused, match=r"pytest_fabric/tables\.py: no row"):
        regroup.regroup(tree, PLAN, out=lambda _: None)
    assert (tree / "pytest_fabric" / "units.py").exists()  # nothing moved


def test_a_role_named_like_a_module_is_refused(tree):
    plan = regroup.Plan(mapping={**PLAN.mapping, "core": "core"}, roles=PLAN.roles, order=PLAN.order,
                        front_doors=PLAN.front_doors)
    with pytest.raises(regroup.Refused, match="named like a module"):
        regroup.regroup(tree, plan, out=lambda _: None)
