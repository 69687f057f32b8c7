-- A chunk of one attempt: written only while that attempt still owns the running job, so a worker
-- that was given up on (and replaced) never interleaves its tokens with the new attempt's. Written
-- to the job (unless it is a carrier) and to each of its running followers. Idempotent by chunk
-- index: an index already written (the reply to that write was lost) is refused, never logged
-- twice. The entry also keeps the chunk's token ids and, on the last chunk of a finished
-- generation, its finish reason (not announced: they are for the attempt that may continue the
-- job, common/continuation.py).
-- KEYS: job. ARGV: the job layout (job_keys), then attempt, event, data, log maxlen, ttl,
-- chunk index ('' for none), token ids ('' for none), finish reason ('' for none), then record
-- fields to set.
-- Returns a `ChunkWrite` (common/token_log.py): 0 superseded or ended, 1 written, 2 already
-- written, 3 written and a cancel was asked for.
--#include job_keys
--#include coalescing_lib
--#include token_log_lib
local attempt, event, data, maxlen, ttl = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local index, ids, ended = tonumber(ARGV[11]), ARGV[12], ARGV[13]
if redis.call('HGET', KEYS[1], 'attempts') ~= attempt then return 0 end
local running = redis.call('HGET', KEYS[1], 'status') == 'running'
if not running and not is_carrier(KEYS[1]) then return 0 end
if index then
  if index < tonumber(redis.call('HGET', KEYS[1], 'chunks_written') or '0') then return 2 end
  redis.call('HSET', KEYS[1], 'chunks_written', index + 1)
end
local extra = {}
if ids ~= '' then table.insert(extra, 'ids'); table.insert(extra, ids) end
if ended ~= '' then table.insert(extra, 'end'); table.insert(extra, ended) end
local targets = {}
if running then table.insert(targets, KEYS[1]) end
for _, f in ipairs(followers_of(KEYS[1])) do
  if redis.call('HGET', JOB .. f, 'status') == 'running' then table.insert(targets, JOB .. f) end
end
for _, key in ipairs(targets) do
  if #ARGV > 13 then redis.call('HSET', key, unpack(ARGV, 14)) end
  log_event(key, maxlen, ttl, event, data, extra)
end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 3 end
return 1
