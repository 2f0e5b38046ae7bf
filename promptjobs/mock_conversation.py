"""What the mock provider reads of a request's conversation, in either API's format: the text
it answers, the tools offered and the choice among them, whether the last turn hands it tool
results, the images, and the JSON schema the answer must match. It refuses (a 400, as the
real APIs do) what they refuse: a tool result that answers no call, an image part of the
other API's shape."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from activities.adapters.anthropic_messages import JSON_OBJECT_ASK
from activities.adapters.conversation import DATA_URL

Api = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class MockTool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Conversation:
    # What the answer is made of: the last user text, or after a tool's turn its result.
    prompt: str
    system: str | None
    tools: tuple[MockTool, ...] = ()
    # "auto", "none", "required", or a tool's name.
    tool_choice: str = "auto"
    # The last turn hands the model tool results: it answers in text.
    after_tool: bool = False
    # Each image as it came: "base64 image/png", "url".
    images: tuple[str, ...] = ()
    # The schema the answer must match (OpenAI's response_format, Anthropic's
    # output_config.format; any object for a JSON mode), if the request asks for one.
    answer_schema: dict[str, Any] | None = None

    @property
    def calls_tool(self) -> MockTool | None:
        """The tool the mock calls: the one chosen, else the first offered (never after a
        tool's turn, nor when told `none`)."""
        if not self.tools or self.after_tool or self.tool_choice == "none":
            return None
        return next((t for t in self.tools if t.name == self.tool_choice), self.tools[0])


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in _dicts(content) if p.get("type") == "text")


def read_conversation(api: Api, body: dict[str, Any]) -> Conversation:
    """Raises ValueError for what the API would refuse with a 400."""
    messages = _dicts(body.get("messages"))
    return _openai(body, messages) if api == "openai" else _anthropic(body, messages)


def _openai(body: dict[str, Any], messages: list[dict[str, Any]]) -> Conversation:
    system = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), None)
    called: set[str] = set()
    images: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            called.update(str(c.get("id")) for c in _dicts(message.get("tool_calls")))
        elif role == "tool" and message.get("tool_call_id") not in called:
            raise ValueError(f"messages[{i}]: a tool message must answer a preceding tool_call")
        for part in _dicts(message.get("content")):
            if part.get("type") == "image_url":
                images.append(_openai_image(i, part))
            elif part.get("type") not in ("text", None):
                raise ValueError(f"messages[{i}]: unknown content part {part.get('type')!r}")
    tools = tuple(
        MockTool(str(f.get("name")), f.get("parameters") or {})
        for t in _dicts(body.get("tools"))
        if isinstance(f := t.get("function"), dict)
    )
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        choice = str((choice.get("function") or {}).get("name"))
    last = messages[-1] if messages else {}
    after_tool = last.get("role") == "tool"
    if after_tool:
        prompt = _text(last.get("content"))
    else:
        users = [m for m in messages if m.get("role") == "user"]
        prompt = _text(users[-1].get("content")) if users else ""
    wanted = body.get("response_format")
    schema: dict[str, Any] | None = None
    if isinstance(wanted, dict) and wanted.get("type") == "json_schema":
        schema = (wanted.get("json_schema") or {}).get("schema") or {}
    elif isinstance(wanted, dict) and wanted.get("type") == "json_object":
        schema = {"type": "object"}
    return Conversation(prompt, system, tools, str(choice), after_tool, tuple(images), schema)


def _openai_image(i: int, part: dict[str, Any]) -> str:
    url = (
        (part.get("image_url") or {}).get("url")
        if isinstance(part.get("image_url"), dict)
        else None
    )
    if not isinstance(url, str):
        raise ValueError(f"messages[{i}]: an image_url part needs image_url.url")
    if url.startswith("data:"):
        found = DATA_URL.match(url)
        if found is None:
            raise ValueError(f"messages[{i}]: the image's data URL is not a base64 image")
        return f"base64 {found.group(1)}"
    return "url"


def _anthropic(body: dict[str, Any], messages: list[dict[str, Any]]) -> Conversation:
    system = None if body.get("system") is None else _text(body["system"])
    used: set[str] = set()
    images: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"messages.{i}.role: must be user or assistant, not {role!r}")
        for block in _blocks(message.get("content")):
            kind = block.get("type")
            if kind == "tool_use" and role == "assistant":
                used.add(str(block.get("id")))
            elif kind == "tool_result" and block.get("tool_use_id") not in used:
                raise ValueError(
                    f"messages.{i}: tool_result block(s) must answer a tool_use block of the "
                    "previous assistant turn"
                )
            elif kind == "image":
                images.append(_anthropic_image(i, block))
    tools = tuple(
        MockTool(str(t.get("name")), t.get("input_schema") or {}) for t in _dicts(body.get("tools"))
    )
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else "auto"
    picked = {"any": "required", "tool": str(choice.get("name"))}.get(str(kind), str(kind))
    last = messages[-1] if messages else {}
    results = [b for b in _blocks(last.get("content")) if b.get("type") == "tool_result"]
    if results:
        prompt = _text(results[-1].get("content"))
    else:
        users = [m for m in messages if m.get("role") == "user"]
        prompt = _text(users[-1].get("content")) if users else ""
    wanted = (body.get("output_config") or {}).get("format")
    schema: dict[str, Any] | None = None
    if isinstance(wanted, dict) and wanted.get("type") == "json_schema":
        schema = wanted.get("schema") or {}
    elif system is not None and JSON_OBJECT_ASK in system:
        schema = {"type": "object"}
    return Conversation(prompt, system, tools, picked, bool(results), tuple(images), schema)


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else _dicts(content)


def _anthropic_image(i: int, block: dict[str, Any]) -> str:
    given = block.get("source")
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return "url"
    if source.get("type") == "base64" and source.get("media_type") and source.get("data"):
        return f"base64 {source['media_type']}"
    raise ValueError(f"messages.{i}: an image block needs a base64 or url source")


def fragments(text: str, size: int = 8) -> Iterator[str]:
    """A call's arguments in pieces, as providers stream them."""
    return (text[i : i + size] for i in range(0, len(text), size))


def image_words(images: Iterable[str]) -> list[str]:
    """What the answer says first of the images it was shown (`[image:base64 image/png]`)."""
    return [f"[image:{image.replace(' ', ':')}]" for image in images]
