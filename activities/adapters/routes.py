"""Named routes: the operator names a path of places (provider and model, in order), clients
name the route, and the operator changes the path in one place (`PROMPTJOBS_ROUTES_FILE`).

    [routes]
    smart = ["openai/gpt-4o", "anthropic/claude-sonnet-4-5"]
    cheap = ["openai/gpt-4o-mini", "anthropic"]   # a provider alone: its default model

A job naming a route (`options.route`, or the OpenAI routes' `model`) runs at the route's
first place, with the others as its `fallbacks`, as the route read when it was submitted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from activities.adapters.options import MAX_FALLBACKS
from activities.toml_files import read_toml_file

ROUTE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
PlaceText = Annotated[str, StringConstraints(min_length=1, max_length=161, pattern=r"^[^\x00]+$")]


class InvalidRoutes(ValueError):
    """The routes file cannot be used; the message names the file and what to fix."""


@dataclass(frozen=True)
class Place:
    provider: str
    model: str | None = None

    @classmethod
    def parse(cls, text: str) -> Place:
        provider, _, model = text.partition("/")
        return cls(provider, model or None)

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}" if self.model else self.provider


class _RoutesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    routes: dict[
        Annotated[str, StringConstraints(pattern=ROUTE_NAME)],
        Annotated[list[PlaceText], Field(min_length=1, max_length=MAX_FALLBACKS + 1)],
    ]


def read_routes(path: Path) -> dict[str, list[Place]]:
    """The routes of the file at `path`, each a list of places; InvalidRoutes saying why not.
    Whether each place's provider is one of this deployment's is the registry's check."""
    parsed = read_toml_file(
        path,
        _RoutesFile,
        "the routes file",
        f'a [routes] table of NAME = ["provider/model", …], 1 to {MAX_FALLBACKS + 1} places, '
        "names of letters, digits and . _ : -",
        InvalidRoutes,
    )
    return {name: [Place.parse(p) for p in places] for name, places in parsed.routes.items()}
