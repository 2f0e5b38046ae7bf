"""What every adapter takes and returns, and the registry that picks one per job."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from activities.adapters.conversation import Message, one_message
from activities.adapters.options import PromptOptions, targets
from activities.adapters.routes import InvalidRoutes, Place
from projections.domain.errors import Refused
from projections.domain.lifecycle import AttemptResult

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class AdapterRequest:
    job_id: str
    prompt_id: str
    # The prompt's text: a conversation's transcript (what the fake answers and a log shows).
    prompt: str
    attempt: int
    # Parsed once, from the job's stored JSON (`options_of`): the adapter reads its fields.
    options: PromptOptions = field(default_factory=PromptOptions)
    # Why stored options cannot run (`options_of`), if so: the call fails as provider_4xx.
    unrunnable: str | None = None
    # A conversation's messages, a chain's answers in place; empty: `prompt` is one user
    # message.
    messages: Sequence[Message] = ()

    @property
    def conversation(self) -> list[Message]:
        """What the model is sent (besides `options.system`), in the chat format."""
        return list(self.messages) or one_message(self.prompt)


@dataclass(frozen=True)
class ProviderLimits:
    """The per-minute limits a provider's rate-limit headers state (None: not said)."""

    rpm: int | None
    tpm: int | None


def provider_limits(headers: Mapping[str, str]) -> ProviderLimits | None:
    """OpenAI's `x-ratelimit-limit-*` or Anthropic's `anthropic-ratelimit-*-limit`, if sent.
    Anthropic's combined `tokens` limit is the binding one; without it, its input tokens'."""

    def number(*names: str) -> int | None:
        for name in names:
            value = headers.get(name, "").strip()
            if value.isdigit() and int(value) > 0:
                return int(value)
        return None

    rpm = number("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit")
    tpm = number(
        "x-ratelimit-limit-tokens",
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-input-tokens-limit",
    )
    return None if rpm is None and tpm is None else ProviderLimits(rpm, tpm)


def answered_call(index: int, call_id: str | None, name: str, arguments: str) -> dict[str, str]:
    """A tool call of an answer as AttemptResult keeps it, streamed or read whole: one the
    provider gave no id gets `call_<index>`, one without arguments `{}`."""
    return {"id": call_id or f"call_{index}", "name": name, "arguments": arguments or "{}"}


class StreamedOutput:
    """What an adapter hands upward while its call runs: each text delta as it arrives, and
    the provider's token counts when it tells them (a stream's usage comes in its last
    chunk; Anthropic's input tokens in its first). The attempt's writer
    (activities/output.py) flushes the text to the projection in batches; a test reads it
    here. An adapter's result text is `self.text`: exactly the concatenation streamed, so
    the response a success stores is what clients watched grow."""

    def __init__(self, on_delta: Callable[[], None] | None = None) -> None:
        self._parts: list[str] = []
        self.length = 0  # characters received
        self.deltas = 0
        self.called_at: float | None = None  # time.monotonic(), when the provider call began
        self.first_delta_at: float | None = None  # time.monotonic()
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.usage_estimated = False
        # What the provider's last answer said of its rate limits, if anything.
        self.limits: ProviderLimits | None = None
        self._on_delta = on_delta
        # The tool calls streamed so far, by their place in the answer: id, name, arguments.
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._argument_chars = 0

    def answered_with(self, headers: Mapping[str, str]) -> None:
        """The headers of the provider's answer (a success's or an error's)."""
        self.limits = provider_limits(headers) or self.limits

    def call_begins(self) -> float:
        """The provider call starts now: the one origin of its latency and its first token's
        time, so a response's first token never reads later than its whole answer."""
        self.called_at = time.monotonic()
        return self.called_at

    def delta(self, text: str) -> None:
        """A piece of the answer, in order (an empty one is ignored)."""
        if not text:
            return
        if self.first_delta_at is None:
            self.first_delta_at = time.monotonic()
        self._parts.append(text)
        self.length += len(text)
        self.deltas += 1
        if self._on_delta is not None:
            self._on_delta()

    def tool_call(
        self,
        index: int,
        *,
        call_id: str | None = None,
        name: str | None = None,
        arguments: str = "",
    ) -> None:
        """A piece of the tool call at `index` of the answer: its id and name when the
        provider first says them, then its arguments' JSON text a fragment at a time."""
        if self.first_delta_at is None:
            self.first_delta_at = time.monotonic()
        known_id, known_name, parts = self._calls.get(index, ("", "", []))
        self._calls[index] = (call_id or known_id, name or known_name, parts)
        if arguments:
            parts.append(arguments)
            self._argument_chars += len(arguments)
        self.deltas += 1
        if self._on_delta is not None:
            self._on_delta()

    @property
    def calls_size(self) -> int:
        """How far the tool calls have streamed: the characters of their ids, names and
        arguments so far (projections.streams.calls_size of `streaming_calls`)."""
        named = sum(
            len(call_id or f"call_{index}") + len(name)
            for index, (call_id, name, _) in self._calls.items()
        )
        return named + self._argument_chars

    @property
    def streaming_calls(self) -> list[dict[str, str]] | None:
        """The tool calls as they stand while they stream (None: none yet): each one's id
        and name as `tool_calls` gives them, and its arguments' text so far (empty until
        the first fragment, where `tool_calls` says `{}`)."""
        if not self._calls:
            return None
        return [
            {**answered_call(index, call_id, name, ""), "arguments": "".join(parts)}
            for index, (call_id, name, parts) in sorted(self._calls.items())
        ]

    @property
    def tool_calls(self) -> list[dict[str, str]] | None:
        """The tool calls received, in the answer's order (None: none). A call without
        arguments has `{}`; one the provider gave no id gets `call_<index>`."""
        if not self._calls:
            return None
        return [
            answered_call(index, call_id, name, "".join(parts))
            for index, (call_id, name, parts) in sorted(self._calls.items())
        ]

    def usage(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        estimated: bool = False,
    ) -> None:
        """The provider's own counts, as far as it has given them (None: not said);
        `estimated`: the adapter counted them itself (the fake's words)."""
        if input_tokens is not None:
            self.input_tokens = input_tokens
        if output_tokens is not None:
            self.output_tokens = output_tokens
        self.usage_estimated = self.usage_estimated or estimated

    @property
    def text(self) -> str:
        """Everything received so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def since(self, offset: int) -> str:
        """The text from character `offset` on."""
        return self.text[offset:]


class InvalidOptions(Refused, ValueError):
    """A job's options cannot run: an unknown provider, a bad field, a missing credential."""

    code = "invalid_options"


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
    # The model of a job whose options name none.
    model: str

    @property
    def configured(self) -> bool:
        """Whether a job could run on it now (its credential is set)."""
        ...

    def check(self, options: PromptOptions) -> None:
        """Raise InvalidOptions if a job with these options (parsed) could never run here:
        what this provider refuses of them, a missing credential."""

    async def complete(self, request: AdapterRequest, output: StreamedOutput) -> AttemptResult:
        """Call the provider once, streaming: hand each text delta to `output` as it arrives
        (and the provider's usage when it says it). Return the result, whose text is
        `output.text`; raise AdapterError on failure, mid-stream too (what was streamed
        stays in `output`). Never retry here."""
        ...


class AdapterRegistry:
    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        default: str,
        routes: Mapping[str, list[Place]] | None = None,
    ) -> None:
        self._adapters = dict(adapters)
        self.default = default
        self.routes = dict(routes or {})
        for name, places in self.routes.items():
            for place in places:
                if place.provider not in self._adapters:
                    known = ", ".join(sorted(self._adapters))
                    raise InvalidRoutes(
                        f"route {name!r}: unknown provider {place.provider!r} in "
                        f"{str(place)!r}; use one of: {known}"
                    )

    def expand(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """A job's options with the route it names (`options.route`) put in its place: the
        route's first place as `provider` and `model`, the others as `fallbacks`. Options
        that name no route come back as they are; InvalidOptions for an unknown route, or a
        route beside what it names."""
        route = options.get("route")
        if route is None:
            return dict(options)
        places = self.routes.get(route) if isinstance(route, str) else None
        if places is None:
            have = ", ".join(sorted(self.routes)) or "none (PROMPTJOBS_ROUTES_FILE names them)"
            raise InvalidOptions(f"options.route: unknown route {route!r}; the routes: {have}")
        if beside := sorted({"provider", "model", "fallbacks"} & options.keys()):
            raise InvalidOptions(
                f"options.route names the provider, model and fallbacks: leave out "
                f"{', '.join(beside)}, or name no route"
            )
        first, *others = places
        expanded = {k: v for k, v in options.items() if k != "route"}
        expanded["provider"] = first.provider
        if first.model is not None:
            expanded["model"] = first.model
        if others:
            expanded["fallbacks"] = [
                {"provider": p.provider, **({"model": p.model} if p.model else {})} for p in others
            ]
        return expanded

    def names(self) -> list[str]:
        """The providers this deployment can run now (a chat provider needs its credential)."""
        return sorted(name for name, adapter in self._adapters.items() if adapter.configured)

    def provider_of(self, options: PromptOptions) -> str:
        return options.provider or self.default

    def model_of(self, options: PromptOptions) -> str:
        """The model a job asks for: its options' own, else its provider's default."""
        adapter = self._adapters.get(self.provider_of(options))
        return options.model or (adapter.model if adapter else "")

    def model_of_provider(self, name: str) -> str:
        """A provider's default model."""
        return self._adapters[name].model

    def split_model(self, name: str) -> tuple[str | None, str]:
        """`provider/model` as OpenAI-style clients name a model: (provider, model) when the
        part before the first `/` is one of ours, else (None, name), so a bare name (or one
        with a slash of its own, like `meta-llama/Llama-3.1-8B`) goes to the default."""
        provider, slash, model = name.partition("/")
        if slash and model and provider in self._adapters:
            return provider, model
        return None, name

    def get(self, options: PromptOptions) -> Adapter:
        name = self.provider_of(options)
        adapter = self._adapters.get(name)
        if adapter is None:
            known = ", ".join(sorted(self._adapters))
            raise InvalidOptions(f"unknown provider {name!r}; use one of: {known}")
        return adapter

    def parse(self, options: Mapping[str, Any]) -> PromptOptions:
        """A job's options as its JSON says them, parsed once into their model and checked
        against their provider; InvalidOptions names every bad field (`options.field: why`)."""
        parsed = parse_options(PromptOptions, self.expand(options), "options")
        for index, target in enumerate(targets(parsed)):
            try:
                self.get(target).check(target)
            except InvalidOptions as err:
                if index == 0:
                    raise
                raise InvalidOptions(f"options.fallbacks[{index - 1}]: {err}") from err
        return parsed

    def validate(self, options: Mapping[str, Any]) -> None:
        """Raise InvalidOptions now rather than fail the job minutes later."""
        self.parse(options)

    def check(self, request: AdapterRequest) -> Adapter:
        """The adapter that runs `request`, or InvalidOptions for why it cannot run."""
        if request.unrunnable is not None:
            raise InvalidOptions(request.unrunnable)
        adapter = self.get(request.options)
        adapter.check(request.options)
        return adapter

    def learns_limits(self, options: PromptOptions) -> bool:
        """Whether the job's provider says its rate limits in its answers (a chat provider;
        not the fake)."""
        adapter = self._adapters.get(self.provider_of(options))
        return bool(getattr(adapter, "says_limits", False))

    def learning_limits(self) -> bool:
        """Whether any provider this deployment can run says its rate limits."""
        return any(
            getattr(adapter, "says_limits", False) and adapter.configured
            for adapter in self._adapters.values()
        )
