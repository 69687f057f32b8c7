-- The end of a generation, written to the job (unless it is a carrier) and its live followers.
-- KEYS: job, log, queued set, lease, followers. ARGV: the job layout (job_keys), then job id, ttl,
-- attempt ('' for any), then the terminal fields.
-- Returns {'written', '1' if the job's own log needs its done event, followers that need
-- theirs...}, or {'superseded'} (another attempt owns the job), or {'ended'}, or {'missing'}.
--#include job_keys
--#include coalescing_lib
--#include fair_lib
local job_id, ttl, attempt = ARGV[6], ARGV[7], ARGV[8]
local st = redis.call('HGET', KEYS[1], 'status')
local carrier = is_carrier(KEYS[1])
if not st then return {'missing'} end
if st ~= 'running' and st ~= 'queued' and not carrier then return {'ended'} end
if attempt ~= '' and redis.call('HGET', KEYS[1], 'attempts') ~= attempt then return {'superseded'} end
local result = {'written', carrier and '0' or '1'}
if not carrier then redis.call('HSET', KEYS[1], unpack(ARGV, 9)) end
if st == 'queued' then fair_remove(KEYS[1], job_id) end
redis.call('ZREM', KEYS[3], job_id)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('DEL', KEYS[4])
for _, f in ipairs(live_followers(KEYS[1])) do
  redis.call('HSET', JOB .. f, unpack(ARGV, 9))
  redis.call('EXPIRE', JOB .. f, ttl)
  table.insert(result, f)
end
redis.call('DEL', KEYS[5])
hand_over_inflight(KEYS[1], job_id, false)
return result
