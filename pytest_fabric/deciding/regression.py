"""The regression gate's reference terms: what a saved baseline says a configuration was, as the
fixed term of tonight's interval (``contrasts.contrast_interval(fixed=)``), for each measure a
regression gate judges (``gates.REGRESSION_MEASURES``): raw tokens/s, scaling efficiency (n-node
over one-node tokens/s/GPU) and fabric time (``contrasts.fabric_time_reference``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .contrasts import NoisePrior, fabric_time_reference, reference_term


@dataclass(frozen=True)
class BaselineTerms:
    """A baseline's figures of one n-node configuration and of its one-node configuration.

    ``values_n`` / ``values_1``: tokens/s per saved night (each the mean of ``per_night_*`` launches)
    or per launch of a single saved night; ``nights``: per night that measured both, (log n-node,
    log one-node) tokens/s/GPU, whose difference is that night's own scaling efficiency.
    """

    values_n: Sequence[float]
    values_1: Sequence[float]
    gpus_n: int
    gpus_1: int
    nights: Sequence[tuple[float, float]]
    per_night_n: float
    per_night_1: float

    def tokens(self, prior: NoisePrior | None) -> tuple[float, float]:
        """(log tokens/s, variance) of the n-node configuration."""
        return reference_term(self.values_n, prior, self.per_night_n)

    def fabric_time(self, noise_n: NoisePrior | None,
                    noise_1: NoisePrior | None) -> tuple[tuple[float, float], float, NoisePrior | None]:
        """(reference, one-node reference, prior) of the fabric-time measure: from each night's pair
        where two or more nights measured both, else from the two configurations' values apart."""
        apart = None if len(self.nights) >= 2 else ([v / self.gpus_n for v in self.values_n],
                                                    [v / self.gpus_1 for v in self.values_1])
        return fabric_time_reference(noise_n, noise_1, self.nights, apart, min(self.per_night_n, self.per_night_1))

    def scaling(self, prior_n: NoisePrior | None, prior: NoisePrior | None) -> tuple[float, float]:
        """(log scaling efficiency, variance): each night's own efficiency where two or more nights
        measured both (what moved both of a night's values, the machine's speed that night, cancels
        as it does in tonight's rounds), else the two configurations' values apart."""
        if len(self.nights) >= 2:
            return reference_term([math.exp(m - s) for m, s in self.nights], prior, min(self.per_night_n, self.per_night_1))
        past, past_one = self.tokens(prior_n), reference_term(self.values_1, prior, self.per_night_1)
        return past[0] - past_one[0] - (math.log(self.gpus_n) - math.log(self.gpus_1)), past[1] + past_one[1]

    def efficiency(self) -> float:
        """The baseline's scaling efficiency, shown beside a fabric-time or scaling verdict."""
        if len(self.nights) >= 2:
            return math.exp(statistics.fmean(m - s for m, s in self.nights))
        return math.exp(statistics.fmean(math.log(v / self.gpus_n) for v in self.values_n)
                        - statistics.fmean(math.log(v / self.gpus_1) for v in self.values_1))
