-- A worker claims a delivered job, for it and its followers. A carrier (a primary whose client
-- cancelled while followers ride on it) is claimed like a running job but its own record is left
-- as it is. A redelivery (the job was running and its lease lapsed) keeps the records' text and
-- log as they are: the new attempt continues from them, or starts over with job_restart.lua.
-- KEYS: job, queued set, lease. ARGV: the job layout (job_keys), then job id, now, worker,
-- max attempts, lease ttl, job ttl.
-- Returns {outcome, attempts}, outcome a `Claimed` (common/jobs.py), or {'ended', 0, status}.
--#include job_keys
--#include coalescing_lib
--#include fair_lib
local job_id, now, worker, max_attempts, lease_ttl, ttl = unpack(ARGV, 6, 11)
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
local targets = live_followers(KEYS[1])
if not carrier then table.insert(targets, 1, job_id) end
for _, id in ipairs(targets) do
  local key = JOB .. id
  redis.call('HSET', key, 'status', 'running', 'worker', worker)
  if st == 'queued' then
    redis.call('HSET', key, 'started_at', now, 'text', '', 'completion_tokens', '0')
  end
  redis.call('EXPIRE', key, ttl)
end
redis.call('SET', KEYS[3], worker, 'EX', lease_ttl)
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'chunks_written', 0)  -- a fresh run's chunks count from 0
  return {'start', attempts}
end
return {'redelivered', attempts}
