"""An operator's TOML file (prices, routes), read into its model: one line that names the file
and what to fix when it cannot be used."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def read_toml_file(
    path: Path, model: type[M], what: str, expected: str, error: type[ValueError]
) -> M:
    """The file at `path` as `model`; else `error` saying which file (`what`: "the price
    file"), where in it, and what it should hold (`expected`)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror}") from err
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise error(f"{what} {path} is not TOML: {err}") from err
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise error(f"{what} {path}: {where}: {first['msg']} (expected {expected})") from err
