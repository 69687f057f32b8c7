"""Uploaded files and batch output files, in Redis (OpenAI's `/v1/files` objects).

Redis is the one store every API process and worker already shares (several API processes on
several hosts, model-less control workers), so files live there too: a metadata hash and the
content as a list of chunks of at most `CHUNK_CHARS` characters (no single huge value to block
Redis or the client), both with a TTL of `file_ttl_s` (`expires_at` in the file object). Each
owner (API key id, or `ANONYMOUS` without auth) has a sorted set of its file ids for listing.
Content is text (JSONL): batch input must be UTF-8, and the output files are written by llmq.
"""
from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from common.keys import Keys
from common.openai_models import File
from common.scheduling.fair_queue import ANONYMOUS

CHUNK_CHARS = 4 * 1024 * 1024
_INT_FIELDS = ("bytes", "created_at", "expires_at", "lines")


def count_lines(content: str, most: int | None = None) -> int:
    """Non-blank lines (as `str.splitlines` splits them): the requests a batch input file holds.
    Counting stops once past `most`. The text is read a megabyte at a time with a pause between
    (`time.sleep(0)`, which under gevent lets the process's other requests run), so a 200 MB
    upload never holds the API's open streams for more than a few milliseconds at once."""
    count, start = 0, 0
    while start < len(content):
        end = content.find("\n", start + _SLICE_CHARS) + 1 or len(content)
        count += sum(1 for _ in _NON_BLANK_LINE.finditer(content, start, end))
        if most is not None and count > most:
            break
        start = end
        time.sleep(0)
    return count


_SLICE_CHARS = 1 << 20
# from a non-blank character to the end of its line (the line breaks of str.splitlines): one
# match per non-blank line
_NON_BLANK_LINE = re.compile(r"\S[^\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]*")


def file_object(meta: dict[str, Any]) -> File:
    """The file as OpenAI's API shows it, from its metadata (`FileStore.get`)."""
    return File(id=meta["id"], object="file", bytes=meta["bytes"], created_at=meta["created_at"],
                filename=meta["filename"], purpose=meta["purpose"], expires_at=meta.get("expires_at"),
                status="processed", status_details=None)



def page_of_index(r: redis.Redis, index: str, get: Callable[[str], dict[str, Any] | None],
                  after: str | None, limit: int, newest_first: bool = True,
                  keep: Callable[[dict[str, Any]], bool] = lambda record: True,
                  ) -> tuple[list[dict[str, Any]], bool]:
    """One page of an owner's index (a sorted set of ids by creation time) as records, starting
    after id `after`; (records, has_more). Ids whose record has expired are dropped from the index
    as they are met. Used by file and batch listings alike."""
    ids = r.zrevrange(index, 0, -1) if newest_first else r.zrange(index, 0, -1)
    if after is not None:
        ids = ids[ids.index(after) + 1:] if after in ids else []
    found: list[dict[str, Any]] = []
    for object_id in ids:
        record = get(object_id)
        if record is None:
            r.zrem(index, object_id)
        elif keep(record):
            if len(found) == limit:
                return found, True
            found.append(record)
    return found, False

class FileStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int):
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s

    def create(self, owner: str | None, filename: str, purpose: str, content: str,
               file_id: str | None = None, lines: int | None = None) -> dict[str, Any]:
        """Store a file whole (MULTI/EXEC: readers never see half of it). Giving `file_id` makes
        the write idempotent: writing the same id again replaces the file (batch outputs).
        `lines`: its `count_lines`, where the caller has counted them already."""
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        owner = owner or ANONYMOUS
        now = int(time.time())
        meta = {"id": file_id, "bytes": len(content.encode()), "created_at": now, "filename": filename,
                "purpose": purpose, "expires_at": now + self.ttl_s, "owner": owner,
                "lines": count_lines(content) if lines is None else lines}
        data_key = self.keys.file_data(file_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(data_key)
        for start in range(0, len(content), CHUNK_CHARS):
            pipe.rpush(data_key, content[start:start + CHUNK_CHARS])
        pipe.expire(data_key, self.ttl_s)
        pipe.delete(self.keys.file(file_id))
        pipe.hset(self.keys.file(file_id), mapping=meta)
        pipe.expire(self.keys.file(file_id), self.ttl_s)
        pipe.zadd(self.keys.files_of(owner), {file_id: now})
        pipe.expire(self.keys.files_of(owner), self.ttl_s)
        pipe.execute()
        return meta

    def get(self, file_id: str) -> dict[str, Any] | None:
        """The file's metadata (with `owner`), or None when unknown, deleted or expired."""
        raw = self.r.hgetall(self.keys.file(file_id))
        if not raw:
            return None
        return {k: int(v) if k in _INT_FIELDS else v for k, v in raw.items()}

    def content(self, file_id: str) -> str | None:
        chunks = self.r.lrange(self.keys.file_data(file_id), 0, -1)
        if not chunks and not self.r.exists(self.keys.file(file_id)):
            return None
        return "".join(chunks)

    def delete(self, file_id: str) -> bool:
        meta = self.get(file_id)
        if meta is None:
            return False
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self.keys.file(file_id), self.keys.file_data(file_id))
        pipe.zrem(self.keys.files_of(meta["owner"]), file_id)
        pipe.execute()
        return True

    def list(self, owner: str | None, purpose: str | None = None, after: str | None = None,
             limit: int = 10000, newest_first: bool = True) -> tuple[list[dict[str, Any]], bool]:
        """An owner's files in creation order, starting after file `after`; (files, has_more).
        Ids of expired files are dropped from the index as they are met."""
        return page_of_index(self.r, self.keys.files_of(owner or ANONYMOUS), self.get, after, limit,
                             newest_first, keep=lambda meta: purpose is None or meta["purpose"] == purpose)
