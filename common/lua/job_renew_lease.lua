-- Extend an attempt's lease while that attempt still owns the running job (or carrier).
-- KEYS: job, lease. ARGV: the job layout (job_keys), then attempt, worker, lease ttl.
-- Returns 1 if renewed, else 0.
--#include job_keys
--#include coalescing_lib
local attempt, worker, lease_ttl = ARGV[6], ARGV[7], ARGV[8]
if redis.call('HGET', KEYS[1], 'attempts') ~= attempt then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'running' and not is_carrier(KEYS[1]) then return 0 end
redis.call('SET', KEYS[2], worker, 'EX', lease_ttl)
return 1
