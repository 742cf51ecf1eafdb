#!/usr/bin/env python
"""Did a structural change keep the outputs? Two default runs compared with the numbers masked.

    python benchmarks/same_shape.py BEFORE.xml BEFORE.json AFTER.xml AFTER.json

Each pair is one `pytest suites/ --nodes 2 --junitxml=X.xml --fabric-save=X.json` run. Compared:
the testcases (class, name) and their outcomes; per testcase, the names of its JUnit machine lines
(`fabric.<...>=value`) and its properties; the suite properties' names; the saved night's keys, as
paths (`records.*.result.step_s`, with the store keys and list positions masked). Numbers differ
from run to run and are not compared; what a structural change must not move is which fields
exist where. Prints each difference and exits 1 if there is one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from xml.etree import ElementTree


def junit_shape(path: Path) -> dict[str, object]:
    """Per testcase: its outcome, the names of its machine lines and of its properties; the suites'
    property names."""
    shape: dict[str, object] = {}
    root = ElementTree.parse(path).getroot()
    for suite in root.iter("testsuite"):
        own = suite.find("properties")
        shape["suite properties"] = sorted({p.get("name") for p in own.iter("property")} if own is not None else ())
        for case in suite.iter("testcase"):
            result = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            out = "\n".join(e.text or "" for e in case.iter("system-out"))
            lines = sorted({line.partition("=")[0] for line in out.splitlines() if line.startswith("fabric.")})
            props = sorted({p.get("name") for p in case.iter("property")})
            shape[f"{case.get('classname')}::{case.get('name')}"] = (result, lines, props)
    return shape


def key_paths(data: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON document; store keys (``<case>#<hash>@<n>``) and list positions masked."""
    out: set[str] = set()
    if isinstance(data, dict):
        for k, v in data.items():
            name = "<key>" if "#" in k else k
            out.add(f"{prefix}.{name}")
            out |= key_paths(v, f"{prefix}.{name}")
    elif isinstance(data, list):
        for v in data:
            out |= key_paths(v, f"{prefix}[]")
    return out


def masked(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    before_xml, before_json, after_xml, after_json = map(Path, argv)
    diffs = []
    a, b = junit_shape(before_xml), junit_shape(after_xml)
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            diffs.append(f"junit {name}:\n  before {a.get(name)}\n  after  {b.get(name)}")
    ka = key_paths(json.loads(before_json.read_text()))
    kb = key_paths(json.loads(after_json.read_text()))
    for path in sorted(ka - kb):
        diffs.append(f"saved night: only before: {masked(path)}")
    for path in sorted(kb - ka):
        diffs.append(f"saved night: only after: {masked(path)}")
    print(f"{len(a)} JUnit entries and {len(ka)} saved-night key paths before, {len(b)} and {len(kb)} after")
    for d in diffs:
        print(d)
    print("same shape" if not diffs else f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
