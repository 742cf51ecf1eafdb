"""Cost: what a fabric's throughput is worth per token, and the premium at which a fast fabric pays.

Plain arithmetic on measured tokens/s and prices per GPU-hour (ini ``fabric_price``); the terminal
summary and ``pytest-fabric report`` price nights with it.
"""

from __future__ import annotations

__all__ = ["break_even_premium", "break_even_price", "cost_per_million_tokens"]



def cost_per_million_tokens(tokens_per_s: float, gpus: int, price_per_gpu_hour: float) -> float:
    """Price of one million tokens: GPU-hours per million tokens x price per GPU-hour."""
    if tokens_per_s <= 0 or gpus < 1:
        raise ValueError(f"tokens_per_s must be positive and gpus at least 1, got {tokens_per_s} and {gpus}")
    return gpus * price_per_gpu_hour / 3600.0 * 1e6 / tokens_per_s


def break_even_premium(fast_tps: float, slow_tps: float) -> float:
    """Relative per-GPU-hour premium at which the fast fabric costs the same per token (same GPUs).

    Per token the cost is price / tokens_per_s, so parity is price_fast / price_slow =
    fast_tps / slow_tps: 0.25 means the fast fabric is worth up to 25% more per GPU-hour. Negative
    when the "fast" fabric is in fact slower.
    """
    if fast_tps <= 0 or slow_tps <= 0:
        raise ValueError(f"throughputs must be positive, got {fast_tps} and {slow_tps}")
    return fast_tps / slow_tps - 1.0


def break_even_price(fast_tps: float, slow_tps: float, slow_price_per_gpu_hour: float) -> float:
    """The fast fabric's per-GPU-hour price at which both fabrics cost the same per token."""
    return slow_price_per_gpu_hour * (1.0 + break_even_premium(fast_tps, slow_tps))
