"""How a request body's JSON is typed, for every model a body is read with (a job's options,
its conversation): JSON's own types, strictly."""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator, ConfigDict, Strict
from pydantic_core import PydanticCustomError

# PostgreSQL text cannot hold NUL; refuse it at the door instead of failing at the INSERT.
NO_NUL = r"^[^\x00]*$"

# A request body is JSON, so its types are JSON's: "50" is not a priority, true is not 1.
# Models are strict; the few fields whose JSON form is a string (enums, datetimes) opt out.
STRICT_BODY = ConfigDict(extra="forbid", strict=True)


def _json_integer(value: Any) -> Any:
    # JSON Schema's integer includes 41.0 but not true or "41"; pydantic's lax int takes all.
    if isinstance(value, bool | str):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# Bounds go before it in `Annotated`, or pydantic leaves them out of the JSON schema.
JSON_INTEGER = (Strict(False), BeforeValidator(_json_integer))


def refuse_null(value: Any, field: str = "the field") -> Any:
    """A field that may be left out but not sent as null (its type has
    `SkipJsonSchema[None]`, so the OpenAPI document says so): a before-validator's body."""
    if value is None:
        raise PydanticCustomError(
            "null", "leave {field} out rather than send null", {"field": field}
        )
    return value
