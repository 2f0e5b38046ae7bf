"""A chat completion's stream, OpenAI's `chat.completion.chunk`s, made from the prompt's event
log: the role first, the text and the tool calls as the job's output events bring them (a
call's id and name in its first chunk, its arguments in pieces after, by `index`), then at
the job's end what had not streamed, the finish reason, the usage (with
`stream_options.include_usage`) and `[DONE]`.

Chat Completions has no way to take back output: if an attempt that streamed some is cut and
another begins, the stream ends with an error event (`attempt_restarted`) instead of gluing
two attempts' texts together; the job goes on, and its answer is read whole with
`chat.completions.retrieve(id)` (docs/openai.md). A job that fails or is cancelled ends the
stream with an error event, as OpenAI's own streams do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from api.openai.chat import completion_id, finish_reason_of, usage_of
from api.openai.responses import ERROR_CODES
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
        self.calls_sent: list[int] = []  # characters of each tool call's arguments sent
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
            self._output(event.data, out)
        elif event.type == EventType.DONE:
            await self._end(JobRow.model_validate(event.data), out)
        return out

    async def finish(self, row: JobRow) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self.over:
            await self._end(row, out)
        return out

    def _output(self, data: dict[str, Any], out: list[dict[str, Any]]) -> None:
        key = (str(data["job_id"]), int(data["attempt"]))
        if self.attempt is not None and key != self.attempt and (self.sent or self.calls_sent):
            self._error(
                out,
                "attempt_restarted",
                f"attempt {self.attempt[1]} was cut after streaming text and the job runs "
                f"again; read its answer with chat.completions.retrieve({self.id!r}) "
                "(GET /v1/chat/completions/{id}) once it has settled",
            )
            return
        self.attempt = key
        self._text(int(data["offset"]), str(data["text"]), out)
        self._calls(data.get("tool_calls") or [], out)

    def _text(self, offset: int, text: str, out: list[dict[str, Any]]) -> None:
        if offset + len(text) <= self.sent:
            return  # already sent (an output batch written twice), or none
        delta = text[max(self.sent - offset, 0) :]
        self.sent += len(delta)
        out.append(self._chunk({"content": delta}))

    def _calls(self, calls: list[dict[str, str]], out: list[dict[str, Any]]) -> None:
        """The attempt's tool calls as they stand (each whole, its arguments so far): a new
        call's first chunk, then each call's new arguments."""
        for index, call in enumerate(calls):
            arguments = call["arguments"]
            if index == len(self.calls_sent):
                self.calls_sent.append(len(arguments))
                function = {"name": call["name"], "arguments": arguments}
                first = {"index": index, "id": call["id"], "type": "function"}
                out.append(self._chunk({"tool_calls": [{**first, "function": function}]}))
            elif len(arguments) > self.calls_sent[index]:
                delta = arguments[self.calls_sent[index] :]
                self.calls_sent[index] = len(arguments)
                piece = {"index": index, "function": {"arguments": delta}}
                out.append(self._chunk({"tool_calls": [piece]}))

    async def _end(self, row: JobRow, out: list[dict[str, Any]]) -> None:
        if row.state == JobState.SUPERSEDED:
            return  # its retry's events follow
        if row.state != JobState.SUCCEEDED:
            kind = row.error_kind.value if row.error_kind else row.state.value
            code = ERROR_CODES.get(kind, "server_error")
            self._error(out, code, f"{kind}: {row.error_message or 'the job ' + row.state}")
            return
        job, answer = await self.answer(row)
        # What the output events did not bring (an answer that streamed nothing, or the
        # rest of its last batch).
        self._text(0, answer.text, out)
        self._calls(answer.tool_calls or [], out)
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
