"""Repository root conftest: lets `pytest suites/` and `pytest tests/` run from a bare checkout.

Installed (`pip install -e .`), the plugin loads through its pytest11 entry point; from a checkout
that was never installed it is loaded here instead, so it is never registered twice.
"""

from importlib.metadata import entry_points

if not any(ep.value == "pytest_fabric.plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["pytest_fabric.plugin"]
