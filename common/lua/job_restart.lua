-- A redelivered job that cannot be continued starts over (common/continuation.py says when): its
-- records' text is reset and a `restart` event logged, to it (unless it is a carrier) and to its
-- live followers, in one step, so readers of either never see two runs mixed; the new run's
-- chunks count from 0. Only the attempt that holds the job may.
-- KEYS: job. ARGV: the job layout (job_keys), then job id, attempt, job ttl, log maxlen, reason.
-- Returns 1 if restarted, 0 if this attempt no longer holds the job.
--#include job_keys
--#include coalescing_lib
--#include token_log_lib
local job_id, attempt, ttl, maxlen, reason = unpack(ARGV, 6, 10)
if redis.call('HGET', KEYS[1], 'attempts') ~= attempt then return 0 end
local carrier = is_carrier(KEYS[1])
if redis.call('HGET', KEYS[1], 'status') ~= 'running' and not carrier then return 0 end
redis.call('HSET', KEYS[1], 'chunks_written', 0)
local targets = live_followers(KEYS[1])
if not carrier then table.insert(targets, 1, job_id) end
local restart = cjson.encode({attempt = tonumber(attempt), reason = reason})
for _, id in ipairs(targets) do
  local key = JOB .. id
  redis.call('HSET', key, 'text', '', 'completion_tokens', '0')
  log_event(key, maxlen, ttl, 'restart', restart)
end
return 1
