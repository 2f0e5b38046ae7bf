"""A chat completion's stream, OpenAI's `chat.completion.chunk`s, made from the prompt's event
log: the role first, the text as the job's output events bring it, then at the job's end its
tool calls, the finish reason, the usage (with `stream_options.include_usage`) and `[DONE]`.

Chat Completions has no way to take back text: if an attempt that streamed text is cut and
another begins, the stream ends with an error event (`attempt_restarted`) instead of gluing
two attempts' texts together; the job goes on, and its answer is read whole with
`chat.completions.retrieve(id)` (docs/openai.md). A job that fails or is cancelled ends the
stream with an error event, as OpenAI's own streams do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from api.openai.chat import completion_id, finish_reason_of, usage_of
from api.openai.responses import ERROR_CODES
from api.schemas import tool_calls_out
from projections.domain.lifecycle import EventType, JobState
from projections.models import Job, JobEvent, Prompt, Response
from projections.rows import JobRow

# The succeeded job's row and answer, read when its job.done comes.
Answer = Callable[[JobRow], Awaitable[tuple[Job, Response]]]
DONE: dict[str, Any] = {"done": True}


class ChatChunks:
    """Feed it the prompt's events in log order; it answers the chunks for each."""

    def __init__(self, prompt: Prompt, answer: Answer, *, include_usage: bool) -> None:
        self.prompt = prompt
        self.answer = answer
        self.include_usage = include_usage
        self.model = str((prompt.openai or {}).get("model") or "")
        self.id: str | None = None
        self.created = int(prompt.created_at.timestamp())
        self.attempt: tuple[str, int] | None = None
        self.sent = 0  # characters of text sent
        self.over = False

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    async def feed(self, event: JobEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.over:
            return out
        if self.id is None:
            self.id = completion_id(event.job_id)
            out.append(self._chunk({"role": "assistant", "content": ""}))
        if event.type == EventType.OUTPUT:
            self._text(event.data, out)
        elif event.type == EventType.DONE:
            await self._end(JobRow.model_validate(event.data), out)
        return out

    async def finish(self, row: JobRow) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self.over:
            await self._end(row, out)
        return out

    def _text(self, data: dict[str, Any], out: list[dict[str, Any]]) -> None:
        key = (str(data["job_id"]), int(data["attempt"]))
        if self.attempt is not None and key != self.attempt and self.sent:
            self._error(
                out,
                "attempt_restarted",
                f"attempt {self.attempt[1]} was cut after streaming text and the job runs "
                f"again; read its answer with chat.completions.retrieve({self.id!r}) "
                "(GET /v1/chat/completions/{id}) once it has settled",
            )
            return
        self.attempt = key
        offset, text = int(data["offset"]), str(data["text"])
        if offset + len(text) <= self.sent:
            return  # already sent (an output batch written twice)
        delta = text[max(self.sent - offset, 0) :]
        self.sent += len(delta)
        out.append(self._chunk({"content": delta}))

    async def _end(self, row: JobRow, out: list[dict[str, Any]]) -> None:
        if row.state == JobState.SUPERSEDED:
            return  # its retry's events follow
        if row.state != JobState.SUCCEEDED:
            kind = row.error_kind.value if row.error_kind else row.state.value
            code = ERROR_CODES.get(kind, "server_error")
            self._error(out, code, f"{kind}: {row.error_message or 'the job ' + row.state}")
            return
        job, answer = await self.answer(row)
        if len(answer.text) > self.sent:
            # What the output events did not bring (an answer that streamed nothing).
            out.append(self._chunk({"content": answer.text[self.sent :]}))
        for index, call in enumerate(tool_calls_out(answer.tool_calls) or ()):
            sent = {"index": index, **call.model_dump(mode="json")}
            out.append(self._chunk({"tool_calls": [sent]}))
        out.append(self._chunk({}, finish_reason_of(answer)))
        if self.include_usage:
            out.append({**self._chunk({}), "choices": [], "usage": usage_of(job)})
        out.append(DONE)
        self.over = True

    def _error(self, out: list[dict[str, Any]], code: str, message: str) -> None:
        out.append(
            {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
        )
        self.over = True
