"""The price table: what a model's tokens cost, read from the operator's TOML file, and the
cost of one attempt by it. A model the table does not price costs None (unknown), never 0."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from activities.toml_files import read_toml_file

# What a call in a provider batch costs of the direct price: OpenAI's Batch API and
# Anthropic's Message Batches both charge half. A model's `batch` in the file says otherwise.
BATCH_FACTOR = 0.5

# Priced without a file: the fake provider's models cost nothing, since nothing is called.
BUILT_IN = {"fake*": (0.0, 0.0)}


class InvalidPrices(ValueError):
    """The price file cannot be read; the message names the file and what to fix."""


class _Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, allow_inf_nan=False, description="USD per million input tokens")
    output: float = Field(ge=0, allow_inf_nan=False, description="USD per million output tokens")
    batch: float = Field(
        default=BATCH_FACTOR,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="The share of the price a call in a provider batch costs",
    )


class _PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, _Price] = Field(default_factory=dict)


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    batch_factor: float = BATCH_FACTOR


class PriceTable:
    """Prices by model name: an exact name wins, else the longest matching pattern
    (`gpt-4o*` prices `gpt-4o-2024-08-06`, the dated name a provider answers with)."""

    def __init__(self, prices: Mapping[str, Price]) -> None:
        self._exact = {name: price for name, price in prices.items() if not _is_pattern(name)}
        self._patterns = sorted(
            ((name, price) for name, price in prices.items() if _is_pattern(name)),
            key=lambda item: -len(item[0]),
        )

    @classmethod
    def load(cls, path: Path | None) -> PriceTable:
        prices = {name: Price(*per_mtok) for name, per_mtok in BUILT_IN.items()}
        if path is not None:
            prices.update(read_price_file(path))
        return cls(prices)

    def price_of(self, model: str) -> Price | None:
        found = self._exact.get(model)
        if found is not None:
            return found
        return next((p for name, p in self._patterns if fnmatch.fnmatchcase(model, name)), None)

    def cost(
        self,
        model: str,
        input_tokens: int | None,
        output_tokens: int | None,
        *,
        batch: bool = False,
    ) -> float | None:
        """US dollars, or None when the model has no price or a token count is unknown;
        `batch`: the call ran in a provider batch, at the model's batch rate."""
        price = self.price_of(model)
        if price is None or input_tokens is None or output_tokens is None:
            return None
        cost = (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1e6
        if batch:
            cost *= price.batch_factor
        return round(cost, 9) if math.isfinite(cost) else None


def read_price_file(path: Path) -> dict[str, Price]:
    parsed = read_toml_file(
        path,
        _PriceFile,
        "the price file",
        '[models."NAME"] tables with `input` and `output` in USD per million tokens, and '
        "optionally `batch`, the share a provider batch costs, 0.5 by default",
        InvalidPrices,
    )
    return {
        name: Price(price.input, price.output, price.batch) for name, price in parsed.models.items()
    }


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")
