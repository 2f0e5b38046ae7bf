"""Structured output: a job's JSON schema (`options.output_schema`), the check of an answer
against it, and the repair turn the next attempt is sent after a miss.

Every answer is validated here, whatever the provider claims of its own structured outputs
(Draft 2020-12, by `jsonschema-rs`: a 2 KB answer in well under a millisecond, where the
pure-Python `jsonschema`, which checks the schemas themselves at the door, takes about one:
bench/README.md); a miss is the error kind `schema_mismatch`, retried at once
with the invalid answer and the validation errors as a repair turn (docs/decisions.md)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from typing import Any

import jsonschema_rs
from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from activities.adapters.conversation import FUNCTION_NAME, check_schema
from activities.adapters.json_types import STRICT_BODY, refuse_null

# A schema's bounds: its JSON text, and how deep its objects and arrays nest.
MAX_SCHEMA_BYTES = 64_000
MAX_SCHEMA_DEPTH = 32
# The validation errors a miss reports (the first ones, in the schema's order).
MAX_ERRORS = 10
# A schema-less JSON answer (`json_object`): any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class OutputSchema(BaseModel):
    """`options.output_schema`: the answer must be JSON matching `schema`, or, without one,
    any JSON object (OpenAI's `json_object`)."""

    # `schema` on the wire (a pydantic model's own `schema` is taken), both ways.
    model_config = STRICT_BODY | ConfigDict(serialize_by_alias=True)

    name: StrictStr = Field(
        default="output", pattern=FUNCTION_NAME, description="The schema's name, for the provider"
    )
    # May be left out, not null (SkipJsonSchema: the document says so).
    schema_: dict[StrictStr, Any] | SkipJsonSchema[None] = Field(
        default=None,
        alias="schema",
        description="The answer's JSON Schema (Draft 2020-12); left out: any JSON object",
    )
    description: StrictStr | None = Field(default=None, max_length=10_000)
    strict: bool | None = Field(
        default=None,
        description="Ask the provider for its strict mode where it has one (OpenAI); the "
        "answer is validated either way",
    )

    @field_validator("schema_", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        return refuse_null(value, "`schema`")

    @model_validator(mode="after")
    def _schema_fits(self) -> OutputSchema:
        if self.schema_ is None:
            return self
        size = len(self.schema_text)
        if size > MAX_SCHEMA_BYTES:
            raise PydanticCustomError(
                "schema_too_large",
                "the schema is {size} bytes of JSON; at most {limit}",
                {"size": size, "limit": MAX_SCHEMA_BYTES},
            )
        if depth(self.schema_) > MAX_SCHEMA_DEPTH:
            raise PydanticCustomError(
                "schema_too_deep",
                "the schema nests deeper than {limit} levels",
                {"limit": MAX_SCHEMA_DEPTH},
            )
        check_schema(self.schema_)
        try:
            self.validator  # noqa: B018  (built now: what cannot be built is refused here)
        except (ValueError, jsonschema_rs.ValidationError) as err:
            raise PydanticCustomError(
                "json_schema", "cannot be used to validate answers: {why}", {"why": str(err)[:300]}
            ) from None
        return self

    @cached_property
    def schema_text(self) -> str:
        """The answer's schema as JSON text (keys sorted): its size, and its validator's key."""
        return json.dumps(self.json_schema, sort_keys=True)

    @cached_property
    def validator(self) -> jsonschema_rs.Draft202012Validator:
        """The validator of the answer's schema (shared by every job of the same schema)."""
        return compiled_validator(self.schema_text)

    @property
    def any_object(self) -> bool:
        """No schema: any JSON object (OpenAI's `json_object`)."""
        return self.schema_ is None

    @property
    def json_schema(self) -> dict[str, Any]:
        """The schema an answer is checked against (any object, without one)."""
        return self.schema_ if self.schema_ is not None else ANY_OBJECT


def depth(value: Any) -> int:
    """How deep JSON objects and arrays nest in `value` (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@dataclass(frozen=True)
class Miss:
    """Why an answer does not match: each error's place in the answer and what is wrong."""

    errors: list[dict[str, str]]

    @property
    def message(self) -> str:
        """The job's error message: the errors, one clause each."""
        said = "; ".join(f"at {e['path']}: {e['message']}" for e in self.errors)
        return f"the answer does not match the output schema: {said}"


@functools.lru_cache(maxsize=256)
def compiled_validator(schema_text: str) -> jsonschema_rs.Draft202012Validator:
    """The schema's validator, built once per schema in a process (its JSON text the key)."""
    return jsonschema_rs.Draft202012Validator(json.loads(schema_text))


def check_answer(
    output: OutputSchema, text: str, finish_reason: str | None
) -> tuple[Any, Miss | None]:
    """The answer's JSON, and None; or whatever of it parsed, and why it misses: text that is
    not JSON, or cut at max_tokens, or JSON the schema does not take."""
    if finish_reason == "length":
        where = "the answer was cut at max_tokens before it ended"
        return None, Miss([{"path": "/", "message": where}])
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        message = f"not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        return None, Miss([{"path": "/", "message": message}])
    found = list(islice(output.validator.iter_errors(value), MAX_ERRORS))
    if not found:
        return value, None
    errors = [
        {
            "path": "/" + "/".join(str(p) for p in error.instance_path),
            "message": error.message[:500],
        }
        for error in found
    ]
    return value, Miss(errors)


def repair_turn(answer: str, errors: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The messages a repair attempt adds to the conversation: the invalid answer as the
    assistant said it, then what is wrong with it."""
    listed = "\n".join(f"- at {e['path']}: {e['message']}" for e in errors)
    ask = (
        "Your answer does not match the required JSON schema:\n"
        f"{listed}\n"
        "Answer again with only the corrected JSON, matching the schema."
    )
    return [{"role": "assistant", "content": answer or " "}, {"role": "user", "content": ask}]
