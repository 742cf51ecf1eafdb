"""Cost per token and the break-even premium: plain arithmetic on tokens/s and prices per GPU-hour."""

from __future__ import annotations

import pytest

from pytest_fabric.physics.cost import break_even_premium, break_even_price, cost_per_million_tokens


def test_cost_of_a_million_tokens():
    # 8 GPUs at $2/GPU-hour = $16/hour; 1000 tokens/s = 3.6M tokens/hour: $16 / 3.6 per million.
    assert cost_per_million_tokens(1000.0, 8, 2.0) == pytest.approx(16 / 3.6)
    assert cost_per_million_tokens(2000.0, 8, 2.0) == pytest.approx(cost_per_million_tokens(1000.0, 8, 2.0) / 2)


@pytest.mark.parametrize("tokens_per_s, gpus", [(0.0, 8), (-1.0, 8), (1000.0, 0)])
def test_cost_refuses_what_is_not_a_throughput(tokens_per_s, gpus):
    with pytest.raises(ValueError, match="tokens_per_s must be positive and gpus at least 1"):
        cost_per_million_tokens(tokens_per_s, gpus, 2.0)


def test_the_break_even_premium_is_the_throughput_ratio():
    assert break_even_premium(125.0, 100.0) == pytest.approx(0.25)
    assert break_even_premium(80.0, 100.0) == pytest.approx(-0.2)  # the "fast" fabric is slower
    # At the break-even price both fabrics cost the same per token.
    price = break_even_price(125.0, 100.0, 2.0)
    assert price == pytest.approx(2.5)
    assert cost_per_million_tokens(125.0, 8, price) == pytest.approx(cost_per_million_tokens(100.0, 8, 2.0))
    with pytest.raises(ValueError, match="throughputs must be positive"):
        break_even_premium(0.0, 100.0)
