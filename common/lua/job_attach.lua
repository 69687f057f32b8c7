-- Create a new job as a follower of the primary named by the inflight key, if that primary is
-- queued or running and not being cancelled; the follower gets a copy of the log so far.
-- KEYS: inflight, new job, new job's log. ARGV: the job layout (job_keys), then the new job's
-- id, ttl, log maxlen, then its fields. Returns the primary's id, or false.
--#include job_keys
local job_id, ttl, maxlen = ARGV[6], ARGV[7], ARGV[8]
local primary = redis.call('GET', KEYS[1])
if not primary then return false end
local pk = JOB .. primary
local st = redis.call('HGET', pk, 'status')
if (st ~= 'queued' and st ~= 'running') or redis.call('HGET', pk, 'cancel_requested') == '1' then
  return false
end
redis.call('HSET', KEYS[2], unpack(ARGV, 9))
local copied = redis.call('HMGET', pk, 'started_at', 'worker', 'text', 'completion_tokens')
redis.call('HSET', KEYS[2], 'status', st, 'coalesced_into', primary,
           'text', copied[3] or '', 'completion_tokens', copied[4] or '0')
if st == 'running' then
  redis.call('HSET', KEYS[2], 'started_at', copied[1], 'worker', copied[2] or '')
end
redis.call('EXPIRE', KEYS[2], ttl)
for _, entry in ipairs(redis.call('XRANGE', pk .. EVENTS, '-', '+')) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', unpack(entry[2]))
end
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('SADD', pk .. FOLLOWERS, job_id)
redis.call('EXPIRE', pk .. FOLLOWERS, ttl)
return primary
