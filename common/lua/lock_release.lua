-- Release a lock only if this holder's token still holds it.
-- KEYS: lock. ARGV: token. Returns 1 if released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
