"""Files in the projection database: written and read a chunk at a time, split into lines
across chunk boundaries, with a line too long to hold skipped rather than read."""

from __future__ import annotations

import io

import pytest

from projections import files
from projections.errors import NotFound
from projections.scope import Scope
from promptjobs.runtime import Projection

# The database is what these tests are about: each runs on SQLite and on PostgreSQL.
BOTH_DATABASES = True

OWNER = Scope("acme", "alice")


async def test_lines_come_whole_across_chunk_boundaries(
    projection: Projection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 7)  # every line crosses a boundary
    lines = [f"line {i} " + "x" * (i % 13) for i in range(100)]
    content = ("\r\n".join(lines) + "\n").encode()
    store = projection.store.files
    stored = await store.create(
        OWNER, purpose="batch", filename="in.jsonl", source=io.BytesIO(content), max_bytes=10**6
    )
    assert stored.bytes == len(content)
    assert b"".join([chunk async for chunk in store.content(OWNER, stored.file_id)]) == content
    read = [line async for line in store.lines(OWNER, stored.file_id, max_line_bytes=100)]
    assert read == [line.encode() for line in lines]


async def test_a_line_over_the_limit_comes_as_none(
    projection: Projection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 5)
    content = b"short\n" + b"y" * 50 + b"\nafter\n" + b"z" * 30
    store = projection.store.files
    stored = await store.create(
        OWNER, purpose="batch", filename="in.jsonl", source=io.BytesIO(content), max_bytes=10**6
    )
    read = [line async for line in store.lines(OWNER, stored.file_id, max_line_bytes=20)]
    assert read == [b"short", None, b"after", None]


async def test_a_file_over_its_limit_is_refused_and_leaves_nothing(
    projection: Projection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 4)
    store = projection.store.files
    with pytest.raises(files.FileTooLarge):
        await store.create(
            OWNER, purpose="batch", filename="big", source=io.BytesIO(b"x" * 100), max_bytes=50
        )
    assert await store.page(OWNER, limit=10, after=None, purpose=None) == []


async def test_a_file_deleted_while_it_is_read_is_not_found_rather_than_short(
    projection: Projection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 4)
    store = projection.store.files
    stored = await store.create(
        OWNER, purpose="batch", filename="in", source=io.BytesIO(b"a\nb\nc\nd\n" * 4), max_bytes=99
    )
    chunks = store.content(OWNER, stored.file_id)
    assert await anext(chunks) == b"a\nb\n"
    await store.delete(OWNER, stored.file_id)
    with pytest.raises(NotFound):
        await anext(chunks)
