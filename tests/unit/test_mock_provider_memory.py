"""The mock provider keeps a bounded memory however many distinct prompts it sees (issue 22,
item 15): a long soak against it must not grow the process without end."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from promptjobs import mock_provider
from promptjobs.mock_provider import ChatCall, MockProvider, Script


def call(prompt: str) -> ChatCall:
    return ChatCall("openai", "gpt", prompt, None, None, None)


def test_requests_per_prompt_are_counted_and_the_oldest_keys_forgotten(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(mock_provider, "SEEN_KEYS", 100)
    mock = MockProvider()
    assert [mock.plan(call("again"))[0] for _ in range(3)] == [1, 2, 3]
    for i in range(1_000):
        mock.plan(call(f"soak {i}"))
    assert len(mock.seen) == 100
    # The key seen most recently is remembered; the first of the soak is gone.
    assert mock.plan(call("soak 999"))[0] == 2
    assert mock.plan(call("soak 0"))[0] == 1


def test_the_key_of_a_long_prompt_is_short() -> None:
    assert len(call("x" * 100_000).key) == 32
    assert call("a").key != call("b").key


def test_a_script_cannot_ask_for_an_unbounded_answer() -> None:
    # A streamed answer is made a chunk at a time, but its words are held whole.
    assert Script.parse("chunks=100000;chunk_ms=100").chunks == 100_000
    with pytest.raises(ValidationError, match="chunks"):
        Script.parse("chunks=100001")
