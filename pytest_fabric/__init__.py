"""pytest-fabric: interconnect-fabric comparisons as tests.

A suite imports a handful of names from here: the gates, the measurement types and the catalogs.
The pytest plugin itself (options, fixtures ``fabric_case``, ``fabric_measure``, ``fabric_compare``,
markers ``fabric_matrix`` and ``fabric_comparison``) is loaded through the ``pytest11`` entry point.

Names are imported on first use: the rank programs under ``pytest_fabric.workload`` import this
package too, and must not pull in pytest (the gates do).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "FABRICS": "core.fabrics", "REFERENCE_FABRIC": "core.fabrics", "Fabric": "core.fabrics",
    "assert_ahead": "deciding.gates", "assert_within": "deciding.gates",
    "assert_at_least": "deciding.gates", "ratio": "deciding.gates", "busbw": "deciding.gates",
    "NamedValue": "deciding.gates", "GateOutcome": "deciding.gates",
    "Case": "core.case", "Measurement": "measuring.measurement",
    "BandwidthMeasurement": "measuring.measurement", "MeasurementError": "measuring.measurement",
    "LaunchSettings": "measuring.measure", "MODELS": "core.models",
    "ModelSpec": "core.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_fabric' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


# >>> old module paths: written by tools/regroup.py (rerun it rather than edit)
# Each module moved into its role's folder keeps its old name: ``pytest_fabric.<old>`` (an import, a
# monkeypatch target, ``python -m pytest_fabric.<old>`` on a node) is the moved module object itself,
# imported on first use, never a second copy.
_MOVED = {
    'across_nights': 'deciding.across_nights',
    'atomic': 'core.atomic',
    'audit': 'physics.audit',
    'baselines': 'history.baselines',
    'calibration': 'history.calibration',
    'case': 'core.case',
    'comparison': 'physics.comparison',
    'contrasts': 'deciding.contrasts',
    'cost': 'physics.cost',
    'dashboards': 'reporting.dashboards',
    'fabrics': 'core.fabrics',
    'fit': 'physics.fit',
    'fixtures': 'running.fixtures',
    'floor': 'physics.floor',
    'gates': 'deciding.gates',
    'hostbound': 'physics.hostbound',
    'htmlreport': 'reporting.htmlreport',
    'junit': 'history.junit',
    'matrix': 'running.matrix',
    'measure': 'measuring.measure',
    'measurement': 'measuring.measurement',
    'memory': 'physics.memory',
    'models': 'core.models',
    'nccl_evidence': 'measuring.nccl_evidence',
    'nccl_logs': 'measuring.nccl_logs',
    'nic_inventory': 'measuring.nic_inventory',
    'night_model': 'history.night_model',
    'nights': 'history.nights',
    'options': 'running.options',
    'predict': 'physics.predict',
    'preflight': 'measuring.preflight',
    'redact': 'core.redact',
    'references': 'deciding.references',
    'report_document': 'reporting.report_document',
    'report_plots': 'reporting.report_plots',
    'reporter': 'reporting.reporter',
    'sequential': 'deciding.sequential',
    'session': 'running.session',
    'setups': 'history.setups',
    'stats': 'deciding.stats',
    'step_model': 'physics.step_model',
    'steps': 'deciding.steps',
    'storage': 'core.storage',
    'store': 'measuring.store',
    'tables': 'reporting.tables',
    'terminal': 'reporting.terminal',
    'trend': 'reporting.trend',
    'units': 'core.units',
    'verdicts': 'deciding.verdicts',
}


class _OldPaths:
    """A meta-path finder and loader: ``pytest_fabric.<old>`` is ``pytest_fabric.<role>.<old>``."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):  # noqa: ANN001, ANN205
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in _MOVED:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, _OldPaths, loader_state=f"{__name__}.{_MOVED[old]}")

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
        new = f"{__name__}.{_MOVED[fullname.rpartition('.')[2]]}"
        return compile(f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n",
                       f"<{fullname}, moved to {new}>", "exec")


def _install_old_paths() -> None:
    import sys

    if not any(getattr(f, "__qualname__", "") == "_OldPaths" and getattr(f, "__module__", "") == __name__
               for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths)


_install_old_paths()
# <<< old module paths
