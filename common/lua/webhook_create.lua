-- Record a webhook delivery, once per subject and event type.
-- KEYS: the subject's index, the delivery. ARGV: event type, delivery id, ttl, then the
-- delivery's fields. Returns 1 if this call created it, else 0.
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
