"""Coalescing: an identical deterministic request that arrives while the same one is queued or
running attaches to it instead of generating twice.

Each request still gets a job of its own (id, record, token log, done event, owner), so polling,
SSE, `Last-Event-ID`, cancel and ownership work exactly as for any job. Only the generation is
shared: the first job (the *primary*) is queued and run; later identical ones are *followers*,
listed in the primary's followers set. The worker writes every chunk, the start, a restart and the
end to the primary and to each follower in the same Lua script (common/lua/job_*.lua), so
all of them see the same tokens. A follower that attaches while the primary runs gets a copy of
the log so far, in the same script that attaches it.

Cancelling is per job, with the generation reference-counted:
- a follower's cancel detaches it (its log ends with `done: cancelled`); the others go on;
- a queued primary's cancel hands its place in the queue to its first follower (promotion);
- a running primary's cancel ends the primary for its client (`done: cancelled`) but, while
  followers remain, the generation goes on for them (the primary is *detached*: a carrier);
  when the last follower leaves a carrier, the worker is asked to stop.

The request digest (model + prompt token ids + sampling, the result-cache key) names the primary
in `inflight:<digest>` while it is queued or running. Two identical requests admitted in the same
instant may both become primaries: that costs a duplicate generation, never a wrong answer.

The steps above are Lua (common/lua/coalescing_lib.lua and the job scripts that use it), run by
`JobStore` (common/jobs.py): `attach`, `start`, `cancel`, `finish`, `expire_if_overdue`.
"""
