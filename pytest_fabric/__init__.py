"""pytest-fabric: interconnect-fabric comparisons as tests.

A suite imports a handful of names from here: the gates, the measurement types and the catalogs.
The pytest plugin itself (options, fixtures ``fabric_case`` and ``fabric_measure``, markers
``fabric_matrix`` and ``fabric_comparison``) is loaded through the ``pytest11`` entry point.
"""

from __future__ import annotations

from .fabrics import FABRICS, REFERENCE_FABRIC, Fabric
from .gates import assert_ahead, assert_within, ratio
from .measure import Case, Measurement, MeasurementError, Settings
from .models import MODELS, ModelSpec

__version__ = "0.1.0"

__all__ = [
    "FABRICS",
    "MODELS",
    "REFERENCE_FABRIC",
    "Case",
    "Fabric",
    "Measurement",
    "MeasurementError",
    "ModelSpec",
    "Settings",
    "assert_ahead",
    "assert_within",
    "ratio",
]
