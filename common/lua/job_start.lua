-- A worker claims a delivered job, for it and its followers. A carrier (a primary whose client
-- cancelled while followers ride on it) is claimed like a running job but its own record is left
-- as it is. A restart resets the records' text and logs a `restart` event in the same step.
-- KEYS: job, queued set, lease, log. ARGV: the job layout (job_keys), then job id, now, worker,
-- max attempts, lease ttl, job ttl, log maxlen.
-- Returns {outcome, attempts}, outcome a `Claimed` (common/jobs.py), or {'ended', 0, status}.
--#include job_keys
--#include coalescing_lib
--#include fair_lib
--#include token_log_lib
local job_id, now, worker, max_attempts, lease_ttl, ttl, maxlen = unpack(ARGV, 6, 12)
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', 0} end
local carrier = is_carrier(KEYS[1])
if st ~= 'queued' and st ~= 'running' and not carrier then
  redis.call('ZREM', KEYS[2], job_id)
  return {'ended', 0, st}
end
if (st == 'running' or carrier) and redis.call('EXISTS', KEYS[3]) == 1 then
  return {'duplicate', tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')}
end
redis.call('ZREM', KEYS[2], job_id)
if st == 'queued' then fair_remove(KEYS[1], job_id) end  -- normally already picked; not when run directly
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {'cancel', attempts} end
local preempted = tonumber(redis.call('HGET', KEYS[1], 'preemptions') or '0')  -- job_requeue.lua
if attempts - preempted > tonumber(max_attempts) then return {'poison', attempts} end
redis.call('HSET', KEYS[1], 'chunks_written', 0)  -- this attempt's chunks count from 0
local targets = live_followers(KEYS[1])
if not carrier then table.insert(targets, 1, job_id) end
local restart = cjson.encode({attempt = attempts, reason = 'the previous attempt lost its worker'})
for _, id in ipairs(targets) do
  local key = JOB .. id
  redis.call('HSET', key, 'status', 'running', 'started_at', now, 'worker', worker,
             'text', '', 'completion_tokens', '0')
  redis.call('EXPIRE', key, ttl)
  if st ~= 'queued' then log_event(key, maxlen, ttl, 'restart', restart) end
end
redis.call('SET', KEYS[3], worker, 'EX', lease_ttl)
if st == 'queued' then return {'start', attempts} end
return {'restart', attempts}
