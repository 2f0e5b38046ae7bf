"""The mock provider: an OpenAI- and Anthropic-compatible HTTP server whose failures are scripted.

Scripting (docs/providers.md has the whole story): a directive `mock:fail=429,500;retry_after=2`
as the model name, or as a word of the prompt, makes the i-th request for that prompt behave as
the i-th step of `fail`, and every later one succeed. A step `reset@3` (or `500@3`, `hang@3`…)
fails a streamed answer after its third chunk; `chunk_ms` and `chunks` pace and lengthen a
stream. `POST /mock/script` scripts the next requests whatever their prompt. `GET /mock/requests`
lists what arrived (and, live, how far each stream got), `POST /mock/reset` forgets it all.

Rate-limit mode (`--rpm N --tpm N`, or `PUT /mock/limits`): the mock keeps a sliding minute of
the requests it let through and their tokens, answers 429 with `retry-after` past either limit,
and sends OpenAI's `x-ratelimit-*` and Anthropic's `anthropic-ratelimit-*` headers on every
answer, as the real APIs do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import cycle, islice
from typing import Annotated, Any, Literal, Protocol

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Message, Receive, Scope, Send

from activities.adapters.conversation import sample_arguments, sample_value
from promptjobs.mock_batches import Api, BrokenLine, LineAnswer, MockBatches, add_batch_routes
from promptjobs.mock_conversation import Conversation, fragments, image_words, read_conversation

# A step is an HTTP status to answer with, or one of these behaviours...
# (`too_long`: the provider's refusal of a request over the model's context window;
# `no_model`: its 404 for a model it does not serve, each in the provider's own words.)
Word = Literal["ok", "hang", "malformed", "reset", "too_long", "no_model"]
# ...or, for a streamed answer, a failure after n chunks: `reset@3`, `500@3`, `truncate@0`.
MID_STREAM = re.compile(r"^(hang|malformed|reset|truncate|[45]\d\d)@(\d{1,6})$")
Step = (
    Word | Annotated[int, Field(ge=400, le=599)] | Annotated[str, Field(pattern=MID_STREAM.pattern)]
)

DIRECTIVE = "mock:"
PROMPT_DIRECTIVE = re.compile(r"(?:^|\s)mock:(\S*)")
# A `hang` lasts until the client gives up, but never longer than this.
HANG_LIMIT_S = 600.0
SEEN_KEYS = 100_000
# The request log keeps this much of each prompt and system text (`…` marks a cut).
LOGGED_CHARS = 4_096


class Script(BaseModel):
    """What the next requests do: request i answers as fail[i-1] while i <= len(fail), then
    succeeds. The headers, the delay and the pacing apply to every step of the script."""

    model_config = ConfigDict(extra="forbid")

    fail: list[Step] = Field(default_factory=list, max_length=50)
    retry_after: float | None = Field(default=None, ge=0, description="Retry-After on a 429")
    retry_after_ms: int | None = Field(default=None, ge=0, description="retry-after-ms on a 429")
    delay_ms: int = Field(default=0, ge=0, le=600_000, description="Wait before answering")
    chunk_ms: int = Field(default=0, ge=0, le=60_000, description="Wait before each chunk")
    chunks: int = Field(
        default=0, ge=0, le=100_000, description="The answer's least length in chunks (words)"
    )
    request_id: str | None = Field(
        default=None,
        max_length=200,
        description="Answer every request with this id (header and body), as a provider that "
        "repeats request ids does (Ollama's /v1 counts chatcmpl-0..998 and sends no header)",
    )
    batch_line: BrokenLine | None = Field(
        default=None,
        description="How this request's line in a batch's results comes broken: `garbled` "
        "(cut short; its custom_id still readable), `anonymous` (cut short before its "
        "custom_id), `empty` (a success whose body has no answer), `twice` (the line twice)",
    )
    json_reply: Literal["valid", "invalid", "missing", "wrong"] = Field(
        default="valid",
        description="Where the request asks for JSON (a schema, or a JSON mode): answer JSON "
        "that matches (`valid`), text that is no JSON (`invalid`), or JSON whose first "
        "property is left out (`missing`) or of the wrong type (`wrong`)",
    )
    json_miss_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="The share of prompts (picked by a digest of the prompt, so the same each "
        "time) answered with text that is no JSON; a repair turn, whose text is not the "
        "prompt's, is answered well",
    )
    answer_model: str | None = Field(
        default=None,
        max_length=200,
        description="Name this model in the answer instead of the one asked for, as OpenAI "
        "answers gpt-4o-mini as gpt-4o-mini-2024-07-18 and Anthropic resolves its aliases",
    )

    @classmethod
    def parse(cls, directive: str) -> Script:
        """`fail=429,500;retry_after=2;delay_ms=100` (the part after `mock:`)."""
        values: dict[str, Any] = {}
        for pair in filter(None, directive.split(";")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"mock directive part {pair!r} is not key=value")
            values[key] = [_step(s) for s in value.split(",") if s] if key == "fail" else value
        return cls.model_validate(values)


def _step(token: str) -> int | str:
    return int(token) if token.isdigit() else token


@dataclass(frozen=True)
class Plan:
    step: Step
    script: Script


@dataclass(frozen=True)
class Cut:
    """How a streamed answer fails: after `after` chunks (or all, if it has fewer), `what`
    happens: an HTTP status's error event, or a hang, a malformed event, a dropped connection
    or an end without the final events (`truncate`)."""

    what: str | int
    after: int

    @classmethod
    def of(cls, step: Step) -> Cut | None:
        found = MID_STREAM.match(step) if isinstance(step, str) else None
        if found is None:
            return None
        what, after = found.groups()
        return cls(int(what) if what.isdigit() else what, int(after))


@dataclass(frozen=True)
class ChatCall:
    """The parts of a provider request the mock looks at and records."""

    api: Api
    model: str
    prompt: str
    system: str | None
    max_tokens: int | None
    temperature: float | None
    stream: bool = False
    # OpenAI's `stream_options.include_usage`: a last chunk with the usage.
    include_usage: bool = False
    # Its tools, the choice among them, whether it hands back tool results, its images.
    conversation: Conversation | None = None

    @property
    def key(self) -> str:
        """A digest, so that remembering a 100 kB prompt costs as little as a short one."""
        whole = f"{self.api}\0{self.model}\0{self.prompt}".encode()
        return hashlib.blake2b(whole, digest_size=16).hexdigest()

    def script(self) -> Script:
        """The directive in the model name, else in the prompt, else none: success."""
        if self.model.startswith(DIRECTIVE):
            return Script.parse(self.model.removeprefix(DIRECTIVE))
        found = PROMPT_DIRECTIVE.search(self.prompt)
        return Script.parse(found.group(1)) if found else Script()


class Limits(BaseModel):
    """The mock's rate limits: requests and tokens (input and output words, counted when the
    request arrives) per sliding minute; None is no limit."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=1, description="Requests per sliding minute")
    tpm: int | None = Field(default=None, ge=1, description="Tokens per sliding minute")
    # The window a per-minute limit counts over, as OpenAI and Anthropic count theirs; a
    # test shortens it (with PROMPTJOBS_BUDGET_WINDOW_S) to run many windows in seconds.
    window_s: float = Field(default=60.0, gt=0, description="The sliding minute, in seconds")


@dataclass(frozen=True)
class Verdict:
    """What the sliding minute says of one request: let through or not, how long until it
    would be (on a 429), and the rate-limit headers of the answer."""

    allowed: bool
    retry_after_s: float
    headers: dict[str, str]


class SlidingMinute:
    """The requests let through in the last window (`limits.window_s`), with their tokens,
    against `limits`."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        # (when, input tokens, output tokens) of each request let through, oldest first.
        self.window: deque[tuple[float, int, int]] = deque()
        self.requests = 0
        self.rate_limited = 0

    def admit(self, input_tokens: int, output_tokens: int) -> Verdict:
        now = self.clock()
        while self.window and self.window[0][0] <= now - self.limits.window_s:
            self.window.popleft()
        self.requests += 1
        rpm, tpm = self.limits.rpm, self.limits.tpm
        tokens = input_tokens + output_tokens
        wait = 0.0
        if rpm is not None and len(self.window) >= rpm:
            wait = self._until_room(now, lambda _entry: 1, rpm - 1)
        if tpm is not None and self._used()[0] + tokens > tpm:
            wait = max(wait, self._until_room(now, lambda e: e[1] + e[2], tpm - tokens))
        allowed = wait == 0.0
        if allowed:
            self.window.append((now, input_tokens, output_tokens))
        else:
            self.rate_limited += 1
        return Verdict(allowed, wait, self._headers(now))

    def _used(self) -> tuple[int, int, int]:
        used_in = sum(e[1] for e in self.window)
        used_out = sum(e[2] for e in self.window)
        return used_in + used_out, used_in, used_out

    def _until_room(
        self, now: float, weight: Callable[[tuple[float, int, int]], int], most: int
    ) -> float:
        """Seconds until what the window holds weighs at most `most` (forever: a request
        larger than the whole limit, which the retry-after of a whole minute stands for)."""
        if most < 0:
            return self.limits.window_s
        held = sum(weight(e) for e in self.window)
        for entry in self.window:
            held -= weight(entry)
            if held <= most:
                break
        else:
            return self.limits.window_s  # not reached: an empty window holds nothing
        return max(entry[0] + self.limits.window_s - now, 0.001)

    def _headers(self, now: float) -> dict[str, str]:
        """Both APIs' rate-limit headers: each limit, what is left of it, and when it is whole
        again (the newest request leaves the window)."""
        full_in = self.window[-1][0] + self.limits.window_s - now if self.window else 0.0
        rpm, tpm = self.limits.rpm, self.limits.tpm
        used, used_in, used_out = self._used()
        families = []
        if rpm is not None:
            families.append(("requests", rpm, rpm - len(self.window)))
        if tpm is not None:
            families.append(("tokens", tpm, tpm - used))
        headers: dict[str, str] = {}
        reset_at = (datetime.now(UTC) + timedelta(seconds=full_in)).isoformat(timespec="seconds")
        for name, limit, left in families:
            left = max(left, 0)
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(left)
            headers[f"x-ratelimit-reset-{name}"] = openai_duration(full_in)
            headers[f"anthropic-ratelimit-{name}-limit"] = str(limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(left)
            headers[f"anthropic-ratelimit-{name}-reset"] = reset_at.replace("+00:00", "Z")
        if tpm is not None:
            for name, spent in (("input-tokens", used_in), ("output-tokens", used_out)):
                headers[f"anthropic-ratelimit-{name}-limit"] = str(tpm)
                headers[f"anthropic-ratelimit-{name}-remaining"] = str(max(tpm - spent, 0))
                headers[f"anthropic-ratelimit-{name}-reset"] = headers[
                    "anthropic-ratelimit-tokens-reset"
                ]
        return headers

    def describe(self) -> dict[str, Any]:
        now = self.clock()
        while self.window and self.window[0][0] <= now - self.limits.window_s:
            self.window.popleft()
        return {
            **self.limits.model_dump(),
            "requests": self.requests,
            "rate_limited": self.rate_limited,
            "window": {"requests": len(self.window), "tokens": self._used()[0]},
        }


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers spell it: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 0)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class Queued(BaseModel):
    queued: int


class MockProvider:
    """The mock's state: per-prompt request counts, the admin queue, the request log."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.minute = SlidingMinute(limits or Limits())
        # Requests per prompt key, the least recently seen forgotten past SEEN_KEYS: a mock
        # fed by a long soak of distinct prompts keeps a bounded memory (a forgotten key
        # starts its script over, which a soak never relies on).
        self.seen: OrderedDict[str, int] = OrderedDict()
        self.queue: deque[Plan] = deque()
        # Bounded, so a long-running mock does not grow without end.
        self.log: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.batches = MockBatches(self.answer_line)

    def reset(self) -> None:
        self.batches.reset()
        self.minute = SlidingMinute(self.minute.limits, self.minute.clock)
        self.seen.clear()
        self.queue.clear()
        self.log.clear()

    def enqueue(self, script: Script) -> int:
        self.queue.extend(Plan(step, script) for step in script.fail)
        return len(script.fail)

    def answer_line(self, api: Api, body: dict[str, Any], batch_id: str) -> LineAnswer:
        """A provider batch's line, answered as the same request directly would be: its
        prompt's script decides (a mid-stream failure is a success: a batch does not stream)."""
        try:
            call = _read_call(api, body)
            attempt, plan = self.plan(call)
        except (ValueError, ValidationError) as err:
            return LineAnswer(
                400, _error_body(api, 400, f"mock provider cannot read this request: {err}")
            )
        entry = _log_entry(api, call, attempt, plan.step)
        entry["batch"] = batch_id
        self.log.append(entry)
        status = plan.step if isinstance(plan.step, int) else 200
        if status == 200:
            return LineAnswer(200, _reply(call, plan.script).body(), plan.script.batch_line)
        body = _error_body(api, status, f"mock provider: scripted HTTP {status}")
        return LineAnswer(status, body, plan.script.batch_line)

    def plan(self, call: ChatCall) -> tuple[int, Plan]:
        attempt = self.seen.pop(call.key, 0) + 1
        self.seen[call.key] = attempt
        if len(self.seen) > SEEN_KEYS:
            self.seen.popitem(last=False)
        if self.queue:
            return attempt, self.queue.popleft()
        script = call.script()
        step: Step = script.fail[attempt - 1] if attempt <= len(script.fail) else "ok"
        return attempt, Plan(step, script)


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the caller owns SIGINT/SIGTERM."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _deliberate_resets(record: logging.LogRecord) -> bool:
    """Drop uvicorn's complaint about a response left unfinished: here that is a scripted
    `reset` (ConnectionReset), what the mock was asked to do, not a fault."""
    return "ASGI callable returned without completing response" not in record.getMessage()


async def run_mock_provider(
    host: str,
    port: int,
    *,
    stop: asyncio.Event,
    on_ready: Callable[[], None] | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve the mock provider until `stop`."""
    logging.getLogger("uvicorn.error").addFilter(_deliberate_resets)
    config = uvicorn.Config(
        create_mock_app(MockProvider(limits)),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = QuietServer(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise OSError(f"the mock provider did not start on {host}:{port}")
        await asyncio.sleep(0.02)
    if on_ready is not None:
        on_ready()
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        server.should_exit = True
        await task


def _log_entry(
    api: Api, call: ChatCall, attempt: int | None, step: Step, *, rate_limited: bool = False
) -> dict[str, Any]:
    """The request log's line for a request: `attempt` is its prompt's count (None: the rate
    limit refused it before its script was played)."""
    conversation = call.conversation or Conversation(call.prompt, call.system)
    return {
        "api": api,
        "model": call.model,
        "prompt": _logged(call.prompt),
        "system": None if call.system is None else _logged(call.system),
        "max_tokens": call.max_tokens,
        "temperature": call.temperature,
        # The conversation: the tools offered, whether it handed back tool results, images.
        "tools": [tool.name for tool in conversation.tools],
        "after_tool": conversation.after_tool,
        "images": list(conversation.images),
        # The schema the answer was asked to match, if any.
        "answer_schema": conversation.answer_schema,
        "attempt": attempt,
        "step": step,
        "stream": call.stream,
        # Updated while the answer runs: a stream's chunks so far, and when the client left.
        "chunks": 0,
        # When the first text chunk went out (epoch seconds): bench.stream_output measures
        # from here to the SSE client.
        "first_chunk_at": None,
        "disconnected_at": None,
        "rate_limited": rate_limited,
        # The provider batch the request came in (promptjobs/mock_batches.py), if any.
        "batch": None,
    }


def create_mock_app(provider: MockProvider | None = None) -> FastAPI:
    state = provider or MockProvider()
    app = FastAPI(title="promptjobs mock provider", version="1")

    async def chat(api: Api, request: Request) -> Response:
        if not _has_credential(api, request):
            return _error(api, 401, "missing API key")
        try:
            call = _read_call(api, await request.json())
            reply = _reply(call, call.script())
        except (ValueError, ValidationError) as err:
            return _error(api, 400, f"mock provider cannot read this request: {err}")
        verdict = state.minute.admit(reply.input_tokens, reply.output_tokens)
        if not verdict.allowed:
            # Refused before the script is consulted: the request does not count as one of
            # its prompt's, as a provider's rate limit knows nothing of our scripts.
            state.log.append(_log_entry(api, call, None, 429, rate_limited=True))
            wait = math.ceil(verdict.retry_after_s)
            return _error(
                api,
                429,
                f"mock provider: rate limit reached, {state.minute.limits.rpm} requests and "
                f"{state.minute.limits.tpm} tokens per minute; try again in {wait} s",
                {**verdict.headers, "retry-after": str(wait)},
            )
        try:
            attempt, plan = state.plan(call)
        except (ValueError, ValidationError) as err:
            return _error(api, 400, f"mock provider cannot read this request: {err}")
        entry = _log_entry(api, call, attempt, plan.step)
        state.log.append(entry)
        if plan.script.delay_ms:
            await asyncio.sleep(plan.script.delay_ms / 1000)
        answer = await _answer(api, call, plan, request, entry)
        if isinstance(answer, EventStream):
            answer.extra_headers = verdict.headers
        else:
            answer.headers.update(verdict.headers)
        return answer

    @app.post("/v1/chat/completions", tags=["openai"])
    async def openai_chat(request: Request) -> Response:
        return await chat("openai", request)

    @app.post("/v1/messages", tags=["anthropic"])
    async def anthropic_messages(request: Request) -> Response:
        return await chat("anthropic", request)

    add_batch_routes(app, state.batches)

    @app.post("/mock/script", tags=["admin"], response_model=Queued)
    async def script_next(script: Script) -> Queued:
        """The next len(fail) requests, whatever their prompt, answer as `fail` says."""
        return Queued(queued=state.enqueue(script))

    @app.get("/mock/requests", tags=["admin"])
    async def requests() -> dict[str, list[dict[str, Any]]]:
        return {"requests": list(state.log)}

    @app.get("/mock/limits", tags=["admin"])
    async def limits() -> dict[str, Any]:
        """The limits, the requests received and refused, and what the window holds now."""
        return state.minute.describe()

    @app.put("/mock/limits", tags=["admin"])
    async def set_limits(limits: Limits) -> dict[str, Any]:
        """New limits (null: none), counted from an empty window."""
        state.minute = SlidingMinute(limits, state.minute.clock)
        return state.minute.describe()

    @app.post("/mock/reset", tags=["admin"], status_code=204)
    async def reset() -> None:
        state.reset()

    return app


def _has_credential(api: Api, request: Request) -> bool:
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    return bool(bearer or (api == "anthropic" and request.headers.get("x-api-key")))


def _read_call(api: Api, body: Any) -> ChatCall:
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    conversation = read_conversation(api, body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = body.get("temperature")
    stream_options = body.get("stream_options")
    try:
        return ChatCall(
            api=api,
            model=str(body.get("model") or ""),
            prompt=conversation.prompt,
            system=conversation.system,
            max_tokens=int(max_tokens) if max_tokens is not None else None,
            temperature=float(temperature) if temperature is not None else None,
            stream=body.get("stream") is True,
            include_usage=isinstance(stream_options, dict)
            and stream_options.get("include_usage") is True,
            conversation=conversation,
        )
    except TypeError as err:
        raise ValueError(str(err)) from err


async def _answer(
    api: Api, call: ChatCall, plan: Plan, request: Request, entry: dict[str, Any]
) -> Response:
    cut = Cut.of(plan.step)
    step: int | str = plan.step
    if call.stream:
        if step == "reset":
            # Dropped before the first chunk (a `malformed` stays JSON: a server that ignored
            # `stream`, or a proxy's page).
            cut = Cut(step, 0)
        if cut is not None or step == "ok":
            return EventStream(_reply(call, plan.script), plan.script, cut, entry)
    elif cut is not None:
        # Without a stream there is no middle: the failure comes whole (an answer cut short
        # is a body that ends early).
        step = "malformed" if cut.what == "truncate" else cut.what
    if step == "ok":
        return _reply(call, plan.script).whole()
    if step == "hang":
        with suppress(TimeoutError):
            await asyncio.wait_for(_disconnected(request), HANG_LIMIT_S)
            entry["disconnected_at"] = time.time()
        return _error(api, 504, "the mock hung until the client went away")
    if step == "malformed":
        return Response(b'{"id": "truncated", "choi', media_type="application/json")
    if step == "reset":
        return ConnectionReset()
    if step == "too_long":
        said = (
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens. Please reduce the length of the messages."
            if api == "openai"
            else "prompt is too long: 210000 tokens > 200000 maximum"
        )
        return _error(api, 400, said, code="context_length_exceeded")
    if step == "no_model":
        said = (
            f"The model `{call.model}` does not exist or you do not have access to it."
            if api == "openai"
            else f"model: {call.model}"
        )
        return _error(api, 404, said, code="model_not_found")
    assert isinstance(step, int)
    headers = {}
    if step == 429:
        if plan.script.retry_after is not None:
            headers["retry-after"] = _number(plan.script.retry_after)
        if plan.script.retry_after_ms is not None:
            headers["retry-after-ms"] = str(plan.script.retry_after_ms)
    return _error(api, step, f"mock provider: scripted HTTP {step}", headers)


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


class ConnectionReset(Response):
    """Starts a response and drops the connection before its body is complete, as a proxy or
    a crashing server does; the client sees the connection end mid-answer."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"id": ', "more_body": True})
        # Returning with the body unfinished makes the server close the connection.


def _sse(data: Any, event: str | None = None) -> bytes:
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(data)}\n\n".encode()


# Each API's error body and error type names, so the SDKs read them as they read the real ones.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


def _error_body(api: Api, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    if api == "openai":
        kind = "invalid_request_error" if status < 500 else "server_error"
        code = code or OPENAI_CODES.get(status)
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
    fallback = "api_error" if status >= 500 else "invalid_request_error"
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_TYPES.get(status, fallback), "message": message},
    }


def _error(
    api: Api,
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    code: str | None = None,
) -> Response:
    name = "x-request-id" if api == "openai" else "request-id"
    return Response(
        json.dumps(_error_body(api, status, message, code)),
        status_code=status,
        media_type="application/json",
        headers={name: _request_id(), **(headers or {})},
    )


def _request_id() -> str:
    return f"req_mock_{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class Reply:
    """A success, the same words whether it goes out whole or streamed a word a chunk; a word
    stands for a token, so max_tokens can cut it short."""

    call: ChatCall
    words: list[str]
    truncated: bool
    request_id: str
    # The model the answer names (the script's `answer_model`, else the one asked for).
    model: str
    # Instead of text, tool calls: (id, name, arguments as JSON text) each.
    calls: tuple[tuple[str, str, str], ...] = ()

    @property
    def api(self) -> Api:
        return self.call.api

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def input_tokens(self) -> int:
        return len(self.call.prompt.split()) + len((self.call.system or "").split())

    @property
    def finish_reason(self) -> str:
        if self.api == "openai":
            return "tool_calls" if self.calls else "length" if self.truncated else "stop"
        return "tool_use" if self.calls else "max_tokens" if self.truncated else "end_turn"

    @property
    def answer_id(self) -> str:
        """The id in the body (a repeated request id repeats it too)."""
        prefix = "chatcmpl-mock-" if self.api == "openai" else "msg_mock_"
        return f"{prefix}{self.request_id.removeprefix('req_mock_')[:12]}"

    def pieces(self) -> Iterator[str | CallPiece]:
        """The stream's chunks: text, whose concatenation is `text`, or each call's start and
        its arguments a fragment at a time."""
        if not self.calls:
            return (word if i == 0 else f" {word}" for i, word in enumerate(self.words))
        return (
            piece
            for index, (call_id, name, arguments) in enumerate(self.calls)
            for piece in (
                CallPiece(index, call_id, name),
                *(CallPiece(index, arguments=part) for part in fragments(arguments)),
            )
        )

    @property
    def output_tokens(self) -> int:
        return len(self.words) + sum(len(list(fragments(c[2]))) for c in self.calls)

    def usage(self) -> dict[str, int]:
        output_tokens = self.output_tokens
        if self.api == "anthropic":
            return {"input_tokens": self.input_tokens, "output_tokens": output_tokens}
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": self.input_tokens + output_tokens,
        }

    def body(self) -> dict[str, Any]:
        """The whole answer's JSON body (a batch's result line carries it too)."""
        if self.api == "openai":
            return {
                "id": self.answer_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None if self.calls else self.text,
                            **(
                                {
                                    "tool_calls": [
                                        {
                                            "id": call_id,
                                            "type": "function",
                                            "function": {"name": name, "arguments": arguments},
                                        }
                                        for call_id, name, arguments in self.calls
                                    ]
                                }
                                if self.calls
                                else {}
                            ),
                        },
                        "finish_reason": self.finish_reason,
                    }
                ],
                "usage": self.usage(),
            }
        return {
            "id": self.answer_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [
                {"type": "tool_use", "id": call_id, "name": name, "input": json.loads(arguments)}
                for call_id, name, arguments in self.calls
            ]
            or [{"type": "text", "text": self.text}],
            "stop_reason": self.finish_reason,
            "stop_sequence": None,
            "usage": self.usage(),
        }

    def whole(self) -> Response:
        name = "x-request-id" if self.api == "openai" else "request-id"
        return JSONResponse(self.body(), headers={name: self.request_id})

    def stream(self) -> Wire:
        return OpenAIWire(self) if self.api == "openai" else AnthropicWire(self)


def _reply(call: ChatCall, script: Script) -> Reply:
    """A deterministic answer: the prompt after a digest of it, its words repeated up to
    `script.chunks`, then cut to `max_tokens`."""
    request_id = script.request_id or _request_id()
    model = script.answer_model or call.model
    conversation = call.conversation
    tool = conversation.calls_tool if conversation is not None else None
    if tool is not None:
        prefix = "call_mock_" if call.api == "openai" else "toolu_mock_"
        arguments = json.dumps(sample_arguments(tool.parameters))
        calls = ((f"{prefix}{uuid.uuid4().hex[:12]}", tool.name, arguments),)
        return Reply(call, [], False, request_id, model, calls)
    digest = hashlib.sha256(call.prompt.encode()).hexdigest()[:12]
    if conversation is not None and conversation.answer_schema is not None:
        text = json_answer(conversation.answer_schema, script, digest)
        words = text.split(" ")  # joined by spaces again: the text, exactly
        limit = call.max_tokens
        if limit is not None and len(words) > limit:
            return Reply(call, words[:limit], True, request_id, model)
        return Reply(call, words, False, request_id, model)
    shown = image_words(conversation.images) if conversation is not None else []
    words = [f"[mock:{digest}]", *shown, *call.prompt.split()]
    words = list(islice(cycle(words), max(len(words), script.chunks)))
    limit = call.max_tokens
    if limit is not None and len(words) > limit:
        return Reply(call, words[:limit], True, request_id, model)
    return Reply(call, words, False, request_id, model)


def json_answer(schema: dict[str, Any], script: Script, digest: str) -> str:
    """The answer to a request for JSON: a value that fits `schema`, unless the script says
    to miss (text that is no JSON; JSON without its first property, or with it mistyped)."""
    missing = script.json_reply
    if script.json_miss_rate and int(digest, 16) % 1000 < script.json_miss_rate * 1000:
        missing = "invalid"
    if missing == "invalid":
        return "Sure! Here is the JSON you asked for: {"
    value = sample_value(schema)
    if missing != "valid" and isinstance(value, dict) and value:
        first = next(iter(value))
        if missing == "missing":
            del value[first]
        else:
            value[first] = 12345 if isinstance(value[first], str) else "mock-wrong"
    return json.dumps(value)


@dataclass(frozen=True)
class CallPiece:
    """A streamed tool call's piece: its start (id and name), or a fragment of its arguments."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


class Wire(Protocol):
    """One API's stream format: what comes before the text, each text chunk, what comes after,
    and the failures in the middle."""

    request_id_header: bytes

    def head(self) -> list[bytes]: ...

    def piece(self, piece: str | CallPiece) -> bytes: ...

    def tail(self) -> list[bytes]: ...

    def error(self, status: int, message: str) -> bytes:
        """The API's error event for what HTTP `status` would say before a stream."""
        ...

    def malformed(self) -> bytes:
        """An event whose data breaks off."""
        ...


class OpenAIWire:
    """`data: {chat.completion.chunk}` lines, the last choice chunk with its finish_reason, a
    usage chunk without choices if asked for, then `data: [DONE]`."""

    request_id_header = b"x-request-id"

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.base: dict[str, Any] = {
            "id": reply.answer_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": reply.model,
            "system_fingerprint": None,
        }
        if reply.call.include_usage:
            # As OpenAI does: every chunk but the last says it has no usage.
            self.base["usage"] = None

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _sse({**self.base, "choices": [choice]})

    def head(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": None if self.reply.calls else ""})]

    def piece(self, piece: str | CallPiece) -> bytes:
        if isinstance(piece, str):
            return self._chunk({"content": piece})
        call: dict[str, Any] = {"index": piece.index}
        if piece.call_id is not None:
            call |= {"id": piece.call_id, "type": "function"}
            call["function"] = {"name": piece.name, "arguments": ""}
        else:
            call["function"] = {"arguments": piece.arguments}
        return self._chunk({"tool_calls": [call]})

    def tail(self) -> list[bytes]:
        frames = [self._chunk({}, self.reply.finish_reason)]
        if self.reply.call.include_usage:
            frames.append(_sse({**self.base, "choices": [], "usage": self.reply.usage()}))
        return [*frames, b"data: [DONE]\n\n"]

    def error(self, status: int, message: str) -> bytes:
        return _sse(_error_body("openai", status, message))

    def malformed(self) -> bytes:
        return b'data: {"id": "truncated", "choi\n\n'


class AnthropicWire:
    """`message_start`, `content_block_start`, `content_block_delta` per chunk,
    `content_block_stop`, `message_delta` (stop_reason and output tokens), `message_stop`."""

    request_id_header = b"request-id"

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    def head(self) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.reply.answer_id,
            "type": "message",
            "role": "assistant",
            "model": self.reply.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # As the API does: the input is counted, the output is not yet.
            "usage": {"input_tokens": self.reply.input_tokens, "output_tokens": 1},
        }
        started = [_sse({"type": "message_start", "message": message}, "message_start")]
        if not self.reply.calls:
            started.append(self._start(0, {"type": "text", "text": ""}))
        return [*started, _sse({"type": "ping"}, "ping")]

    @staticmethod
    def _start(index: int, block: dict[str, Any]) -> bytes:
        started = {"type": "content_block_start", "index": index, "content_block": block}
        return _sse(started, "content_block_start")

    def piece(self, piece: str | CallPiece) -> bytes:
        if isinstance(piece, CallPiece) and piece.call_id is not None:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": piece.call_id,
                "name": piece.name,
                "input": {},
            }
            stop = {"type": "content_block_stop", "index": piece.index - 1}
            before = _sse(stop, "content_block_stop") if piece.index else b""
            return before + self._start(piece.index, block)
        if isinstance(piece, CallPiece):
            index, delta = (
                piece.index,
                {"type": "input_json_delta", "partial_json": piece.arguments},
            )
        else:
            index, delta = 0, {"type": "text_delta", "text": piece}
        return _sse(
            {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
        )

    def tail(self) -> list[bytes]:
        delta = {"stop_reason": self.reply.finish_reason, "stop_sequence": None}
        usage = {"output_tokens": self.reply.output_tokens}
        last = max(len(self.reply.calls) - 1, 0)
        return [
            _sse({"type": "content_block_stop", "index": last}, "content_block_stop"),
            _sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta"),
            _sse({"type": "message_stop"}, "message_stop"),
        ]

    def error(self, status: int, message: str) -> bytes:
        return _sse(_error_body("anthropic", status, message), "error")

    def malformed(self) -> bytes:
        return b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n'


class EventStream(Response):
    """A streamed answer: a chunk a word, each after `chunk_ms`, failing as `cut` says. The
    request's log entry counts the chunks sent and records when the client goes away."""

    def __init__(self, reply: Reply, script: Script, cut: Cut | None, entry: dict[str, Any]):
        super().__init__()
        self.reply = reply
        self.script = script
        self.cut = cut
        self.entry = entry
        self.extra_headers: dict[str, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        watcher = asyncio.create_task(self._watch(receive, gone))
        wire = self.reply.stream()
        try:
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (wire.request_id_header, self.reply.request_id.encode()),
                *((k.encode(), v.encode()) for k, v in self.extra_headers.items()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            complete = await self._play(wire, send, gone)
        finally:
            # Before the last send: once the response is complete, the server reports a
            # disconnect to a pending receive, which is not the client going away.
            watcher.cancel()
            await asyncio.wait([watcher])
        if complete and not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        # Otherwise returning with the body unfinished makes the server drop the connection.

    async def _watch(self, receive: Receive, gone: asyncio.Event) -> None:
        message: Message = await receive()
        while message["type"] != "http.disconnect":
            message = await receive()
        self.entry["disconnected_at"] = time.time()
        gone.set()

    async def _play(self, wire: Wire, send: Send, gone: asyncio.Event) -> bool:
        """Sends the stream; False when it ends by dropping the connection."""

        async def emit(frame: bytes) -> None:
            await send({"type": "http.response.body", "body": frame, "more_body": True})

        for frame in wire.head():
            await emit(frame)
        pieces = self.reply.pieces()
        for piece in pieces if self.cut is None else islice(pieces, self.cut.after):
            if await _client_gone(gone, self.script.chunk_ms / 1000):
                return True
            await emit(wire.piece(piece))
            if self.entry["first_chunk_at"] is None:
                self.entry["first_chunk_at"] = time.time()
            self.entry["chunks"] += 1
        cut = self.cut
        if cut is None:
            for frame in wire.tail():
                await emit(frame)
        elif cut.what == "reset":
            return False
        elif cut.what == "hang":
            await _client_gone(gone, HANG_LIMIT_S)
        elif cut.what == "malformed":
            await emit(wire.malformed())
        elif isinstance(cut.what, int):
            message = f"mock provider: scripted {cut.what} after {self.entry['chunks']} chunks"
            await emit(wire.error(cut.what, message))
        # `truncate`: the stream ends here, without its final events.
        return True


async def _client_gone(gone: asyncio.Event, seconds: float) -> bool:
    """Waits `seconds` (yielding at least once); whether the client went away meanwhile."""
    if seconds <= 0:
        await asyncio.sleep(0)
    else:
        with suppress(TimeoutError):
            await asyncio.wait_for(gone.wait(), seconds)
    return gone.is_set()


def _logged(text: str) -> str:
    return text if len(text) <= LOGGED_CHARS else text[:LOGGED_CHARS] + "…"
