-- The outcome of a delivery attempt, written only if it is the next attempt of a pending delivery.
-- KEYS: delivery. ARGV: attempt, ttl, then the outcome's fields. Returns 1 if written, else 0.
if redis.call('HGET', KEYS[1], 'state') ~= 'pending' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempts')) ~= tonumber(ARGV[1]) - 1 then return 0 end
redis.call('HSET', KEYS[1], 'attempts', ARGV[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
