"""The HTML report as a reader opens it: headless Chromium loads the page, every plot renders, the
console stays clean.

A probe script is added to a copy of the page (the report itself has no script): it records errors
and console.error calls from the first moment, and after the load event writes what it saw into the
DOM, which Chromium's ``--dump-dom`` prints. ``.ci/run`` installs the browser from the distribution's
packages (chromium-headless-shell); locally the test skips only when no Chromium is installed, and
never under CI (``CI`` set), where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

from pytest_fabric.reporting.htmlreport import write_report
from pytest_fabric.history.night_files import load_results

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")

PROBE_HEAD = ("<script>window.__errors=[];addEventListener('error',e=>__errors.push(String(e.message||"
              "(e.target&&e.target.getAttribute&&e.target.getAttribute('src')))),true);const __ce=console.error;"
              "console.error=(...a)=>{__errors.push(a.join(' '));__ce(...a)};</script>")
PROBE_TAIL = ("<script>addEventListener('load',()=>{const imgs=[...document.images];const o=document.createElement('pre');"
              "o.id='probe';o.textContent=JSON.stringify({images:imgs.length,broken:imgs.filter(i=>!(i.complete&&"
              "i.naturalWidth>0)).map(i=>i.getAttribute('src')),errors:__errors});document.body.appendChild(o)});</script>")


def chromium() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"no headless Chromium ({', '.join(BROWSERS)}) under CI: .ci/run installs chromium-headless-shell")
        pytest.skip("no headless Chromium on this machine: apt-get install chromium-headless-shell (.ci/run does)")
    return found


def open_in_browser(page: Path) -> dict:
    """What the probe saw after ``page`` loaded in headless Chromium."""
    probe = page.with_name(f"probe-{page.name}")
    text = page.read_text()
    probe.write_text(text.replace("<head>", "<head>" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "</body>", 1))
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert match, f"the page did not finish loading:\n{done.stderr[-2000:]}"
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture
def report(tmp_path):
    pytest.importorskip("matplotlib")
    night = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    return write_report([night], tmp_path / "out", prices={"ib": 3.5, "eth": 2.9})


def test_the_report_loads_with_every_plot_rendered_and_no_console_error(report):
    seen = open_in_browser(report.html)
    assert seen["images"] == len(report.plots) >= 5  # per model, the gates, busbw per collective
    assert seen["broken"] == [] and seen["errors"] == []


def test_a_missing_plot_is_seen_as_broken(report):
    """The probe can fail: a plot deleted after writing is reported as broken."""
    gone = next(p for p in report.plots if p.name == "gates.png")
    gone.unlink()
    assert open_in_browser(report.html)["broken"] == [f"plots/{gone.name}"]
