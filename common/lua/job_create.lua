-- Insert a queued job and put it in its key's fair-queue list, unless `limit` jobs already wait;
-- in the same step index its queue deadline, push its ticket (the broker message,
-- common/tickets.py) and read its place in line, each when asked.
-- KEYS: job, queued set, fair owners, fair list, fair meta, inflight, deadlines, ticket list,
-- then the owners and meta keys of each level up to the job's own (its place; none: not asked).
-- ARGV: queue limit (0: none), now, job id, ttl, owner, cost, '1' to name the job in inflight,
-- queue deadline ('': none), ticket message ('': none), the number of levels to read N, their
-- list prefixes (N), then the job's fields as one JSON list [name, value, ...] (one argument
-- instead of dozens: each costs the caller more than decoding them all costs Redis).
-- Returns {1, index in its key's list, the levels read (fair_snapshot each)}, {0} (the queue is
-- full) or {-1} (the job exists).
--#include fair_lib
local limit, now, job_id, ttl, owner, cost, inflight, deadline, ticket, levels = unpack(ARGV, 1, 10)
levels = tonumber(levels)
if tonumber(limit) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(limit) then return {0} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1} end
if deadline ~= '' then redis.call('ZADD', KEYS[7], deadline, job_id) end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[11 + levels])))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, job_id)
fair_enqueue(KEYS[3], KEYS[4], KEYS[5], owner, cost, job_id)
if inflight == '1' then redis.call('SET', KEYS[6], job_id, 'NX', 'EX', ttl) end
if ticket ~= '' then redis.call('LPUSH', KEYS[8], ticket) end
local reply = {1, redis.call('LLEN', KEYS[4]) - 1}
for i = 1, levels do
  table.insert(reply, fair_snapshot(KEYS[7 + 2 * i], KEYS[8 + 2 * i], ARGV[10 + i]))
end
return reply
