"""A job's conversation: the messages a model is sent and the tools it may call, in one format
every adapter translates into its provider's (OpenAI's Chat Completions shapes, which most
clients already speak: a client appends an answer's `tool_calls` as it got them).

A prompt given as one string is one user message (`one_message`); a stored prompt from before
conversations reads so too. The rules across the messages (a user message among them, a tool
message answers a call made before it) are `check_conversation`'s; across the tools (distinct
names, a chosen tool among them), `check_tools`', which the options model runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    BaseModel,
    Field,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from activities.adapters.json_types import NO_NUL, STRICT_BODY
from projections.domain.errors import Refused

# A function's name, as both providers take it.
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_MESSAGES = 2_000
MAX_TOOLS = 128
MAX_TOOL_CALLS = 128
MAX_PARTS = 500
# A call id as the providers make them (`call_…`, `toolu_…`), and as a client may.
CALL_ID = r"^[A-Za-z0-9_.:-]{1,128}$"
# An image given inline: a base64 data URL of a type both providers read (its media type and
# its data).
_DATA_URL = r"data:(image/(?:png|jpeg|gif|webp));base64,([A-Za-z0-9+/=\s]+)"
DATA_URL = re.compile(f"^{_DATA_URL}$")
# What an image part's URL may be (the OpenAPI document says it too).
IMAGE_URL = rf"^(https?://\S+|{_DATA_URL})$"
# The tokens an image is counted as before the provider says (a budget's estimate): about a
# 1024 by 1024 image's at OpenAI's high detail and Anthropic's (width * height / 750).
IMAGE_TOKENS = 1_100

Text = Annotated[StrictStr, Field(pattern=NO_NUL)]


class TextPart(BaseModel):
    model_config = STRICT_BODY

    type: Literal["text"]
    text: Text


class ImageURL(BaseModel):
    model_config = STRICT_BODY

    url: StrictStr = Field(
        pattern=IMAGE_URL,
        description="An http(s):// URL the provider fetches, or a base64 data URL "
        "(data:image/png;base64,…; PNG, JPEG, GIF or WebP)",
    )
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("url", mode="before")
    @classmethod
    def _readable(cls, url: Any) -> Any:
        # Before the pattern, so a bad URL is refused in words that say what to send.
        if isinstance(url, str) and not re.match(IMAGE_URL, url):
            raise PydanticCustomError(
                "image_url",
                "give an http(s):// URL, or a base64 data URL (data:image/png;base64,…) of a "
                "PNG, JPEG, GIF or WebP image",
            )
        return url


class ImagePart(BaseModel):
    model_config = STRICT_BODY

    type: Literal["image_url"]
    image_url: ImageURL


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    model_config = STRICT_BODY

    name: StrictStr = Field(pattern=FUNCTION_NAME)
    arguments: Text = Field(description="The arguments, as JSON text")

    @field_validator("arguments")
    @classmethod
    def _json(cls, arguments: str) -> str:
        try:
            json.loads(arguments)
        except ValueError as err:
            raise PydanticCustomError(
                "arguments_json", "must be JSON text (the model's arguments, as it gave them)"
            ) from err
        return arguments


class ToolCall(BaseModel):
    """A call the model made, as an assistant message carries it."""

    model_config = STRICT_BODY

    id: StrictStr = Field(pattern=CALL_ID)
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(BaseModel):
    model_config = STRICT_BODY

    # Who spoke (OpenAI's `name`): kept, and sent where the provider takes it.
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=NO_NUL)] | None = None


class SystemMessage(_Message):
    role: Literal["system"]
    content: Text | list[TextPart] = Field(max_length=MAX_PARTS)


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: Text | list[TextPart] = Field(max_length=MAX_PARTS)


class UserMessage(_Message):
    role: Literal["user"]
    content: Text | list[UserPart] = Field(max_length=MAX_PARTS)


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Text | list[TextPart] | None = Field(default=None, max_length=MAX_PARTS)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOL_CALLS)
    # What OpenAI's SDK sends back when a client appends an answer's message as it got it:
    # taken when empty, and not kept.
    refusal: Text | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise PydanticCustomError(
                "assistant_empty", "an assistant message needs `content` or `tool_calls`"
            )
        return self


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Text | list[TextPart] = Field(max_length=MAX_PARTS)
    tool_call_id: StrictStr = Field(pattern=CALL_ID)


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]
Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]


class FunctionDefinition(BaseModel):
    model_config = STRICT_BODY

    name: StrictStr = Field(pattern=FUNCTION_NAME)
    description: Annotated[StrictStr, Field(max_length=10_000, pattern=NO_NUL)] | None = None
    parameters: dict[StrictStr, Any] | None = Field(
        default=None, description="The arguments' JSON Schema (an object's)"
    )
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            check_schema(schema)
        return schema


class Tool(BaseModel):
    model_config = STRICT_BODY

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT_BODY

    name: StrictStr = Field(pattern=FUNCTION_NAME)


class ToolChoiceFunction(BaseModel):
    model_config = STRICT_BODY

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction


def check_schema(schema: dict[str, Any]) -> None:
    """Raise a validation error (a 422 naming the schema's fault) unless `schema` is JSON
    Schema (Draft 2020-12)."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "the schema"
        raise PydanticCustomError(
            "json_schema",
            "is not JSON Schema (2020-12): at {where}: {why}",
            {"where": where, "why": err.message[:300]},
        ) from None


class InvalidConversation(Refused, ValueError):
    """Messages that are each well formed but make no conversation together."""

    code = "invalid_conversation"


def check_conversation(messages: Sequence[Message]) -> None:
    """Raise InvalidConversation for the first rule the messages break together: a user
    message among them; each tool message answers a call made before it, once."""
    if not any(m.role == "user" for m in messages):
        raise InvalidConversation("messages: a conversation needs at least one user message")
    calls: set[str] = set()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            calls.update(call.id for call in message.tool_calls or ())
        elif isinstance(message, ToolMessage):
            if message.tool_call_id not in calls:
                raise InvalidConversation(
                    f"messages[{i}]: tool_call_id {message.tool_call_id!r} answers no call of "
                    "an assistant message before it"
                )
            if message.tool_call_id in answered:
                raise InvalidConversation(
                    f"messages[{i}]: call {message.tool_call_id!r} is answered twice"
                )
            answered.add(message.tool_call_id)


def check_tools(tools: Sequence[Tool], tool_choice: ToolChoice | None) -> None:
    """Raise a validation error (a 422) unless the tools have distinct names and
    `tool_choice` chooses among them."""
    names = [tool.function.name for tool in tools]
    if len(set(names)) != len(names):
        raise PydanticCustomError("tools_repeated", "two tools have the same name")
    if isinstance(tool_choice, ToolChoiceFunction) and tool_choice.function.name not in names:
        raise PydanticCustomError(
            "tool_choice_unknown",
            "tool_choice names {name!r}, which is not one of `tools`",
            {"name": tool_choice.function.name},
        )
    if tool_choice is not None and tool_choice != "none" and not tools:
        raise PydanticCustomError("tool_choice_alone", "tool_choice needs `tools` to choose from")


def one_message(text: str) -> list[Message]:
    """A prompt given as a string: one user message."""
    return [UserMessage(role="user", content=text)]


def text_of(content: str | Sequence[BaseModel] | None) -> str:
    """A message's text: its string, or its text parts joined (an image is left out)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def images_of(messages: Iterable[Message]) -> list[ImageURL]:
    return [
        part.image_url
        for message in messages
        if isinstance(message, UserMessage) and not isinstance(message.content, str)
        for part in message.content
        if isinstance(part, ImagePart)
    ]


def count_images(stored: list[dict[str, Any]] | None) -> int:
    """The image parts of a conversation as stored (JSON), without parsing it."""
    return sum(
        1
        for message in stored or ()
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    )


def image_bytes(messages: Iterable[Message]) -> int:
    """The bytes of the images given inline (a URL's image is the provider's to fetch)."""
    return sum(len(image.url) for image in images_of(messages) if image.url.startswith("data:"))


def transcript(messages: Iterable[Message]) -> str:
    """The conversation as plain text, a line a message (a prompt's `text` for a reader that
    shows one string, and what a budget's estimate counts): `role: text`, an image as
    `[image]`, a call as `→ name(arguments)`."""
    lines = []
    for message in messages:
        if isinstance(message, UserMessage) and not isinstance(message.content, str):
            said = "".join(
                part.text if isinstance(part, TextPart) else "[image]" for part in message.content
            )
        else:
            said = text_of(message.content)
        if isinstance(message, AssistantMessage):
            said += "".join(
                f"\n→ {call.function.name}({call.function.arguments})"
                for call in message.tool_calls or ()
            )
        role = (
            f"tool ({message.tool_call_id})" if isinstance(message, ToolMessage) else message.role
        )
        lines.append(f"{role}: {said}")
    return "\n".join(lines)


def last_user_text(messages: Sequence[Message]) -> str:
    return next((text_of(m.content) for m in reversed(messages) if m.role == "user"), "")


def sample_arguments(schema: dict[str, Any] | None) -> dict[str, Any]:
    """Arguments that fit a function's parameters as far as their types go (a scripted
    provider's call): each required property (all, if none is required) a value of its type."""
    value = sample_value(schema or {"type": "object"})
    return value if isinstance(value, dict) else {}


SAMPLES: dict[str, Any] = {
    "string": "mock",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "null": None,
}


def sample_value(schema: Any, depth: int = 0) -> Any:
    """A value that fits a schema as far as its types, enums, objects' properties and arrays'
    minimum lengths go (a scripted provider's answer): an object has each required property
    (all, if none is required); an array as many items as it must."""
    spec = schema if isinstance(schema, dict) else {}
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return spec["enum"][0]
    if "const" in spec:
        return spec["const"]
    kind = spec.get("type", "object" if "properties" in spec else "string")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        properties = spec.get("properties")
        if not isinstance(properties, dict) or depth > 16:
            return {}
        required = spec.get("required")
        names = required if isinstance(required, list) and required else list(properties)
        return {name: sample_value(properties.get(name), depth + 1) for name in names}
    if kind == "array":
        count = spec.get("minItems", 0)
        count = count if isinstance(count, int) and 0 <= count <= 16 and depth <= 16 else 0
        return [sample_value(spec.get("items"), depth + 1) for _ in range(count)]
    return SAMPLES.get(kind if isinstance(kind, str) else "string", "mock")


MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(Messages)


def parse_messages(value: object) -> list[Message]:
    """Messages as JSON gives them, parsed; InvalidConversation names every bad field
    (`messages[i].field: why`)."""
    try:
        return MESSAGES.validate_python(value)
    except ValidationError as err:
        problems = "; ".join(
            "messages"
            + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
            + f": {e['msg']}"
            for e in err.errors()[:5]
        )
        raise InvalidConversation(problems) from err


def with_user_text(messages: Sequence[Message], change: Callable[[str], str]) -> list[Message]:
    """The messages with `change` applied to each user message's text (a chain's answers in
    place of its placeholders)."""
    changed: list[Message] = []
    for message in messages:
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                content = change(content)
            else:
                content = [
                    part.model_copy(update={"text": change(part.text)})
                    if isinstance(part, TextPart)
                    else part
                    for part in content
                ]
            message = message.model_copy(update={"content": content})
        changed.append(message)
    return changed


def user_texts(messages: Iterable[Message]) -> str:
    """Every user message's text, a line each (where a chain's placeholders may be)."""
    return "\n".join(text_of(m.content) for m in messages if isinstance(m, UserMessage))


class ImagesTooLarge(Refused):
    """Images given inline past PROMPTJOBS_MAX_IMAGE_BYTES (their data URLs' bytes)."""

    code = "images_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the images given inline are {size} bytes of data URL; the limit is {limit}: "
            "send fewer or smaller images, or give them by https:// URL"
        )
