"""Which job runs next, and where; and which models are placed where.

- `fair_queue.py`: which job is next: priority levels, then fair shares between API keys, then
  first come first served (the pick itself is one Lua script: common/lua/fair_pick.lua, with
  fair_lib.lua and affinity_lib.lua).
- `batch_share.py`: how many of a worker's slots batch lines may hold while interactive jobs are
  about, and how many lines beyond that share to preempt.
- `prefix_affinity.py`: which worker starts a job whose prompt start it caches; `free_slots.py`:
  the count of free slots each worker keeps in Redis for the others' picks.
- `picker.py`: a worker's side of the pick: the waits for batch room and for a prefix's holder,
  spare tickets, and the preemption watcher (the job runner calls it).
- `stranded.py`: spare tickets for queued jobs whose own ticket was lost (a failover, a crash
  between a job's creation and its ticket).
- `placement.py`: which catalog models a worker loads and unloads, as a pure decision
  (worker/held_models.py gathers the state and carries it out).
"""
