"""Files uploaded through OpenAI's Files API, kept in the projection database in chunks of
CHUNK_BYTES: any API process can serve one, and none holds one whole (a batch's 50,000-line
input is read a chunk at a time)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import IO, Any

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from projections.domain.errors import Refused
from projections.errors import NotFound
from projections.event_log import utcnow
from projections.group_commit import GroupCommit, WriteTx
from projections.models import Base, FileChunk, StoredFile
from projections.scope import Scope, get_visible, newest_first, scoped

CHUNK_BYTES = 1 << 20
# Chunks one write transaction inserts: a large file is written in several, so no one
# transaction holds SQLite's write lock for long; the file row comes last, so a reader never
# sees a file whose content is not all there.
CHUNKS_PER_WRITE = 8

FILES = Base.metadata.tables[StoredFile.__tablename__]
CHUNKS = Base.metadata.tables[FileChunk.__tablename__]


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileTooLarge(Refused):
    code = "file_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is over {limit:,} bytes")
        self.limit = limit


class OrgStorageFull(Refused):
    """The org's files would take more than its storage quota."""

    code = "storage_quota_exceeded"

    def __init__(self, quota: int, used: int) -> None:
        super().__init__(f"the org's files take {used:,} of its {quota:,} bytes")
        self.quota = quota
        self.used = used


class FileStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], writes: GroupCommit) -> None:
        self.sessions = sessions
        self.writes = writes

    async def create(
        self,
        scope: Scope,
        *,
        purpose: str,
        filename: str,
        source: IO[bytes],
        max_bytes: int,
        org_quota: int | None = None,
        file_id: str | None = None,
    ) -> StoredFile:
        """Store what `source` holds (read a chunk at a time) as a new file of the caller's;
        within `org_quota`, the bytes the org's files may take together (OrgStorageFull past
        it: uploads at the same moment may each pass, so the org may overshoot by them)."""
        file_id = file_id or new_file_id()
        if org_quota is not None:
            used = await self.used(scope.org)
            if used >= org_quota:
                raise OrgStorageFull(org_quota, used)
            try:
                return await self.write(
                    scope,
                    file_id,
                    purpose,
                    filename,
                    _read(source),
                    min(max_bytes, org_quota - used),
                )
            except FileTooLarge as err:
                if err.limit < max_bytes:
                    raise OrgStorageFull(org_quota, used) from err
                raise
        return await self.write(scope, file_id, purpose, filename, _read(source), max_bytes)

    async def used(self, org: str) -> int:
        """The bytes the org's files take."""
        async with self.sessions() as session:
            total = await session.scalar(
                select(func.coalesce(func.sum(StoredFile.bytes), 0)).where(StoredFile.org == org)
            )
        return int(total or 0)

    async def write(
        self,
        scope: Scope,
        file_id: str,
        purpose: str,
        filename: str,
        chunks: AsyncIterator[bytes],
        max_bytes: int | None = None,
    ) -> StoredFile:
        """Store `chunks` (each at most CHUNK_BYTES) as the file `file_id`."""
        size = seq = 0
        try:
            while True:
                part: list[bytes] = []
                async for chunk in chunks:
                    part.append(chunk)
                    if len(part) == CHUNKS_PER_WRITE:
                        break
                if not part:
                    break
                size += sum(len(chunk) for chunk in part)
                if max_bytes is not None and size > max_bytes:
                    raise FileTooLarge(max_bytes)
                rows = [
                    {"file_id": file_id, "seq": seq + i, "data": chunk}
                    for i, chunk in enumerate(part)
                ]
                seq += len(part)
                await self.writes.run(partial(_insert, table=CHUNKS, rows=rows))
            row = {
                "file_id": file_id,
                "org": scope.org,
                "author": scope.user,
                "purpose": purpose,
                "filename": filename,
                "bytes": size,
                "created_at": utcnow(),
            }
            await self.writes.run(partial(_insert, table=FILES, rows=[row]))
        except BaseException:
            await self.writes.run(lambda tx: _remove(tx, file_id))
            raise
        return StoredFile(**row)

    async def get(self, scope: Scope, file_id: str) -> StoredFile:
        async with self.sessions() as session:
            return await get_visible(session, StoredFile, "file", file_id, scope)

    async def content(self, scope: Scope, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, a chunk at a time (one read each). A file deleted while it is
        read raises NotFound rather than ending early, as if it were whole."""
        stored = await self.get(scope, file_id)
        seq = size = 0
        while True:
            async with self.sessions() as session:
                data = await session.scalar(
                    select(CHUNKS.c.data).where(CHUNKS.c.file_id == file_id, CHUNKS.c.seq == seq)
                )
            if data is None:
                if size < stored.bytes:
                    raise NotFound("file", file_id)
                return
            size += len(data)
            yield bytes(data)
            seq += 1

    async def lines(
        self, scope: Scope, file_id: str, max_line_bytes: int
    ) -> AsyncIterator[bytes | None]:
        """The file's lines (without their line breaks), read a chunk at a time. A line
        longer than `max_line_bytes` is not held: it comes as None."""
        rest = b""
        overlong = False
        async for chunk in self.content(scope, file_id):
            *whole, tail = chunk.split(b"\n")
            for part in whole:
                if overlong or len(rest) + len(part) > max_line_bytes:
                    yield None
                else:
                    yield (rest + part).rstrip(b"\r")
                rest, overlong = b"", False
            if overlong or len(rest) + len(tail) > max_line_bytes:
                rest, overlong = b"", True
            else:
                rest += tail
        if overlong:
            yield None
        elif rest.strip():
            yield rest.rstrip(b"\r")

    async def page(
        self,
        scope: Scope,
        *,
        limit: int,
        after: str | None,
        purpose: str | None,
        oldest_first: bool = False,
    ) -> list[StoredFile]:
        """The caller's files, newest first (or oldest); `after`: those past that file."""
        stmt = scoped(select(StoredFile), StoredFile, scope)
        if purpose is not None:
            stmt = stmt.where(StoredFile.purpose == purpose)
        anchor = await self.get(scope, after) if after is not None else None
        stmt = newest_first(
            stmt, StoredFile.created_at, StoredFile.file_id, anchor, oldest=oldest_first
        ).limit(limit)
        async with self.sessions() as session:
            return list((await session.execute(stmt)).scalars())

    async def delete(self, scope: Scope, file_id: str) -> None:
        await self.get(scope, file_id)
        await self.writes.run(lambda tx: _remove(tx, file_id))


def _insert(tx: WriteTx, table: Table, rows: list[dict[str, Any]]) -> None:
    tx.conn.execute(insert(table), rows)


def _remove(tx: WriteTx, file_id: str) -> None:
    tx.execute(delete(CHUNKS).where(CHUNKS.c.file_id == file_id))
    tx.execute(delete(FILES).where(FILES.c.file_id == file_id))


async def _read(source: IO[bytes]) -> AsyncIterator[bytes]:
    """A spooled upload, read a chunk at a time (off the event loop: it may be on disk)."""
    while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
        yield chunk
