-- Expire a queued job whose queue deadline has passed (its first follower takes its place).
-- KEYS: job, queued set, deadlines. ARGV: the job layout (job_keys), then job id, now, ttl,
-- error (JSON). Returns 1 if this call expired it, else 0 (and a job no longer queued leaves the
-- deadlines index).
--#include job_keys
--#include coalescing_lib
--#include fair_lib
local job_id, now, ttl, err = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' then
  redis.call('ZREM', KEYS[3], job_id)
  return 0
end
local deadline = tonumber(redis.call('HGET', KEYS[1], 'queue_deadline') or '')
if not deadline or deadline > tonumber(now) then return 0 end
local primary = redis.call('HGET', KEYS[1], 'coalesced_into')
if primary then
  detach_follower(primary, job_id)
elseif not promote(KEYS[1], job_id, KEYS[2]) then
  fair_remove(KEYS[1], job_id)
end
redis.call('HSET', KEYS[1], 'status', 'expired', 'finish_reason', 'timeout', 'finished_at', now,
           'error', err)
redis.call('ZREM', KEYS[2], job_id)
redis.call('ZREM', KEYS[3], job_id)
redis.call('EXPIRE', KEYS[1], ttl)
return 1
