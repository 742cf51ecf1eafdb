"""Across nights: past nights' values combined into a center that one bad night does not move.

Part of the statistics (README, "How verdicts are decided"): ``robust_baseline`` drops outlier nights
(a modified z-score rule on the MAD) and returns a ``RobustCenter``. A leaf.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .steps import MAD_TO_SIGMA, _mad

__all__ = ["FEW_NIGHTS", "FEW_NIGHTS_REL_FLOOR", "RobustCenter", "robust_baseline"]

@dataclass(frozen=True)
class RobustCenter:
    center: float
    # Robust standard deviation (1.4826 x MAD) of the values kept; 0 with fewer than 2 kept.
    spread: float
    kept: tuple[float, ...]
    dropped: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.kept)

    @property
    def rel_spread(self) -> float:
        return self.spread / abs(self.center) if self.center else math.inf


# Below this many nights the MAD is itself fragile (of 3 values it is the smaller of two deviations):
# the spread used to name outliers then never counts as less than FEW_NIGHTS_REL_FLOOR of the median.
FEW_NIGHTS = 5
FEW_NIGHTS_REL_FLOOR = 0.10


def robust_baseline(values: Sequence[float], k: float = 3.5, rel_floor: float = 0.01) -> RobustCenter:
    """Combine past nights' values into a center and a spread, dropping outliers.

    An outlier is a value whose modified z-score |x - median| / (1.4826 MAD) exceeds ``k``
    (3.5, Iglewicz and Hoaglin's rule). When more than half the values are identical the MAD is
    zero; the mean absolute deviation (x 1.2533) stands in. The spread used for the rule never
    counts as less than ``rel_floor`` of the median; with fewer than ``FEW_NIGHTS`` values that
    floor is ``FEW_NIGHTS_REL_FLOOR`` (of 211, 217 and 174 tokens/s the MAD rule dropped 174, an
    ordinary night on a machine that drifts 15%). Two values cannot tell which of them is the
    outlier: both are kept. The center is the median of the values kept.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no values to make a baseline from")
    if len(vals) <= 2:
        kept = vals
    else:
        med = statistics.median(vals)
        scale = MAD_TO_SIGMA * _mad(vals, med)
        if scale == 0.0:
            scale = 1.2533 * statistics.fmean(abs(v - med) for v in vals)
        floor = max(rel_floor, FEW_NIGHTS_REL_FLOOR) if len(vals) < FEW_NIGHTS else rel_floor
        scale = max(scale, floor * abs(med))
        kept = vals if scale == 0.0 else [v for v in vals if abs(v - med) <= k * scale]
    dropped = [v for v in vals if v not in kept]
    center = statistics.median(kept)
    spread = MAD_TO_SIGMA * _mad(kept, center) if len(kept) >= 2 else 0.0
    return RobustCenter(center, spread, tuple(kept), tuple(dropped))
