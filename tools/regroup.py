#!/usr/bin/env python3
"""Group the flat ``pytest_fabric/*.py`` modules into role folders (issue 20, item 5), mechanically.

Run at the root of a checkout::

    python tools/regroup.py            # move, rewrite, regenerate; prints what it did
    python tools/regroup.py --check    # change nothing; exit 1 if a run would change something

What one run does, from the MAPPING below (module -> role folder):

1. refuses (exit 2, naming them) when a top-level ``pytest_fabric/*.py`` module or a subpackage is
   in no row of MAPPING / ORDER: whoever runs it adds the new modules first;
2. ``git mv pytest_fabric/<m>.py pytest_fabric/<role>/<m>.py`` (and ``git add`` each new role's
   ``__init__.py``, a one-line docstring);
3. rewrites the imports in ``pytest_fabric/``, ``tests/``, ``benchmarks/``, ``suites/``,
   ``fixtures/`` (``.py`` and ``.md`` only: the recorded data there is left as recorded),
   ``conftest.py``, ``tools/`` (but this file and its test), ``docs/*.md``, ``README.md``, ``pyproject.toml``,
   ``tox.ini`` and ``.ci/``:
   relative imports (``.x``, ``..x``, ``from . import x``) recomputed from each module's new place,
   ``from pytest_fabric import <module>`` pointed at the module's folder, and every dotted
   ``pytest_fabric.<old>`` (absolute imports, importlib strings, ``python -m`` command lines,
   monkeypatch targets, comments) and ``pytest_fabric/<old>.py`` path rewritten;
4. writes, between markers, the old-path aliases into ``pytest_fabric/__init__.py`` (a meta-path
   finder: ``pytest_fabric.<old>`` is the moved module object itself, imported on first use, and
   ``python -m pytest_fabric.<old>`` runs the moved module as ``__main__``), and points
   ``_EXPORTS`` (the lazily exported public names) at the new places;
5. appends (between markers) to ``tests/test_layout.py`` the package order and the tests that hold
   the tree to it, and regenerates README's "Layout" block; the "where a change goes" table's
   module names get their folder.

A second run finds nothing to do and says so. Run it again after merging a branch written against
the old paths: it rewrites that branch's references too (the old names stay in the alias table).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "pytest_fabric"

# Each role folder in one line (the role's __init__.py docstring and README's layout heading).
ROLES = {
    "core": "what every role shares, importing nothing above it: the fabric and model catalogs, the "
            "case, units, files written whole, secrets masked, disk faults",
    "physics": "what a step should take before anything runs: the analytical model, the floor, memory, the "
               "host-bound rule, cost, and their checks against measured steps (fit, audit)",
    "measuring": "a launch and what it returns: the measurer, the session's shared store, node facts "
                 "before a launch, NCCL's evidence of the transport that ran",
    "deciding": "from launches to a verdict: statistics, gates, outcome words, the suite file's thresholds",
    "history": "what outlives a session: the night model, saved nights, baselines, the JUnit file "
               "written, read back and merged, the step model calibrated on saved nights",
    "running": "one pytest session's objects, wired by plugin.py: options, the session, the matrix, "
               "the fixtures' objects",
    "reporting": "what people and dashboards read: the controller's reporter, terminal tables, "
                 "dashboards, the HTML/Markdown report",
}

# Folders lowest first: a module imports its own folder's modules, a lower folder's, or a leaf (the
# layout test's LEAVES). "" is the top level: the front doors (__init__, plugin, cli) only.
ORDER = ("core", "cluster", "workload", "physics", "measuring", "deciding", "history", "running",
         "reporting", "")

# module -> role folder; "" stays at the top level. Every top-level module needs a row.
MAPPING = {
    "__init__": "",        # the public names (lazily) and the old module paths
    "plugin": "",          # the pytest11 entry point (pyproject.toml)
    "cli": "",             # the console script pytest-fabric = pytest_fabric.cli:main
    "atomic": "core", "case": "core", "fabrics": "core", "models": "core", "redact": "core",
    "storage": "core", "units": "core",
    "predict": "physics", "floor": "physics", "fit": "physics", "memory": "physics",
    "hostbound": "physics", "cost": "physics", "audit": "physics",
    "measure": "measuring", "store": "measuring", "preflight": "measuring", "nccl_evidence": "measuring",
    "stats": "deciding", "gates": "deciding", "verdicts": "deciding", "references": "deciding",
    "night_model": "history", "nights": "history", "baselines": "history", "junit": "history",
    "calibration": "history", "setups": "history",  # fits the step model to saved nights' launches
    "options": "running", "session": "running", "matrix": "running", "fixtures": "running",
    "reporter": "reporting", "terminal": "reporting", "dashboards": "reporting", "htmlreport": "reporting",
    # Named by issue 20 and not written yet (a row whose module is absent is skipped): the measurement
    # value type as a leaf (gates, junit, nights and terminal import it without the launch machinery)
    # and the one table model the terminal, report, summary and metrics render.
    "measurement": "measuring", "tables": "reporting",
    # Split out of nccl_evidence (the NCCL log reader, the NIC inventory) and htmlreport (the
    # document, its plots, the trend report).
    "nccl_logs": "measuring", "nic_inventory": "measuring",
    "report_document": "reporting", "report_plots": "reporting", "trend": "reporting",
    # Split out of stats by role (stats re-exports every name): one launch's steps -> its value, the
    # contrasts across launches and the gate, the sequential design, the robust center across nights.
    "steps": "deciding", "contrasts": "deciding", "sequential": "deciding", "across_nights": "deciding",
    # Split out of predict (which re-exports them): the step model itself, and the model next to a
    # measured comparison (the fitted throughput, the predicted: ...; measured: ... line).
    "step_model": "physics", "comparison": "physics",
}

# Where the rewrite looks (git-tracked and untracked-not-ignored files only).
PY_TREES = ("pytest_fabric", "tests", "benchmarks", "suites", "fixtures", "docs", ".ci", "tools")
SELF = ("tools/regroup.py", "tests/test_regroup.py")  # they name the old modules on purpose
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ini", ".cfg", ".txt", ".sh", ".rst"}
ROOT_FILES = ("conftest.py", "README.md", "pyproject.toml", "tox.ini", ".ci/run")
DATA_TREES = ("fixtures",)  # only .py and .md there: the rest is recorded output

INIT_BEGIN = "# >>> old module paths: written by tools/regroup.py (rerun it rather than edit)"
INIT_END = "# <<< old module paths"
TEST_BEGIN = "# >>> role folders: written by tools/regroup.py from its mapping (rerun it rather than edit)"
TEST_END = "# <<< role folders"


class Refused(Exception):
    """The tree is not one this mapping can regroup; the message says what to do."""


@dataclass
class Plan:
    mapping: dict[str, str] = field(default_factory=lambda: dict(MAPPING))
    roles: dict[str, str] = field(default_factory=lambda: dict(ROLES))
    order: tuple[str, ...] = ORDER
    front_doors: tuple[str, ...] = ("__init__", "plugin", "cli")


# ---------------------------------------------------------------------------------------------
# What is where


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _files(root: Path) -> list[Path]:
    listed = _git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    out = []
    for rel in sorted(set(listed)):
        if not rel or rel in SELF or not (root / rel).is_file():
            continue
        p = Path(rel)
        if rel in ROOT_FILES or (p.parts[0] in PY_TREES and p.suffix in TEXT_SUFFIXES):
            if p.parts[0] in DATA_TREES and p.suffix not in {".py", ".md"}:
                continue
            out.append(p)
    return out


def survey(root: Path, plan: Plan) -> tuple[dict[str, str], dict[str, str]]:
    """(moves this run: module -> role, aliases: every moved-or-moving module -> role)."""
    pkg = root / PACKAGE
    if not (pkg / "__init__.py").is_file():
        raise Refused(f"no {PACKAGE}/__init__.py here: run tools/regroup.py at the root of a checkout")
    clash = sorted(set(plan.roles) & set(plan.mapping))
    if clash:
        raise Refused(f"role folder(s) named like a module: {clash} (pytest_fabric.<old> must stay the module)")
    bad_role = sorted({r for r in plan.mapping.values() if r and r not in plan.roles})
    if bad_role:
        raise Refused(f"MAPPING names role(s) with no line in ROLES: {bad_role}")
    missing = sorted(r for r in plan.roles if r not in plan.order)
    if missing:
        raise Refused(f"role(s) {missing} have no place in ORDER")
    unknown = sorted(p.stem for p in pkg.glob("*.py") if p.stem not in plan.mapping)
    if unknown:
        names = ", ".join(f"{PACKAGE}/{m}.py" for m in unknown)
        raise Refused(f"{names}: no row in tools/regroup.py's MAPPING. Add each to MAPPING with its role "
                      f"folder (one of: {', '.join(plan.roles)}; \"\" keeps it at the top level) and rerun.")
    subpackages = sorted(p.parent.name for p in pkg.glob("*/__init__.py"))
    strays = [s for s in subpackages if s not in plan.order]
    if strays:
        raise Refused(f"subpackage(s) {strays} have no place in tools/regroup.py's ORDER: add them and rerun")
    moves, aliases = {}, {}
    for module, role in plan.mapping.items():
        if not role:
            continue
        top, placed = pkg / f"{module}.py", pkg / role / f"{module}.py"
        if top.exists() and placed.exists():
            raise Refused(f"both {top.relative_to(root)} and {placed.relative_to(root)} exist: merge them first")
        if top.exists():
            moves[module] = aliases[module] = role
        elif placed.exists():
            aliases[module] = role
    return moves, aliases


# ---------------------------------------------------------------------------------------------
# Rewriting one file


def _module_name(rel: Path, moves: dict[str, str]) -> tuple[str | None, str | None]:
    """(the package a file's relative imports resolve from now, and after the moves)."""
    if rel.parts[0] != PACKAGE or rel.suffix != ".py":
        return None, None
    parts = list(rel.with_suffix("").parts)
    now = ".".join(parts[:-1])  # the package that holds it (an __init__ is its own package)
    if parts[-1] == "__init__":
        return now, now
    if len(parts) == 2 and parts[1] in moves:
        return now, f"{PACKAGE}.{moves[parts[1]]}"
    return now, now


def _remap(dotted: str, aliases: dict[str, str]) -> str:
    parts = dotted.split(".")
    if len(parts) >= 2 and parts[0] == PACKAGE and parts[1] in aliases:
        return ".".join([PACKAGE, aliases[parts[1]], *parts[1:]])
    return dotted


def _relative(target: str, package: str) -> str:
    t, p = target.split("."), package.split(".")
    common = 0
    while common < min(len(t), len(p)) and t[common] == p[common]:
        common += 1
    return "." * (len(p) - common + 1) + ".".join(t[common:])


class _Offsets:
    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col: int) -> int:  # ast's col is a UTF-8 byte offset
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))


_FROM = re.compile(r"from(\s+)([.\w]+(?:\s*\.\s*\w+)*|\.+)(\s+)import\b")


def _import_edits(text: str, rel: Path, moves: dict[str, str], aliases: dict[str, str],
                  notes: list[str]) -> list[tuple[int, int, str]]:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        notes.append(f"{rel}: not parsed ({exc.msg}, line {exc.lineno}); only dotted names rewritten")
        return []
    now_pkg, new_pkg = _module_name(rel, moves)
    off = _Offsets(text)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if now_pkg is None:
                continue
            base = now_pkg.split(".")
            base = base[: len(base) - (node.level - 1)]
            absolute = ".".join(base + ([node.module] if node.module else []))
        elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
            absolute = node.module
        else:
            continue
        groups: dict[str, list[ast.alias]] = {}
        for alias in node.names:
            full = f"{absolute}.{alias.name}"
            if absolute == PACKAGE and alias.name in aliases:
                target = _remap(full, aliases).rsplit(".", 1)[0]
            else:
                target = _remap(absolute, aliases)
            groups.setdefault(target, []).append(alias)

        def spell(target: str) -> str:
            return _relative(target, new_pkg) if node.level else target

        start, end = off.at(node.lineno, node.col_offset), off.at(node.end_lineno, node.end_col_offset)
        stmt = text[start:end]
        if len(groups) == 1:
            (target,) = groups
            new = spell(target)
            m = _FROM.match(stmt)
            if m is None:
                notes.append(f"{rel}:{node.lineno}: import not rewritten (unusual spelling): {stmt!r}")
                continue
            if re.sub(r"\s", "", m.group(2)) != new:
                edits.append((start + m.start(2), start + m.end(2), new))
            continue
        line_start = off.starts[node.lineno - 1]
        indent = text[line_start:start]
        if indent.strip():
            sep = "; "
        else:
            sep = "\n" + indent
        if "#" in stmt:
            notes.append(f"{rel}:{node.lineno}: comments inside a split import were dropped")
        lines = [f"from {spell(t)} import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "")
                                                        for a in names)
                 for t, names in groups.items()]
        edits.append((start, end, sep.join(lines)))
    return edits


def _exports_edits(text: str, aliases: dict[str, str]) -> list[tuple[int, int, str]]:
    """``_EXPORTS = {"Name": "module"}`` in the package's __init__: module names relative to it."""
    tree = ast.parse(text)
    off = _Offsets(text)
    edits = []
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            d = node.value
            pairs = [(k, v) for k, v in zip(d.keys, d.values)]
            simple = all(isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant)
                         and isinstance(v.value, str) for k, v in pairs)
            start, end = off.at(d.lineno, d.col_offset), off.at(d.end_lineno, d.end_col_offset)
            if not simple or not any(v.value in aliases for _, v in pairs):
                continue
            if "#" in text[start:end]:  # comments inside: only the values change, lines may grow long
                for v in (v for _, v in pairs if v.value in aliases):
                    edits.append((off.at(v.lineno, v.col_offset), off.at(v.end_lineno, v.end_col_offset),
                                  f'"{aliases[v.value]}.{v.value}"'))
                continue
            items = [f'"{k.value}": "{aliases[v.value] + "." + v.value if v.value in aliases else v.value}",'
                     for k, v in pairs]
            lines, line = [], "   "
            for item in items:
                if len(line) + 1 + len(item) > 100:
                    lines.append(line)
                    line = "   "
                line += " " + item
            lines.append(line)
            edits.append((start, end, "{\n" + "\n".join(lines) + "\n}"))
    return edits


def _reflow_names(text: str, name: str) -> str:
    """``NAME = {"a", "b"}`` (strings only, no comments) rewrapped at 110 columns when a line is longer."""
    tree = ast.parse(text)
    off = _Offsets(text)
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]
                and isinstance(node.value, (ast.Set, ast.Tuple, ast.List))
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
            continue
        start, end = off.at(node.lineno, node.col_offset), off.at(node.end_lineno, node.end_col_offset)
        old = text[start:end]
        if "#" in old or max(len(ln) for ln in old.splitlines()) <= 110:
            return text
        brackets = {ast.Set: "{}", ast.Tuple: "()", ast.List: "[]"}[type(node.value)]
        items = [f'"{e.value}"' for e in node.value.elts]
        return text[:start] + _wrapped(items, f"{name} = {brackets[0]}", brackets[1], 110) + text[end:]
    return text


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _dotted(aliases: dict[str, str]) -> tuple[re.Pattern, re.Pattern] | None:
    if not aliases:
        return None
    names = "|".join(sorted(map(re.escape, aliases), key=len, reverse=True))
    return (re.compile(rf"(?<![\w.]){PACKAGE}\.({names})(?!\w)"),
            re.compile(rf"(?<![\w.]){PACKAGE}/({names})\.py(?!\w)"))


def rewrite(text: str, rel: Path, moves: dict[str, str], aliases: dict[str, str], notes: list[str]) -> str:
    original = text
    if rel.suffix == ".py":
        edits = _import_edits(text, rel, moves, aliases, notes)
        text = _apply(text, edits)
        if rel == Path(PACKAGE, "__init__.py"):
            text = _apply(text, _exports_edits(text, aliases))
    patterns = _dotted(aliases)
    if patterns:
        dotted, path = patterns
        text = dotted.sub(lambda m: f"{PACKAGE}.{aliases[m.group(1)]}.{m.group(1)}", text)
        text = path.sub(lambda m: f"{PACKAGE}/{aliases[m.group(1)]}/{m.group(1)}.py", text)
    if rel.suffix == ".py" and text != original:
        text = _wrap_long_imports(text, set(original.splitlines()))
    return text


def _wrap_long_imports(text: str, before: set[str]) -> str:
    """A one-line ``from x import a, b`` the rewrite made longer than 110 columns, in parentheses."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)), key=lambda n: -n.lineno):
        line = lines[node.lineno - 1]
        body, newline = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")):]
        if node.lineno != node.end_lineno or len(body) <= 110 or body in before:
            continue
        code, hash_, comment = body.partition("  #")
        head, sep, names = code.partition(" import ")
        names = names.strip()
        if names.startswith("(") and names.endswith(")"):
            names = names[1:-1]
        if not sep or ";" in code or "(" in names:
            continue
        first = f"{head} import ("
        wrapped = _wrapped([n.strip() for n in names.split(",")], first, ")")
        if hash_:
            first_line, _, rest = wrapped.partition("\n")
            wrapped = f"{first_line}  #{comment}" + (f"\n{rest}" if rest else "")
        lines[node.lineno - 1] = wrapped + newline
    return "".join(lines)


# ---------------------------------------------------------------------------------------------
# What the tool writes whole (between markers)


def _between(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with the marked block replaced by ``block`` (appended when there is none)."""
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        return head + block + tail
    return text.rstrip("\n") + "\n\n\n" + block + "\n"


def init_block(aliases: dict[str, str]) -> str:
    rows = "\n".join(f"    {m!r}: {f'{r}.{m}'!r}," for m, r in sorted(aliases.items()))
    return f'''{INIT_BEGIN}
# Each module moved into its role's folder keeps its old name: ``pytest_fabric.<old>`` (an import, a
# monkeypatch target, ``python -m pytest_fabric.<old>`` on a node) is the moved module object itself,
# imported on first use, never a second copy.
_MOVED = {{
{rows}
}}


class _OldPaths:
    """A meta-path finder and loader: ``pytest_fabric.<old>`` is ``pytest_fabric.<role>.<old>``."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):  # noqa: ANN001, ANN205
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in _MOVED:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, _OldPaths, loader_state=f"{{__name__}}.{{_MOVED[old]}}")

    @staticmethod
    def create_module(spec):  # noqa: ANN001, ANN205
        import importlib

        module = importlib.import_module(spec.loader_state)
        spec.loader_state = module.__spec__  # the import system sets __spec__: exec_module puts it back
        return module

    @staticmethod
    def exec_module(module):  # noqa: ANN001, ANN205
        if getattr(module.__spec__, "loader", None) is _OldPaths:
            module.__spec__ = module.__spec__.loader_state

    @staticmethod
    def get_code(fullname):  # noqa: ANN001, ANN205
        """``python -m pytest_fabric.<old>``: the moved module runs as ``__main__``, by its new name."""
        new = f"{{__name__}}.{{_MOVED[fullname.rpartition('.')[2]]}}"
        return compile(f"import runpy\\nrunpy.run_module({{new!r}}, run_name='__main__', alter_sys=True)\\n",
                       f"<{{fullname}}, moved to {{new}}>", "exec")


def _install_old_paths() -> None:
    import sys

    if not any(getattr(f, "__qualname__", "") == "_OldPaths" and getattr(f, "__module__", "") == __name__
               for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths)


_install_old_paths()
{INIT_END}'''


def _wrapped(items: list[str], first: str, last: str, width: int = 100) -> str:
    """``first`` + items joined by ", ", continued under the first item, + ``last``."""
    lines, line = [], first
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else last)
        if len(line) + len(piece.rstrip()) > width and line.strip() != first.strip():
            lines.append(line.rstrip())
            line = " " * len(first)
        line += piece
    return "\n".join(lines + [line])


def test_block(plan: Plan) -> str:
    order = _wrapped([f'"{r}"' for r in plan.order], "PACKAGE_ORDER = (", ")")
    doors = _wrapped([f'"{PACKAGE if d == "__init__" else f"{PACKAGE}.{d}"}"' for d in plan.front_doors],
                     "FRONT_DOORS = {", "}")
    return f'''{TEST_BEGIN}
# The package order, lowest first ("" is the top level): a module imports modules of its own folder
# or of one before it, or a leaf (LEAVES); the top level holds the front doors only.
{order}
{doors}


def _folder(name: str) -> str:
    return "" if MODULES[name].parent == PACKAGE else MODULES[name].relative_to(PACKAGE).parts[0]


def test_every_module_sits_in_a_role_folder():
    assert {{n for n in MODULES if _folder(n) == ""}} <= FRONT_DOORS
    assert {{_folder(n) for n in MODULES}} <= set(PACKAGE_ORDER)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_follow_the_package_order(name):
    rank = PACKAGE_ORDER.index(_folder(name))
    upwards = {{m for m in GRAPH[name] if PACKAGE_ORDER.index(_folder(m)) > rank and m not in LEAVES}}
    assert upwards == set(), f"{{name}} imports {{sorted(upwards)}}, above its folder in {{PACKAGE_ORDER}}"


def test_old_module_paths_are_the_moved_modules():
    import importlib

    import pytest_fabric

    for old, new in sorted(pytest_fabric._MOVED.items()):
        if new.split(".")[0] == PACKAGE_ORDER[0]:  # the leaves: cheap to import
            moved = importlib.import_module(f"pytest_fabric.{{new}}")
            assert importlib.import_module(f"pytest_fabric.{{old}}") is moved
{TEST_END}'''


# ---------------------------------------------------------------------------------------------
# README's layout section


_ENTRY = re.compile(r"^    (\S+)(?:\s+(.*))?$")
_CHILD = re.compile(r"^        (\w+\.py)(?:\s{2,}(.*))?$")


def _docline(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except SyntaxError:
        doc = ""
    return " ".join(doc.split("\n\n")[0].split()) or "(no docstring)"


def readme_layout(text: str, root: Path, plan: Plan, aliases: dict[str, str]) -> str:
    head, sep, section = text.partition("\n## Layout\n")
    if not sep:
        return text
    body, nxt, after = section.partition("\n## ")
    lines = body.split("\n")
    block_start = next((i for i, ln in enumerate(lines) if ln.startswith("    ")), None)
    if block_start is None:
        return text
    block_end = block_start
    while block_end < len(lines) and (lines[block_end].startswith("    ") or not lines[block_end].strip()):
        block_end += 1
    while block_end > block_start and not lines[block_end - 1].strip():
        block_end -= 1
    entries: list[list[str]] = []  # [path, description]
    modules: dict[str, str] = {}
    for ln in lines[block_start:block_end]:
        child, entry = _CHILD.match(ln), _ENTRY.match(ln)
        if child:
            entries.append([f"{PACKAGE}/*/{child.group(1)}", child.group(2) or ""])
        elif entry:
            entries.append([entry.group(1), entry.group(2) or ""])
        elif entries and ln.strip():
            entries[-1][1] += " " + ln.strip()
    others = []
    for path, desc in entries:
        m = re.fullmatch(rf"{PACKAGE}/(?:(?:\*|\w+)/)?(\w+)\.py", path)
        if m and (m.group(1) in plan.mapping):
            modules[m.group(1)] = desc
        elif path.rstrip("/").split("/")[-1] in plan.roles and path.startswith(PACKAGE):
            continue  # a role heading: written from ROLES
        else:
            others.append((path, desc))
    pkg = root / PACKAGE

    def described(module: str, where: Path) -> str:
        return modules.get(module) or _docline(where)

    rows: list[tuple[str, str]] = []
    for module in plan.front_doors:
        if (pkg / f"{module}.py").exists():
            rows.append((f"{PACKAGE}/{module}.py", described(module, pkg / f"{module}.py")))
    if "__init__" in plan.front_doors and not modules.get("__init__"):
        rows[0] = (rows[0][0], "the public names a suite imports (loaded on first use), and each moved "
                               "module's old path kept importable (python -m too)")
    kept = {p: d for p, d in others}
    for role in plan.order:
        if not role:
            continue
        if role in plan.roles:
            rows.append((f"{PACKAGE}/{role}/", plan.roles[role]))
            for module in sorted(m for m, r in plan.mapping.items() if r == role):
                where = pkg / role / f"{module}.py"
                if where.exists() or (pkg / f"{module}.py").exists() and aliases.get(module) == role:
                    rows.append((f"    {module}.py", described(module, where if where.exists() else pkg / f"{module}.py")))
        elif f"{PACKAGE}/{role}/" in kept:
            rows.append((f"{PACKAGE}/{role}/", kept.pop(f"{PACKAGE}/{role}/")))
    rows += list(kept.items())
    width = max(33, max(4 + len(p) for p, _ in rows) + 2)
    out = []
    for path, desc in rows:
        first = ("    " + path).ljust(width)
        wrapped = textwrap.wrap(desc, 110 - width) or [""]
        out.append((first + wrapped[0]).rstrip())
        out += [" " * width + w for w in wrapped[1:]]
    lines[block_start:block_end] = out
    body = "\n".join(lines)

    # "Where a change goes": `module.py` and `module.name` get their folder.
    names = "|".join(sorted((re.escape(m) for m in aliases), key=len, reverse=True))
    if names:
        body = re.sub(rf"`({names})(\.\w+)", lambda m: f"`{aliases[m.group(1)]}/{m.group(1)}{m.group(2)}", body)
    row = ("| a new module | the folder whose line above says its role (`tests/test_layout.py` refuses a module "
           "at the top level and an import of a folder after its own) |")
    if "| a new module |" not in body:
        table = [i for i, ln in enumerate(body.split("\n")) if ln.startswith("|")]
        if table:
            blines = body.split("\n")
            blines.insert(table[-1] + 1, row)
            body = "\n".join(blines)
    sentence = ("Folders import only their own modules, leaves, and the folders before them in this order: "
                + ", ".join(f"`{r}/`" for r in plan.order if r) + ", then the top level.")
    if "Folders import only their own modules" not in body:
        body = body.rstrip("\n") + "\n\n" + textwrap.fill(sentence, 100) + "\n"
    return head + sep + body + nxt + after


# ---------------------------------------------------------------------------------------------


def regroup(root: Path, plan: Plan | None = None, check: bool = False, out=print) -> int:
    plan = plan or Plan()
    root = root.resolve()
    moves, aliases = survey(root, plan)
    notes: list[str] = []
    files = _files(root)
    changed: dict[Path, str] = {}
    for rel in files:
        text = (root / rel).read_text()
        new = rewrite(text, rel, moves, aliases, notes)
        if rel == Path(PACKAGE, "__init__.py") and aliases:
            new = _between(new, INIT_BEGIN, INIT_END, init_block(aliases))
        if rel == Path("tests", "test_layout.py") and aliases:
            new = _between(_reflow_names(new, "LEAVES"), TEST_BEGIN, TEST_END, test_block(plan))
        if rel == Path("README.md") and aliases:
            new = readme_layout(new, root, plan, aliases)
        if new != text:
            changed[rel] = new
    new_roles = sorted({r for r in moves.values() if not (root / PACKAGE / r / "__init__.py").exists()})
    if not moves and not changed and not new_roles:
        out("tools/regroup.py: nothing to do (every module in MAPPING is in its folder, every reference "
            "up to date)")
        return 0
    for note in notes:
        out(f"note: {note}")
    if check:
        for m, r in sorted(moves.items()):
            out(f"would move {PACKAGE}/{m}.py -> {PACKAGE}/{r}/{m}.py")
        for rel in sorted(changed):
            out(f"would rewrite {rel}")
        return 1
    for rel, text in changed.items():
        (root / rel).write_text(text)
    for role in new_roles:
        init = root / PACKAGE / role / "__init__.py"
        init.parent.mkdir(exist_ok=True)
        init.write_text('"""' + textwrap.fill(f"{role}/: {plan.roles[role]}.", 96) + '"""\n')
        _git(root, "add", str(init.relative_to(root)))
        out(f"created {init.relative_to(root)}")
    for m, r in sorted(moves.items()):
        _git(root, "mv", f"{PACKAGE}/{m}.py", f"{PACKAGE}/{r}/{m}.py")
        out(f"moved {PACKAGE}/{m}.py -> {PACKAGE}/{r}/{m}.py")
    for rel in sorted(changed):
        parts = rel.parts
        if len(parts) == 2 and parts[0] == PACKAGE and rel.stem in moves:
            rel = Path(PACKAGE, moves[rel.stem], rel.name)
        _git(root, "add", str(rel))
        out(f"rewrote {rel}")
    out(f"tools/regroup.py: {len(moves)} module(s) moved, {len(changed)} file(s) rewritten; "
        "staged, nothing committed (review with git diff --cached -M)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/regroup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a run would")
    args = parser.parse_args(argv)
    try:
        return regroup(args.root, check=args.check)
    except Refused as exc:
        print(f"tools/regroup.py: refused: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
