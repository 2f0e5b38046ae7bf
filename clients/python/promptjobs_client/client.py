"""The Python client of the promptjobs API: `PromptJobs` (sync) and `AsyncPromptJobs` (async).

Both clients share everything but the I/O: how a request is built, how an answer becomes a
model or an `APIError`, when and how long to wait before a retry, how an SSE event is read.
Its wire models are its own (promptjobs_client/models.py). docs/client.md is the guide.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx2
from httpx2 import ServerSentEvent
from pydantic import BaseModel, ValidationError

from promptjobs_client.models import (
    Accepted,
    AttemptList,
    AttemptOut,
    EventType,
    JobList,
    JobOut,
    JobState,
    OutputChunk,
    OutputOut,
    OutputReset,
    ProblemDetails,
    PromptList,
    PromptOut,
    ResponseOut,
    RetryJob,
    SubmitPrompt,
)

PROBLEM_JSON = "application/problem+json"
DEFAULT_URL = "http://127.0.0.1:8000"

__all__ = [
    "APIConnectionError",
    "APIError",
    "Accepted",
    "AsyncJob",
    "AsyncPromptJobs",
    "AttemptOut",
    "Event",
    "Job",
    "JobList",
    "JobOut",
    "OutputChunk",
    "OutputOut",
    "OutputReset",
    "PromptJobs",
    "PromptJobsError",
    "PromptOut",
    "ResponseOut",
    "RetryPolicy",
    "StreamUnavailable",
    "WaitTimeout",
]

M = TypeVar("M", bound=BaseModel)

# Statuses that mean "the server did nothing; ask again later".
RETRY_STATUSES = frozenset({429, 503})
SILENT_STREAM_S = 60.0


# -- errors ------------------------------------------------------------------------------


class PromptJobsError(Exception):
    """Every error this client raises."""


class APIError(PromptJobsError):
    """The API answered with an error: its problem details (RFC 9457), as sent."""

    def __init__(self, status: int, code: str, detail: str, problem: ProblemDetails | None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.problem = problem


class InvalidRequest(PromptJobsError, ValueError):
    """The request was refused before it was sent, for the reasons the API would give
    (`errors`: each field and what to fix), so a typo costs no round trip."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("fix these fields: " + "; ".join(f"{f}: {m}" for f, m in errors))
        self.errors = errors


def checked(model: type[M], fields: Mapping[str, Any]) -> M:
    """`fields` (None left out) as the API's own model, or InvalidRequest."""
    sent = json.dumps({k: v for k, v in fields.items() if v is not None})
    try:
        return model.model_validate_json(sent)
    except ValidationError as err:
        raise InvalidRequest(
            [(".".join(str(p) for p in e["loc"]), _said(e)) for e in err.errors()]
        ) from None


def _said(error: Mapping[str, Any]) -> str:
    """A field's error in the server's words where they differ from pydantic's."""
    if error["type"] == "extra_forbidden":
        return "unknown field: remove it (see the OpenAPI document for the fields allowed)"
    return str(error["msg"])


class APIConnectionError(PromptJobsError):
    """The API could not be reached (after the retries the policy allows)."""


class StreamUnavailable(PromptJobsError):
    """GET /v1/events answered with something other than a stream (a proxy that buffers or
    refuses SSE, say); `wait()` follows the job by polling instead."""


class WaitTimeout(PromptJobsError, TimeoutError):
    """`wait(timeout=…)` ran out before the job settled; `last` is the job as last seen."""

    def __init__(self, job_id: str, timeout: float, last: JobOut | None) -> None:
        state = last.state.value if last else "unknown"
        super().__init__(f"job {job_id} not settled within {timeout}s (last seen: {state})")
        self.job_id = job_id
        self.last = last


@dataclass(frozen=True)
class Event:
    """One SSE event: `id` is the cursor to resume after, `job` the row after the change."""

    id: str
    type: str
    job: JobOut


@dataclass(frozen=True)
class RetryPolicy:
    """How `429`, `503` and unreachable-server errors are retried: `max_retries` times, with
    exponential backoff from `initial_s`, or the server's `Retry-After` when it sends one. A
    `Retry-After` longer than `maximum_s` is not waited for: the error is raised."""

    max_retries: int = 3
    initial_s: float = 0.5
    maximum_s: float = 30.0

    def delay(self, retry: int, response: httpx2.Response | None) -> float | None:
        """Seconds before retry number `retry` (0-based), or None: give up."""
        if retry >= self.max_retries:
            return None
        asked = retry_after(response) if response is not None else None
        if asked is not None:
            return asked if asked <= self.maximum_s else None
        return float(min(self.maximum_s, self.initial_s * 2**retry))


def retry_after(response: httpx2.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# -- what both clients share ---------------------------------------------------------------


@dataclass
class Call:
    """One API call. `replayable`: sending it twice does no harm (reads; a submit carrying an
    Idempotency-Key), so a timeout or a dropped connection is retried, not only a refused one."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    replayable: bool = True


def schema_of(output: type[BaseModel] | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`options.output_schema` from a pydantic model (its name and JSON schema), or as given."""
    if output is None:
        return None
    if isinstance(output, type) and issubclass(output, BaseModel):
        return {"name": output.__name__, "schema": output.model_json_schema()}
    return dict(output)


def submit_call(
    prompt: str | None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    output_schema: type[BaseModel] | Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None,
    priority: int | None,
    max_attempts: int | None,
    scheduled_for: datetime | None,
    parent_id: str | None,
    correlation_id: str | None,
    idempotency_key: str | None,
    after: Sequence[str] = (),
    webhook: str | None = None,
    webhook_events: Sequence[str] | None = None,
) -> Call:
    if (prompt is None) == (messages is None):
        raise InvalidRequest(
            [("prompt", "give a prompt (one user message) or messages (a conversation), not both")]
        )
    extra = {"tools": tools, "tool_choice": tool_choice, "output_schema": schema_of(output_schema)}
    if any(value is not None for value in extra.values()):
        options = {
            **(options or {}),
            **{name: value for name, value in extra.items() if value is not None},
        }
    fields: dict[str, Any] = {
        "prompt": prompt,
        "messages": [dict(m) for m in messages] if messages is not None else None,
        "options": dict(options) if options is not None else None,
        "priority": priority,
        "max_attempts": max_attempts,
        "scheduled_for": scheduled_for.isoformat() if scheduled_for else None,
        "parent_id": parent_id,
        "correlation_id": correlation_id,
        "after": list(after) or None,
        "webhook": webhook,
        "webhook_events": list(webhook_events) if webhook_events is not None else None,
    }
    # Checked against the API's own model before it leaves: a typo fails here, with the
    # same message the server would give, and costs no round trip.
    body = checked(SubmitPrompt, fields).model_dump(mode="json", exclude_unset=True)
    # A fresh key per submit: a retry after a lost answer replays the first, never a second job.
    key = idempotency_key or f"pjc-{uuid.uuid4().hex}"
    return Call("POST", "/v1/prompts", json=body, headers={"Idempotency-Key": key})


def output_call(job_id: str, since: int) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/output", params={"since": str(since)})


def attempts_call(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/attempts")


def action_call(job_id: str, action: str, body: dict[str, Any] | None = None) -> Call:
    # Not replayable: a cancel or retry that did land answers 409 the second time.
    return Call("POST", f"/v1/jobs/{job_id}/{action}", json=body, replayable=False)


def retry_call(
    job_id: str,
    *,
    options: Mapping[str, Any] | None,
    priority: int | None,
    max_attempts: int | None,
) -> Call:
    """A retry, with what the new job runs with instead of the old job's (checked against the
    API's own model before it leaves, as a submission is)."""
    fields = {"options": options, "priority": priority, "max_attempts": max_attempts}
    body = checked(RetryJob, fields).model_dump(mode="json", exclude_unset=True)
    return action_call(job_id, "retry", body or None)


def api_error(response: httpx2.Response) -> APIError:
    problem = None
    if response.headers.get("content-type", "").startswith(PROBLEM_JSON):
        try:
            problem = ProblemDetails.model_validate_json(response.content)
        except ValidationError:
            problem = None
    if problem is not None:
        return APIError(response.status_code, problem.code, problem.detail, problem)
    text = response.text.strip()[:200] or response.reason_phrase
    return APIError(response.status_code, "http_error", text, None)


def parsed(response: httpx2.Response, model: type[M]) -> M:
    if response.is_error:
        raise api_error(response)
    return model.model_validate_json(response.content)


def state_event(sse: ServerSentEvent) -> Event | None:
    if sse.event != EventType.STATE_CHANGED or not sse.data:
        return None
    return Event(id=sse.id, type=sse.event, job=JobOut.model_validate_json(sse.data))


def job_row(sse: ServerSentEvent) -> JobOut | None:
    """The job row an event carries (a state change, a late usage, the job's end)."""
    if sse.event not in (EventType.STATE_CHANGED, EventType.USAGE, EventType.DONE):
        return None
    return JobOut.model_validate_json(sse.data) if sse.data else None


def final_row(sse: ServerSentEvent) -> JobOut | None:
    """The job's final row if `sse` is its `job.done`: the end of the job's stream."""
    if sse.event != EventType.DONE or not sse.data:
        return None
    return JobOut.model_validate_json(sse.data)


class JobStreamEnd:
    """Tells, for a stream of one job, when the job is over: at its `job.done`, or when the
    server ends the stream after the job has settled (a job that settled without one)."""

    def __init__(self, job_id: str | None) -> None:
        self.job_id = job_id
        self.settled = False

    def saw(self, sse: ServerSentEvent) -> None:
        event = state_event(sse)
        if sse.event == EventType.DONE or (event is not None and is_terminal(event.job)):
            self.settled = True

    @property
    def over(self) -> bool:
        return self.job_id is not None and self.settled


def output_piece(sse: ServerSentEvent) -> OutputChunk | OutputReset | None:
    if sse.event == EventType.OUTPUT and sse.data:
        return OutputChunk.model_validate_json(sse.data)
    if sse.event == EventType.OUTPUT_RESET and sse.data:
        return OutputReset.model_validate_json(sse.data)
    return None


class EventDecoder:
    """Server-Sent Events, line by line (the parts of the format this API sends)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id = ""

    def line(self, line: str) -> ServerSentEvent | None:
        if not line:
            if not self._data and not self._event:
                return None
            sse = ServerSentEvent(event=self._event or "message", data="\n".join(self._data),
                                  id=self._id)  # fmt: skip
            self._event, self._data = "", []
            return sse
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


def sse_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A stream's request headers: `headers`, and what asks for a stream no cache keeps."""
    return {**headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}


def sse_params(since: str | None, job_id: str | None, prompt_id: str | None) -> dict[str, str]:
    params = {"since": since, "job_id": job_id, "prompt_id": prompt_id}
    return {k: v for k, v in params.items() if v is not None}


def unreachable(base_url: str, err: Exception) -> APIConnectionError:
    return APIConnectionError(
        f"cannot reach the promptjobs API at {base_url} ({type(err).__name__}: {err}); "
        "is it running, and is the URL (PROMPTJOBS_URL) right?"
    )


def is_terminal(job: JobOut) -> bool:
    return JobState(job.state).is_terminal


# The caller's own mistakes (a bad key, someone else's job, a bad cursor): never worked around.
CALLER_ERRORS = frozenset({400, 401, 403, 404, 409, 422})


def stream_problem(response: httpx2.Response) -> PromptJobsError | None:
    """What is wrong with an answer to GET /v1/events, or None if it is a stream. Call only
    after reading the body of an error answer."""
    kind = response.headers.get("content-type", "")
    if not response.is_error and kind.startswith("text/event-stream"):
        return None
    if response.status_code in CALLER_ERRORS:
        return api_error(response)
    return StreamUnavailable(f"GET /v1/events answered {response.status_code} {kind or ''}")


def connection_settings(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The URL and key given, else PROMPTJOBS_URL (else the local default) and
    PROMPTJOBS_API_KEY from the caller's environment."""
    url = (base_url or os.environ.get("PROMPTJOBS_URL") or DEFAULT_URL).rstrip("/")
    if url.endswith("/v1"):
        # The OpenAI SDK's base URL ends in /v1; this client adds /v1 to each path itself.
        raise PromptJobsError(
            f"base URL {url} ends in /v1: give the server's address, {url.removesuffix('/v1')} "
            "(the OpenAI SDK is the one that takes …/v1)"
        )
    key = api_key or os.environ.get("PROMPTJOBS_API_KEY")
    if not key:
        raise PromptJobsError("no API key: pass api_key=… or set PROMPTJOBS_API_KEY")
    return url, {"Authorization": f"Bearer {key}", "User-Agent": "promptjobs-python"}


# -- sync ----------------------------------------------------------------------------------


class PromptJobs:
    """The promptjobs API, synchronously. `base_url` and `api_key` default to
    `PROMPTJOBS_URL` (else http://127.0.0.1:8000) and `PROMPTJOBS_API_KEY`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        poll_interval_s: float = 1.0,
    ) -> None:
        self.base_url, headers = connection_settings(base_url, api_key)
        self.retry_policy = retry or RetryPolicy()
        self.poll_interval_s = poll_interval_s
        self._http = httpx2.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PromptJobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call) -> httpx2.Response:
        retry = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, params=call.params, json=call.json, headers=call.headers
                )
            except httpx2.TransportError as err:
                if not (call.replayable or isinstance(err, httpx2.ConnectError)):
                    raise unreachable(self.base_url, err) from err
                wait = self.retry_policy.delay(retry, None)
                if wait is None:
                    raise unreachable(self.base_url, err) from err
            else:
                if response.status_code not in RETRY_STATUSES:
                    return response
                wait = self.retry_policy.delay(retry, response)
                if wait is None:
                    raise api_error(response)
            time.sleep(wait)
            retry += 1

    def submit(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        output_schema: type[BaseModel] | Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        scheduled_for: datetime | None = None,
        parent_id: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
        after: Sequence[str] = (),
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> Job:
        """Submit a prompt, or a conversation (`messages` in the Chat Completions format, and
        the `tools` the model may call); the job is `queued`. `output_schema` (a pydantic
        model, or `{"name", "schema"}`) asks for an answer in that shape: read it with
        `job.response().parse(Model)`. `webhook`: a URL told of the job's end (or of the
        `webhook_events` named), signed with the org's secret for jobs' own webhooks. An
        idempotency key is made unless given."""
        call = submit_call(
            prompt,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice,
            output_schema=output_schema,
            options=options,
            priority=priority,
            max_attempts=max_attempts,
            scheduled_for=scheduled_for,
            parent_id=parent_id,
            correlation_id=correlation_id,
            idempotency_key=idempotency_key,
            after=after,
            webhook=webhook,
            webhook_events=webhook_events,
        )
        accepted = parsed(self._send(call), Accepted)
        return Job(self, accepted.job_id, accepted.prompt_id)

    def job(self, job_id: str) -> Job:
        """A handle on a job by id (no request is made)."""
        return Job(self, job_id)

    def get_job(self, job_id: str) -> JobOut:
        return parsed(self._send(Call("GET", f"/v1/jobs/{job_id}")), JobOut)

    def prompt(self, prompt_id: str) -> PromptOut:
        return parsed(self._send(Call("GET", f"/v1/prompts/{prompt_id}")), PromptOut)

    def prompts(self, *, page_size: int = 50) -> Iterator[PromptOut]:
        """Your prompts, newest first, page after page."""
        params = {"limit": str(page_size)}
        while True:
            page = parsed(self._send(Call("GET", "/v1/prompts", params=dict(params))), PromptList)
            yield from page.prompts
            if page.next_before is None:
                return
            params["before"] = page.next_before

    def response(self, response_id: str) -> ResponseOut:
        return parsed(self._send(Call("GET", f"/v1/responses/{response_id}")), ResponseOut)

    def output(self, job_id: str, since: int = 0) -> OutputOut:
        """The text the job's current attempt has streamed, from character `since` on."""
        return parsed(self._send(output_call(job_id, since)), OutputOut)

    def attempts(self, job_id: str) -> list[AttemptOut]:
        """Each ended attempt: outcome, model, tokens, cost, time to first token."""
        return parsed(self._send(attempts_call(job_id)), AttemptList).attempts

    def cancel(self, job_id: str) -> JobOut:
        return parsed(self._send(action_call(job_id, "cancel")), JobOut)

    def retry(
        self,
        job_id: str,
        *,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> Job:
        """Run a settled job's prompt again; the new job supersedes it. `options` (replacing
        the old job's as a whole), `priority` and `max_attempts` change what it runs with."""
        call = retry_call(job_id, options=options, priority=priority, max_attempts=max_attempts)
        new = parsed(self._send(call), JobOut)
        return Job(self, new.job_id, new.prompt_id)

    def changes(
        self, since: str = "0", *, state: JobState | None = None, limit: int = 100
    ) -> Iterator[JobList]:
        """Pages of your jobs changed after `since`, until caught up. Keep the last page's
        `next_cursor` and pass it as `since` next time."""
        while True:
            params = {"since": since, "limit": str(limit)}
            if state is not None:
                params["state"] = JobState(state).value
            page = parsed(self._send(Call("GET", "/v1/jobs", params=params)), JobList)
            if not page.jobs:
                return
            yield page
            since = page.next_cursor

    def events(
        self,
        since: str | None = None,
        *,
        job_id: str | None = None,
        prompt_id: str | None = None,
        until: float | None = None,
    ) -> Iterator[Event]:
        """Your jobs' state changes over SSE, live, for as long as you iterate. A dropped
        stream is resumed with `Last-Event-ID`: no gap, no repeat. `until` (a
        `time.monotonic()` value) ends the iteration then, even on an idle stream."""
        for sse in self.messages(since, job_id=job_id, prompt_id=prompt_id, until=until):
            event = state_event(sse)
            if event is not None:
                yield event

    def messages(
        self,
        since: str | None = None,
        *,
        job_id: str | None = None,
        prompt_id: str | None = None,
        until: float | None = None,
    ) -> Iterator[ServerSentEvent]:
        """Every event of `GET /v1/events` (state changes, output, resets, usage, done), as
        `events()` reads them: resumed across drops with no gap and no repeat. A stream of
        one job (`job_id`) ends when the server ends it after the job is over."""
        cursor = since
        retry = 0
        end = JobStreamEnd(job_id)
        while until is None or time.monotonic() < until:
            headers = sse_headers({"Last-Event-ID": cursor} if cursor is not None else {})
            params = sse_params(None if cursor is not None else since, job_id, prompt_id)
            # The server pings an idle stream every few seconds; silence this long is a dead
            # link (and a deadline is checked at least this often).
            read = (
                SILENT_STREAM_S
                if until is None
                else max(0.1, min(SILENT_STREAM_S, until - time.monotonic()))
            )
            timeout = httpx2.Timeout(self._http.timeout.connect, read=read)
            try:
                with self._http.stream(
                    "GET", "/v1/events", params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        response.read()
                        wait = self.retry_policy.delay(retry, response)
                        if wait is None:
                            raise api_error(response)
                        time.sleep(wait)
                        retry += 1
                        continue
                    if response.is_error:
                        response.read()
                    problem = stream_problem(response)
                    if problem is not None:
                        raise problem
                    decoder = EventDecoder()
                    # Line by line rather than iter_sse(): keep-alive comments are lines too,
                    # so a deadline is noticed on an idle stream.
                    for line in response.iter_lines():
                        if until is not None and time.monotonic() >= until:
                            return
                        sse = decoder.line(line)
                        if sse is None or not sse.id:
                            continue
                        retry = 0
                        cursor = sse.id
                        end.saw(sse)
                        yield sse
                    if end.over:
                        return  # the server ends a job's stream once the job is over
            except httpx2.TransportError as err:
                if until is not None and time.monotonic() >= until:
                    return
                wait = self.retry_policy.delay(retry, None)
                if wait is None:
                    raise unreachable(self.base_url, err) from err
                time.sleep(wait)
                retry += 1
            # The server ended the stream (shutdown, stream lifetime): resume where we were.


@dataclass
class Job:
    """A job, by id; each method asks the API."""

    client: PromptJobs
    id: str
    prompt_id: str | None = None

    def get(self) -> JobOut:
        return self.client.get_job(self.id)

    def events(self, *, until: float | None = None) -> Iterator[JobOut]:
        """This job's state changes (each the row after it), from its first, until the job
        is over (its `job.done`: settled, with its last attempt's text and usage in), or
        `until` passes."""
        for sse in self.client.messages("0", job_id=self.id, until=until):
            event = state_event(sse)
            if event is not None:
                yield event.job
            if final_row(sse) is not None:
                return

    def stream(self, *, until: float | None = None) -> Iterator[OutputChunk | OutputReset]:
        """The job's text as it is produced, from its start, until the job is over (its
        `job.done`: a cancelled call's last words come after the cancel): each `OutputChunk`
        goes on from where the last ended (`offset`), and carries the tool calls so far
        whenever they grew (`tool_calls`, each whole: keep the latest); an `OutputReset`
        means a new attempt starts over, so drop what you have. Over SSE, resumed across
        drops."""
        for sse in self.client.messages("0", job_id=self.id, until=until):
            piece = output_piece(sse)
            if piece is not None:
                yield piece
            if final_row(sse) is not None:
                return

    def wait(self, timeout: float | None = None) -> JobOut:
        """Block until the job is settled and return it. Follows the job over SSE (resuming
        across disconnects), or by polling where no stream can be had. Raises `WaitTimeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = self.get()
        if is_terminal(last):
            return last
        try:
            for sse in self.client.messages("0", job_id=self.id, until=deadline):
                last = job_row(sse) or last
                if final_row(sse) is not None:
                    return last
        except (StreamUnavailable, APIConnectionError):
            return self._poll(deadline, timeout)
        if is_terminal(last):
            return last
        raise WaitTimeout(self.id, timeout or 0.0, last)

    def _poll(self, deadline: float | None, timeout: float | None) -> JobOut:
        while True:
            last = self.get()
            if is_terminal(last):
                return last
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(self.id, timeout or 0.0, last)
            time.sleep(self.client.poll_interval_s)

    def cancel(self) -> JobOut:
        return self.client.cancel(self.id)

    def retry(
        self,
        *,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> Job:
        return self.client.retry(
            self.id, options=options, priority=priority, max_attempts=max_attempts
        )

    def output(self, since: int = 0) -> OutputOut:
        """What the current attempt has streamed so far, from character `since` on."""
        return self.client.output(self.id, since)

    def attempts(self) -> list[AttemptOut]:
        return self.client.attempts(self.id)

    def response(self) -> ResponseOut:
        """The response of a succeeded job; an `APIError` 409 `not_succeeded` otherwise."""
        job = self.get()
        if job.response_id is None:
            raise APIError(
                409, "not_succeeded", f"job {self.id} is {job.state.value}: no response", None
            )
        return self.client.response(job.response_id)


# -- async ---------------------------------------------------------------------------------


class AsyncPromptJobs:
    """The promptjobs API for asyncio; the same calls as `PromptJobs`, awaited."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        poll_interval_s: float = 1.0,
    ) -> None:
        self.base_url, headers = connection_settings(base_url, api_key)
        self.retry_policy = retry or RetryPolicy()
        self.poll_interval_s = poll_interval_s
        self._http = httpx2.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPromptJobs:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, call: Call) -> httpx2.Response:
        retry = 0
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, params=call.params, json=call.json, headers=call.headers
                )
            except httpx2.TransportError as err:
                if not (call.replayable or isinstance(err, httpx2.ConnectError)):
                    raise unreachable(self.base_url, err) from err
                wait = self.retry_policy.delay(retry, None)
                if wait is None:
                    raise unreachable(self.base_url, err) from err
            else:
                if response.status_code not in RETRY_STATUSES:
                    return response
                wait = self.retry_policy.delay(retry, response)
                if wait is None:
                    raise api_error(response)
            await asyncio.sleep(wait)
            retry += 1

    async def submit(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        output_schema: type[BaseModel] | Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        scheduled_for: datetime | None = None,
        parent_id: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
        after: Sequence[str] = (),
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> AsyncJob:
        call = submit_call(
            prompt,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice,
            output_schema=output_schema,
            options=options,
            priority=priority,
            max_attempts=max_attempts,
            scheduled_for=scheduled_for,
            parent_id=parent_id,
            correlation_id=correlation_id,
            idempotency_key=idempotency_key,
            after=after,
            webhook=webhook,
            webhook_events=webhook_events,
        )
        accepted = parsed(await self._send(call), Accepted)
        return AsyncJob(self, accepted.job_id, accepted.prompt_id)

    def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, job_id)

    async def get_job(self, job_id: str) -> JobOut:
        return parsed(await self._send(Call("GET", f"/v1/jobs/{job_id}")), JobOut)

    async def prompt(self, prompt_id: str) -> PromptOut:
        return parsed(await self._send(Call("GET", f"/v1/prompts/{prompt_id}")), PromptOut)

    async def prompts(self, *, page_size: int = 50) -> AsyncIterator[PromptOut]:
        params = {"limit": str(page_size)}
        while True:
            call = Call("GET", "/v1/prompts", params=dict(params))
            page = parsed(await self._send(call), PromptList)
            for prompt in page.prompts:
                yield prompt
            if page.next_before is None:
                return
            params["before"] = page.next_before

    async def response(self, response_id: str) -> ResponseOut:
        return parsed(await self._send(Call("GET", f"/v1/responses/{response_id}")), ResponseOut)

    async def output(self, job_id: str, since: int = 0) -> OutputOut:
        return parsed(await self._send(output_call(job_id, since)), OutputOut)

    async def attempts(self, job_id: str) -> list[AttemptOut]:
        return parsed(await self._send(attempts_call(job_id)), AttemptList).attempts

    async def cancel(self, job_id: str) -> JobOut:
        return parsed(await self._send(action_call(job_id, "cancel")), JobOut)

    async def retry(
        self,
        job_id: str,
        *,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> AsyncJob:
        call = retry_call(job_id, options=options, priority=priority, max_attempts=max_attempts)
        new = parsed(await self._send(call), JobOut)
        return AsyncJob(self, new.job_id, new.prompt_id)

    async def changes(
        self, since: str = "0", *, state: JobState | None = None, limit: int = 100
    ) -> AsyncIterator[JobList]:
        while True:
            params = {"since": since, "limit": str(limit)}
            if state is not None:
                params["state"] = JobState(state).value
            page = parsed(await self._send(Call("GET", "/v1/jobs", params=params)), JobList)
            if not page.jobs:
                return
            yield page
            since = page.next_cursor

    async def events(
        self,
        since: str | None = None,
        *,
        job_id: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """As `PromptJobs.events`; bound the wait with `asyncio.timeout` around the loop."""
        async for sse in self.messages(since, job_id=job_id, prompt_id=prompt_id):
            event = state_event(sse)
            if event is not None:
                yield event

    async def messages(
        self,
        since: str | None = None,
        *,
        job_id: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """As `PromptJobs.messages`."""
        cursor = since
        retry = 0
        end = JobStreamEnd(job_id)
        while True:
            headers = sse_headers({"Last-Event-ID": cursor} if cursor is not None else {})
            params = sse_params(None if cursor is not None else since, job_id, prompt_id)
            # The server pings an idle stream every few seconds; silence this long is a dead
            # link, dropped and resumed like any other.
            timeout = httpx2.Timeout(self._http.timeout.connect, read=SILENT_STREAM_S)
            try:
                async with self._http.stream(
                    "GET", "/v1/events", params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        await response.aread()
                        wait = self.retry_policy.delay(retry, response)
                        if wait is None:
                            raise api_error(response)
                        await asyncio.sleep(wait)
                        retry += 1
                        continue
                    if response.is_error:
                        await response.aread()
                    problem = stream_problem(response)
                    if problem is not None:
                        raise problem
                    async for sse in httpx2.EventSource(response):
                        if not sse.id:
                            continue
                        retry = 0
                        cursor = sse.id
                        end.saw(sse)
                        yield sse
                    if end.over:
                        return  # the server ends a job's stream once the job is over
            except httpx2.TransportError as err:
                wait = self.retry_policy.delay(retry, None)
                if wait is None:
                    raise unreachable(self.base_url, err) from err
                await asyncio.sleep(wait)
                retry += 1


@dataclass
class AsyncJob:
    """A job, by id, for asyncio."""

    client: AsyncPromptJobs
    id: str
    prompt_id: str | None = None

    async def get(self) -> JobOut:
        return await self.client.get_job(self.id)

    async def events(self) -> AsyncIterator[JobOut]:
        """As `Job.events`."""
        async for sse in self.client.messages("0", job_id=self.id):
            event = state_event(sse)
            if event is not None:
                yield event.job
            if final_row(sse) is not None:
                return

    async def stream(self) -> AsyncIterator[OutputChunk | OutputReset]:
        """As `Job.stream`."""
        async for sse in self.client.messages("0", job_id=self.id):
            piece = output_piece(sse)
            if piece is not None:
                yield piece
            if final_row(sse) is not None:
                return

    async def wait(self, timeout: float | None = None) -> JobOut:
        last = await self.get()
        if is_terminal(last):
            return last
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    async for sse in self.client.messages("0", job_id=self.id):
                        last = job_row(sse) or last
                        if final_row(sse) is not None:
                            break
                    return last
                except (StreamUnavailable, APIConnectionError):
                    pass
                # No stream to be had: poll.
                while True:
                    last = await self.get()
                    if is_terminal(last):
                        return last
                    await asyncio.sleep(self.client.poll_interval_s)
        except TimeoutError as err:
            raise WaitTimeout(self.id, timeout or 0.0, last) from err

    async def cancel(self) -> JobOut:
        return await self.client.cancel(self.id)

    async def retry(
        self,
        *,
        options: Mapping[str, Any] | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> AsyncJob:
        return await self.client.retry(
            self.id, options=options, priority=priority, max_attempts=max_attempts
        )

    async def output(self, since: int = 0) -> OutputOut:
        return await self.client.output(self.id, since)

    async def attempts(self) -> list[AttemptOut]:
        return await self.client.attempts(self.id)

    async def response(self) -> ResponseOut:
        job = await self.get()
        if job.response_id is None:
            raise APIError(
                409, "not_succeeded", f"job {self.id} is {job.state.value}: no response", None
            )
        return await self.client.response(job.response_id)
