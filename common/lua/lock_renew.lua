-- Extend a lock only if this holder's token still holds it.
-- KEYS: lock. ARGV: token, ttl (ms). Returns 1 if extended, else 0 (lost: expired or taken).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
