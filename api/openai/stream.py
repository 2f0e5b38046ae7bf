"""A response's event stream, OpenAI's shape, made from the prompt's event log.

The same log always gives the same events with the same `sequence_number`s, so a stream can
be replayed from 0 at any time, by any API process, for as long as the job's events are kept:
a client resumes with `starting_after=N` after a dropped connection or a restarted API.

A new attempt (or a retried job) does not continue the text of one that was cut: the cut
attempt's message item is closed (`response.output_text.done`, `response.content_part.done`,
`response.output_item.done` with `status: "incomplete"`) and the new attempt's text comes in
a new message item, at the next `output_index`. Tool calls stream as they come: each one's
`function_call` item opens with its name (the attempt's text item, if any, closes first), its
arguments follow as `response.function_call_arguments.delta`s, and the items close at the
job's end (a cut attempt's as `incomplete`). The final response's `output` holds only the
answer's items; a client that concatenates every delta would glue attempts together, so join
by `output_index` (as the SDK's own stream helper does) or read `response.completed`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from api.openai.responses import function_call_item, message_id
from projections.domain.lifecycle import EventType, JobState
from projections.models import JobEvent, Prompt
from projections.rows import JobRow

# The response object of the prompt with `row` its current job (with its answer if `final`).
Snapshot = Callable[[JobRow, bool], Awaitable[dict[str, Any]]]


@dataclass
class _Item:
    """One message item: one attempt's text."""

    key: tuple[str, int]  # (job_id, attempt)
    index: int
    item_id: str
    text: list[str] = field(default_factory=list)
    length: int = 0


@dataclass
class _Call:
    """One function_call item: a tool call of one attempt, as far as its arguments were sent."""

    index: int
    item: dict[str, Any]
    sent: int = 0


class ResponseEvents:
    """Feed it the prompt's events in log order; it answers OpenAI's events for each."""

    def __init__(self, prompt: Prompt, snapshot: Snapshot) -> None:
        self.prompt = prompt
        self.snapshot = snapshot
        self.sequence = -1
        self.items = 0
        self.item: _Item | None = None
        # The open function_call items of one attempt ((job_id, attempt)), by call index.
        self.calls_key: tuple[str, int] | None = None
        self.calls: dict[int, _Call] = {}
        self.started = False
        self.running = False
        self.over = False

    async def feed(self, event: JobEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.over:
            return out
        if event.type == EventType.OUTPUT:
            self._output(event.data, out)
        elif event.type == EventType.OUTPUT_RESET:
            self._close(out, status="incomplete")
            self._close_calls(out, status="incomplete")
        elif event.type in (EventType.STATE_CHANGED, EventType.DONE):
            row = JobRow.model_validate(event.data)
            await self._state(row, event.type == EventType.DONE, out)
        return out

    async def finish(self, row: JobRow) -> list[dict[str, Any]]:
        """The end of a job that settled without a job.done (its worker died meanwhile)."""
        out: list[dict[str, Any]] = []
        if not self.over:
            await self._state(row, True, out)
        return out

    def _emit(self, out: list[dict[str, Any]], kind: str, **fields: Any) -> None:
        self.sequence += 1
        out.append({"type": kind, "sequence_number": self.sequence, **fields})

    async def _state(self, row: JobRow, done: bool, out: list[dict[str, Any]]) -> None:
        if not self.started:
            self.started = True
            response = await self.snapshot(row, False)
            self._emit(out, "response.created", response=response)
            self._emit(out, "response.queued", response=response)
        if row.state == JobState.RUNNING and not self.running:
            self.running = True
            self._emit(out, "response.in_progress", response=await self.snapshot(row, False))
        if not done or row.state == JobState.SUPERSEDED:
            return  # a job's settling is final at its job.done (text and usage are in then)
        succeeded = row.state == JobState.SUCCEEDED
        response = await self.snapshot(row, True)
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        if succeeded and self.item is None and not calls and not self.calls:
            # An answer that streamed nothing (an empty text) still has its item.
            self._open(row.job_id, row.attempt, out)
        self._close(out, status="completed" if response["status"] == "completed" else "incomplete")
        if calls:
            # The answer's calls whole: what did not stream yet follows, then each one's end.
            self._grow_calls((row.job_id, row.attempt), calls, out)
        self._close_calls(out, status="completed" if succeeded else "incomplete")
        kind = {
            "completed": "response.completed",
            "incomplete": "response.incomplete",
        }.get(response["status"], "response.failed")
        self._emit(out, kind, response=response)
        self.over = True

    def _output(self, data: dict[str, Any], out: list[dict[str, Any]]) -> None:
        key = (str(data["job_id"]), int(data["attempt"]))
        if data.get("text"):
            self._text(key, int(data["offset"]), str(data["text"]), out)
        if data.get("tool_calls"):
            calls = [
                function_call_item(key[0], key[1], i, call)
                for i, call in enumerate(data["tool_calls"])
            ]
            self._grow_calls(key, calls, out)

    def _text(self, key: tuple[str, int], offset: int, text: str, out: list[Any]) -> None:
        if self.calls_key is not None and self.calls_key != key:
            self._close_calls(out, status="incomplete")
        if self.item is None or self.item.key != key:
            self._close(out, status="incomplete")
            self._open(*key, out)
        item = self.item
        assert item is not None
        if offset + len(text) <= item.length:
            return  # already sent (an output batch written twice)
        delta = text[max(item.length - offset, 0) :]
        item.text.append(delta)
        item.length += len(delta)
        self._emit(
            out,
            "response.output_text.delta",
            item_id=item.item_id,
            output_index=item.index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def _grow_calls(
        self, key: tuple[str, int], items: list[dict[str, Any]], out: list[dict[str, Any]]
    ) -> None:
        """The attempt's function_call items as they stand (each whole, its arguments so far):
        an item not opened yet opens, and the arguments' new text goes out as a delta."""
        if self.calls_key != key:
            self._close_calls(out, status="incomplete")
            self.calls_key = key
        if self.item is not None:
            # The model has moved on from its text to its calls: the text is whole.
            self._close(out, status="completed" if self.item.key == key else "incomplete")
        for i, item in enumerate(items):
            call = self.calls.get(i)
            if call is None:
                call = self.calls[i] = _Call(self.items, item)
                self.items += 1
                self._emit(
                    out,
                    "response.output_item.added",
                    output_index=call.index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
            call.item = item
            arguments = item["arguments"]
            if len(arguments) > call.sent:
                where = {"item_id": item["id"], "output_index": call.index}
                delta = arguments[call.sent :]
                self._emit(out, "response.function_call_arguments.delta", **where, delta=delta)
                call.sent = len(arguments)

    def _close_calls(self, out: list[dict[str, Any]], *, status: str) -> None:
        """The open function_call items end: their arguments whole, then the items."""
        calls, self.calls, self.calls_key = self.calls, {}, None
        for call in calls.values():
            arguments = call.item["arguments"]
            where = {"item_id": call.item["id"], "output_index": call.index}
            self._emit(out, "response.function_call_arguments.done", **where, arguments=arguments)
            item = {**call.item, "status": status}
            self._emit(out, "response.output_item.done", output_index=call.index, item=item)

    def _open(self, job_id: str, attempt: int, out: list[dict[str, Any]]) -> None:
        item_id = message_id(job_id, attempt)
        self.item = _Item((job_id, attempt), self.items, item_id)
        self.items += 1
        self._emit(
            out,
            "response.output_item.added",
            output_index=self.item.index,
            item={
                "type": "message",
                "id": item_id,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        )
        self._emit(
            out,
            "response.content_part.added",
            item_id=item_id,
            output_index=self.item.index,
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": []},
        )

    def _close(self, out: list[dict[str, Any]], *, status: str) -> None:
        item, self.item = self.item, None
        if item is None:
            return
        text = "".join(item.text)
        part = {"type": "output_text", "text": text, "annotations": []}
        where = {"item_id": item.item_id, "output_index": item.index, "content_index": 0}
        self._emit(out, "response.output_text.done", **where, text=text, logprobs=[])
        self._emit(out, "response.content_part.done", **where, part=part)
        self._emit(
            out,
            "response.output_item.done",
            output_index=item.index,
            item={
                "type": "message",
                "id": item.item_id,
                "status": status,
                "role": "assistant",
                "content": [part],
            },
        )
