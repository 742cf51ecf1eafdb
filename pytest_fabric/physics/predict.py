"""Prediction: what the fabric should cost a configuration, before (or instead of) measuring it.

A comparison is only worth running, and a gate only worth its threshold, if the configuration can
show the fabric at all. The analytical model that says which lives in two parts, both re-exported
here with every name (private ones included), so ``physics.predict`` (and its old top-level path)
keeps working as before:

- ``step_model``: the model itself: ``JobShape`` (a job's shape, its one spelling), the traffic FSDP
  moves, the step time and what bounds it (``predict_step``), the fabric penalty
  (``predict_penalty``), a measured configuration (``Observation``);
- ``comparison``: the model next to a measured comparison: the compute throughput fitted to the
  fast fabric's measured step (``fit_flops``), ``predict_comparison`` and the ``predicted: ...;
  measured: ...`` line (``comparison_line``).

Plain standard library; no torch: the plugin predicts while collecting tests, long before any launch.
"""

from __future__ import annotations

from .comparison import (BOUND_WORDS, ComparisonPrediction, _flops_text, _percent_slower, comparison_line,
                         fit_flops, predict_comparison)
from .step_model import (_TORCH_DTYPE_BYTES, BYTES_PER_DTYPE, COMMUNICATION_BOUND_ABOVE, COMPUTE_BOUND_BELOW,
                         DEFAULT_LINK_EFFICIENCY, DEFAULT_RESOLUTION, JobShape, Observation, Penalty, Prediction,
                         _bound, bytes_per_param, fsdp_bytes_per_rank, predict_penalty, predict_step,
                         recorded_bytes)

__all__ = [
    "BOUND_WORDS",
    "BYTES_PER_DTYPE",
    "ComparisonPrediction",
    "JobShape",
    "Observation",
    "Penalty",
    "Prediction",
    "bytes_per_param",
    "fit_flops",
    "fsdp_bytes_per_rank",
    "predict_comparison",
    "predict_penalty",
    "predict_step",
    "recorded_bytes",
]
