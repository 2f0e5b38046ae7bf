"""The mock provider: an OpenAI- and Anthropic-compatible HTTP server whose failures are scripted.

Scripting (docs/providers.md has the whole story): a directive `mock:fail=429,500;retry_after=2`
as the model name, or as a word of the prompt, makes the i-th request for that prompt behave as
the i-th step of `fail`, and every later one succeed. `POST /mock/script` scripts the next
requests whatever their prompt. `GET /mock/requests` lists what arrived, `POST /mock/reset`
forgets it all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

Api = Literal["openai", "anthropic"]
# A step is an HTTP status to answer with, or one of these behaviours.
Word = Literal["ok", "hang", "malformed", "reset"]
Step = Word | Annotated[int, Field(ge=400, le=599)]

DIRECTIVE = "mock:"
PROMPT_DIRECTIVE = re.compile(r"(?:^|\s)mock:(\S*)")
# A `hang` lasts until the client gives up, but never longer than this.
HANG_LIMIT_S = 600.0
SEEN_KEYS = 100_000
# The request log keeps this much of each prompt and system text (`…` marks a cut).
LOGGED_CHARS = 4_096


class Script(BaseModel):
    """What the next requests do: request i answers as fail[i-1] while i <= len(fail), then
    succeeds. The headers and the delay apply to every step of the script."""

    model_config = ConfigDict(extra="forbid")

    fail: list[Step] = Field(default_factory=list, max_length=50)
    retry_after: float | None = Field(default=None, ge=0, description="Retry-After on a 429")
    retry_after_ms: int | None = Field(default=None, ge=0, description="retry-after-ms on a 429")
    delay_ms: int = Field(default=0, ge=0, le=600_000, description="Wait before answering")

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
class ChatCall:
    """The parts of a provider request the mock looks at and records."""

    api: Api
    model: str
    prompt: str
    system: str | None
    max_tokens: int | None
    temperature: float | None

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


class Queued(BaseModel):
    queued: int


class MockProvider:
    """The mock's state: per-prompt request counts, the admin queue, the request log."""

    def __init__(self) -> None:
        # Requests per prompt key, the least recently seen forgotten past SEEN_KEYS: a mock
        # fed by a long soak of distinct prompts keeps a bounded memory (a forgotten key
        # starts its script over, which a soak never relies on).
        self.seen: OrderedDict[str, int] = OrderedDict()
        self.queue: deque[Plan] = deque()
        # Bounded, so a long-running mock does not grow without end.
        self.log: deque[dict[str, Any]] = deque(maxlen=10_000)

    def reset(self) -> None:
        self.seen.clear()
        self.queue.clear()
        self.log.clear()

    def enqueue(self, script: Script) -> int:
        self.queue.extend(Plan(step, script) for step in script.fail)
        return len(script.fail)

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


async def run_mock_provider(
    host: str,
    port: int,
    *,
    stop: asyncio.Event,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve the mock provider until `stop`."""
    config = uvicorn.Config(
        create_mock_app(),
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


def create_mock_app(provider: MockProvider | None = None) -> FastAPI:
    state = provider or MockProvider()
    app = FastAPI(title="promptjobs mock provider", version="1")

    async def chat(api: Api, request: Request) -> Response:
        if not _has_credential(api, request):
            return _error(api, 401, "missing API key")
        try:
            call = _read_call(api, await request.json())
            attempt, plan = state.plan(call)
        except (ValueError, ValidationError) as err:
            return _error(api, 400, f"mock provider cannot read this request: {err}")
        state.log.append(
            {
                "api": api,
                "model": call.model,
                "prompt": _logged(call.prompt),
                "system": None if call.system is None else _logged(call.system),
                "max_tokens": call.max_tokens,
                "temperature": call.temperature,
                "attempt": attempt,
                "step": plan.step,
            }
        )
        if plan.script.delay_ms:
            await asyncio.sleep(plan.script.delay_ms / 1000)
        return await _answer(api, call, plan, request)

    @app.post("/v1/chat/completions", tags=["openai"])
    async def openai_chat(request: Request) -> Response:
        return await chat("openai", request)

    @app.post("/v1/messages", tags=["anthropic"])
    async def anthropic_messages(request: Request) -> Response:
        return await chat("anthropic", request)

    @app.post("/mock/script", tags=["admin"], response_model=Queued)
    async def script_next(script: Script) -> Queued:
        """The next len(fail) requests, whatever their prompt, answer as `fail` says."""
        return Queued(queued=state.enqueue(script))

    @app.get("/mock/requests", tags=["admin"])
    async def requests() -> dict[str, list[dict[str, Any]]]:
        return {"requests": list(state.log)}

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
    raw = body.get("messages")
    messages = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    user = [m for m in messages if m.get("role") == "user"]
    if api == "openai":
        system = next((_text(m) for m in messages if m.get("role") == "system"), None)
    elif body.get("system") is not None:
        system = _text({"content": body["system"]})
    else:
        system = None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = body.get("temperature")
    try:
        return ChatCall(
            api=api,
            model=str(body.get("model") or ""),
            prompt=_text(user[-1]) if user else "",
            system=system,
            max_tokens=int(max_tokens) if max_tokens is not None else None,
            temperature=float(temperature) if temperature is not None else None,
        )
    except TypeError as err:
        raise ValueError(str(err)) from err


def _text(message: dict[str, Any]) -> str:
    """A message's content as text: a string, or a list of text parts (both APIs allow it)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts: Iterable[Any] = content if isinstance(content, list) else []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


async def _answer(api: Api, call: ChatCall, plan: Plan, request: Request) -> Response:
    step = plan.step
    if step == "ok":
        return _success(api, call)
    if step == "hang":
        with suppress(TimeoutError):
            await asyncio.wait_for(_disconnected(request), HANG_LIMIT_S)
        return _error(api, 504, "the mock hung until the client went away")
    if step == "malformed":
        return Response(b'{"id": "truncated", "choi', media_type="application/json")
    if step == "reset":
        return ConnectionReset()
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


def _reply(prompt: str, max_tokens: int | None) -> tuple[str, bool]:
    """A deterministic answer; a word stands for a token, so max_tokens can cut it short."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    words = f"[mock:{digest}] {prompt}".split()
    if max_tokens is not None and len(words) > max_tokens:
        return " ".join(words[:max_tokens]), True
    return " ".join(words), False


def _success(api: Api, call: ChatCall) -> Response:
    text, truncated = _reply(call.prompt, call.max_tokens)
    input_tokens = len(call.prompt.split()) + len((call.system or "").split())
    output_tokens = len(text.split())
    request_id = f"req_mock_{uuid.uuid4().hex[:16]}"
    body: dict[str, Any]
    if api == "openai":
        body = {
            "id": f"chatcmpl-mock-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": call.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length" if truncated else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
        }
        return JSONResponse(body, headers={"x-request-id": request_id})
    body = {
        "id": f"msg_mock_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if truncated else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
    return JSONResponse(body, headers={"request-id": request_id})


# Each API's error body and error type names, so the SDKs read them as they read the real ones.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _error(api: Api, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    request_id = f"req_mock_{uuid.uuid4().hex[:16]}"
    body: dict[str, Any]
    if api == "openai":
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        headers = {"x-request-id": request_id, **(headers or {})}
    else:
        fallback = "api_error" if status >= 500 else "invalid_request_error"
        kind = ANTHROPIC_TYPES.get(status, fallback)
        body = {"type": "error", "error": {"type": kind, "message": message}}
        headers = {"request-id": request_id, **(headers or {})}
    return Response(
        json.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def _logged(text: str) -> str:
    return text if len(text) <= LOGGED_CHARS else text[:LOGGED_CHARS] + "…"
