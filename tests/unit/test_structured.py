"""The output schema's rules: what the door takes, how an answer is checked (JSON, the
schema, a cut answer), the repair turn, and the scripted answer that fits a schema."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from activities.adapters.conversation import sample_value
from activities.adapters.options import PromptOptions
from activities.adapters.structured import OutputSchema, check_answer, repair_turn

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "pets": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
}


def schema(value: dict[str, object] = PERSON) -> OutputSchema:
    return OutputSchema.model_validate({"name": "person", "schema": value})


def test_a_matching_answer_parses() -> None:
    value, miss = check_answer(schema(), '{"name": "Ada", "age": 36}', "stop")
    assert (value, miss) == ({"name": "Ada", "age": 36}, None)


def test_a_miss_names_each_place_and_fault() -> None:
    value, miss = check_answer(schema(), '{"age": -1, "pets": [3]}', "stop")
    assert value == {"age": -1, "pets": [3]}
    assert miss is not None
    assert sorted((e["path"], e["message"]) for e in miss.errors) == [
        ("/", '"name" is a required property'),
        ("/age", "-1 is less than the minimum of 0"),
        ("/pets/0", '3 is not of type "string"'),
    ]
    assert miss.message.startswith("the answer does not match the output schema: at ")


def test_text_that_is_not_json_or_was_cut_is_a_miss() -> None:
    _, miss = check_answer(schema(), "Sure! Here it is: {", "stop")
    assert miss is not None and miss.errors[0]["message"].startswith("not JSON: Expecting value")
    _, cut = check_answer(schema(), '{"name": "Ada", "age": 36}', "length")
    assert cut is not None and "cut at max_tokens" in cut.errors[0]["message"]


def test_json_object_takes_any_object_only() -> None:
    anything = OutputSchema()
    assert check_answer(anything, '{"x": [1]}', "stop")[1] is None
    assert check_answer(anything, "[1, 2]", "stop")[1] is not None


def test_the_repair_turn_hands_back_the_answer_and_its_errors() -> None:
    errors = [{"path": "/age", "message": "'x' is not of type 'integer'"}]
    said, asked = repair_turn('{"age": "x"}', errors)
    assert said == {"role": "assistant", "content": '{"age": "x"}'}
    assert asked["role"] == "user" and "- at /age: 'x' is not of type 'integer'" in asked["content"]


def test_the_schema_is_checked_at_the_door() -> None:
    with pytest.raises(ValidationError, match="is not JSON Schema"):
        PromptOptions.model_validate({"output_schema": {"schema": {"type": 5}}})
    with pytest.raises(ValidationError, match="bytes of JSON"):
        big = {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)}
        PromptOptions.model_validate(
            {"output_schema": {"schema": {"type": "object", "properties": big}}}
        )
    stored = PromptOptions.model_validate({"output_schema": {"schema": PERSON}})
    # Dumped as the client wrote it, so a stored job's options parse again.
    dumped = stored.model_dump(mode="json", exclude_unset=True)
    assert dumped == {"output_schema": {"schema": PERSON}}
    assert PromptOptions.model_validate(dumped) == stored


def test_a_scripted_answer_fits_the_schema() -> None:
    nested = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "items": {"type": "array", "minItems": 2, "items": PERSON},
        },
    }
    value = sample_value(nested)
    assert value == {"kind": "a", "items": [{"name": "mock", "age": 1}] * 2}
    assert check_answer(schema(nested), json.dumps(value), "stop")[1] is None
