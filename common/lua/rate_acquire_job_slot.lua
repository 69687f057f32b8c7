-- One of a key's concurrent-job slots for a job. When the set looks full, members whose job has
-- ended (or whose record never appeared within a minute) are dropped first.
-- KEYS: the key's active set. ARGV: limit, job id, job key prefix, ttl, now.
-- Returns 1 if the slot was taken, else 0.
local limit, now = tonumber(ARGV[1]), tonumber(ARGV[5])
if redis.call('ZCARD', KEYS[1]) >= limit then
  local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local id, since = members[i], tonumber(members[i + 1])
    local st = redis.call('HGET', ARGV[3] .. id, 'status')
    if (st and st ~= 'queued' and st ~= 'running') or (not st and since < now - 60) then
      redis.call('ZREM', KEYS[1], id)
    end
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
