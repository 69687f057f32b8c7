"""Where a redelivered job's answer stands, read from its token log, so that the new attempt
continues it instead of starting over.

The log is the truth: its chunks are what clients received. The chunks of the job's run (those
after its last `restart`) each keep the token ids their text came from (common/token_log.py),
so the new attempt gives the engine the prompt followed by those ids, `max_tokens` less what
they used, and the text already sent; its chunks carry on the numbering. A log that cannot say
exactly where the answer stands (trimmed by its length cap, chunks written without token ids)
raises `CannotContinue`, and the job starts over with a `restart` event, as does a carrier
(its own log stops where its client left) and an answer the engine cannot continue
(docs/reliability.md lists the cases).
"""
from __future__ import annotations

import json
from typing import NamedTuple


class CannotContinue(Exception):
    """This redelivered job must start over; the message says why (it goes into `restart`)."""


class Continuation(NamedTuple):
    text: str  # what the clients received
    token_ids: tuple[int, ...]  # the tokens it came from
    chunks: int  # the chunks it came in: the next one's index
    ended: str | None = None  # the finish reason, when the lost attempt had finished generating
    logprobs: tuple[dict, ...] = ()  # their logprobs entries, when the job asked for them


NOTHING = Continuation("", (), 0)


def read_continuation(entries: list[dict[str, str]], chunks_written: int) -> Continuation:
    """The run's answer so far from a log's entries (`TokenLog.read_entries`) and the record's
    count of the run's chunks; `CannotContinue` when the log does not hold all of them."""
    restarts = [i for i, entry in enumerate(entries) if entry.get("event") == "restart"]
    run = entries[restarts[-1] + 1:] if restarts else entries
    chunks = [entry for entry in run if entry.get("event") == "chunk"]
    if len(chunks) != chunks_written:
        raise CannotContinue(f"the log holds {len(chunks)} of the run's {chunks_written} chunks "
                             "(trimmed, or written elsewhere)")
    text, ids, ended, logprobs = [], [], None, []
    for index, entry in enumerate(chunks):
        data = json.loads(entry["data"])
        if data.get("index") != index or "ids" not in entry:
            raise CannotContinue("the log's chunks do not say which tokens they came from")
        text.append(data["text"])
        logprobs += data.get("logprobs", ())
        ids += [int(i) for i in entry["ids"].split(",") if i]
        ended = entry.get("end") or None
    return Continuation("".join(text), tuple(ids), len(chunks), ended, tuple(logprobs))
