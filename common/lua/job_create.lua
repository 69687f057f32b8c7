-- Insert a queued job and put it in its key's fair-queue list, unless `limit` jobs already wait.
-- KEYS: job, queued set, fair owners, fair list, fair meta, inflight.
-- ARGV: queue limit (0: none), now, job id, ttl, owner, cost, '1' to name the job in inflight,
-- then the job's fields. Returns 1, 0 (the queue is full) or -1 (the job exists).
--#include fair_lib
local limit, now, job_id, ttl, owner, cost, inflight = unpack(ARGV, 1, 7)
if tonumber(limit) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(limit) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, job_id)
fair_enqueue(KEYS[3], KEYS[4], KEYS[5], owner, cost, job_id)
if inflight == '1' then redis.call('SET', KEYS[6], job_id, 'NX', 'EX', ttl) end
return 1
