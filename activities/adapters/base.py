"""What every adapter takes and returns, and the registry that picks one per job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from projections.lifecycle import AttemptResult

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class AdapterRequest:
    job_id: str
    prompt_id: str
    prompt: str
    attempt: int
    options: dict[str, Any] = field(default_factory=dict)


class InvalidOptions(ValueError):
    """A job's options cannot run: an unknown provider, a bad field, a missing credential."""


def parse_options(shape: type[M], value: object, where: str) -> M:
    """Validate `value` as `shape`; InvalidOptions names every bad field (`where.field: why`)."""
    try:
        return shape.model_validate(value)
    except ValidationError as err:
        problems = "; ".join(
            ".".join([where, *(str(p) for p in e["loc"])])
            + f": {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        raise InvalidOptions(problems) from err


class Adapter(Protocol):
    name: str

    @property
    def configured(self) -> bool:
        """Whether a job could run on it now (its credential is set)."""
        ...

    def validate(self, options: Mapping[str, Any]) -> None:
        """Raise InvalidOptions if a job with these options could never run."""

    async def complete(self, request: AdapterRequest) -> AttemptResult:
        """Call the provider once; raise AdapterError on failure. Never retry here."""
        ...


class AdapterRegistry:
    def __init__(self, adapters: Mapping[str, Adapter], default: str) -> None:
        self._adapters = dict(adapters)
        self.default = default

    def names(self) -> list[str]:
        """The providers this deployment can run now (a chat provider needs its credential)."""
        return sorted(name for name, adapter in self._adapters.items() if adapter.configured)

    def provider_of(self, options: Mapping[str, Any]) -> str:
        return str(options.get("provider") or self.default)

    def get(self, options: Mapping[str, Any]) -> Adapter:
        name = self.provider_of(options)
        adapter = self._adapters.get(name)
        if adapter is None:
            known = ", ".join(sorted(self._adapters))
            raise InvalidOptions(f"unknown provider {name!r}; use one of: {known}")
        return adapter

    def validate(self, options: Mapping[str, Any]) -> None:
        self.get(options).validate(options)
