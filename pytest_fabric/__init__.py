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

from .core.version import VERSION as __version__

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
