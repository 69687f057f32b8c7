-- A lease for one more open stream of a key, unless `limit` leases are still alive.
-- KEYS: the key's stream leases zset. ARGV: now, limit, lease (s), token.
-- Returns 1 if taken, else 0.
local now, limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(lease))
return 1
