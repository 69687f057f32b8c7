-- A client's cancel. A follower detaches from its primary; a queued job leaves the queue (its
-- first follower takes its place); a running job with followers ends for its own client while
-- the generation goes on for them (it becomes a carrier); any other running job is asked to stop.
-- KEYS: job, queued set. ARGV: the job layout (job_keys), then job id, now, ttl.
-- Returns {outcome}, a `CancelOutcome` (common/jobs.py), or {'ended', status}.
--#include job_keys
--#include coalescing_lib
--#include fair_lib
local job_id, now, ttl = ARGV[6], ARGV[7], ARGV[8]
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
local primary = redis.call('HGET', KEYS[1], 'coalesced_into')
local function mark_cancelled()
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finish_reason', 'cancelled',
             'finished_at', now, 'cancel_requested', '1')
  redis.call('EXPIRE', KEYS[1], ttl)
end
if primary and (st == 'queued' or st == 'running') then
  detach_follower(primary, job_id)
  mark_cancelled()
  return {'cancelled'}
end
if st == 'queued' then
  if not promote(KEYS[1], job_id, KEYS[2]) then fair_remove(KEYS[1], job_id) end
  redis.call('ZREM', KEYS[2], job_id)
  mark_cancelled()
  return {'cancelled'}
end
if st == 'running' then
  if #live_followers(KEYS[1]) > 0 then
    redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finish_reason', 'cancelled',
               'finished_at', now, 'detached', '1')
    hand_over_inflight(KEYS[1], job_id, false)
    return {'cancelled'}
  end
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return {'cancelling'}
end
return {'ended', st}
