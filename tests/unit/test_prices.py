"""The price table: exact names win, then the longest matching pattern; no price is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.prices import InvalidPrices, Price, PriceTable


def test_an_exact_name_wins_then_the_longest_pattern() -> None:
    table = PriceTable(
        {
            "gpt-4o*": Price(2.5, 10.0),
            "gpt-4o-mini*": Price(0.15, 0.6),
            "gpt-4o-mini-2024-07-18": Price(0.1, 0.4),
        }
    )
    assert table.price_of("gpt-4o-2024-08-06") == Price(2.5, 10.0)
    assert table.price_of("gpt-4o-mini-2025-01-01") == Price(0.15, 0.6)
    assert table.price_of("gpt-4o-mini-2024-07-18") == Price(0.1, 0.4)
    assert table.price_of("claude-haiku-4-5") is None


def test_cost_is_per_million_tokens_and_unknown_without_a_price_or_a_count() -> None:
    table = PriceTable({"m": Price(2.0, 8.0)})
    assert table.cost("m", 1_000, 500) == pytest.approx((1_000 * 2.0 + 500 * 8.0) / 1e6)
    assert table.cost("other", 1_000, 500) is None
    assert table.cost("m", None, 500) is None


def test_the_fake_provider_is_free_and_a_file_adds_to_it(tmp_path: Path) -> None:
    assert PriceTable.load(None).cost("fake-1", 10, 10) == 0.0
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."claude-*"]\ninput = 1\noutput = 5\n')
    table = PriceTable.load(prices)
    assert table.cost("claude-haiku-4-5", 1_000_000, 0) == 1.0
    assert table.cost("fake-1", 10, 10) == 0.0


def test_a_call_in_a_provider_batch_costs_its_models_batch_rate(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[models."gpt-*"]\ninput = 2\noutput = 8\n'
        '[models."claude-*"]\ninput = 1\noutput = 5\nbatch = 0.4\n'
    )
    table = PriceTable.load(prices)
    # Half price unless the file says otherwise.
    assert table.cost("gpt-5", 1_000_000, 0, batch=True) == pytest.approx(1.0)
    assert table.cost("gpt-5", 1_000_000, 0) == pytest.approx(2.0)
    assert table.cost("claude-haiku-4-5", 0, 1_000_000, batch=True) == pytest.approx(2.0)
    prices.write_text('[models."m"]\ninput = 1\noutput = 1\nbatch = 2\n')
    with pytest.raises(InvalidPrices, match="batch"):
        PriceTable.load(prices)
