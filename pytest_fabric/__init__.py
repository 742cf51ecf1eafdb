"""pytest-fabric: interconnect-fabric comparisons as tests.

A suite imports a handful of names from here: the gates, the measurement types and the catalogs.
"""

from __future__ import annotations

__version__ = "0.1.0"
