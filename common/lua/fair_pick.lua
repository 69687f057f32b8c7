-- A ticket picks the job it runs (common/fair_queue.py): the job it took before, if it is a
-- redelivery; else, level by level, the fairest key's oldest queued job. The pick is recorded
-- against the ticket and as held by the worker.
-- KEYS: the ticket's key, the queued set, the held hash, then each priority level's owners zset
-- and meta hash, first served first (the last level is the batch level). ARGV: job key prefix,
-- ticket ttl, worker, batch room (how many more batch jobs this worker may take now; '' for no
-- limit), then each level's prefix of its keys' job lists (in the order of KEYS).
-- Returns {job id, 'picked' | 'resumed', the job's priority}; {false, 'capped'} when only batch
-- jobs wait and the worker has no batch room; false when nothing waits.
local mapped = redis.call('GET', KEYS[1])
local job_prefix, ttl, worker, batch_room = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if mapped then
  redis.call('HSET', KEYS[3], mapped, worker)
  return {mapped, 'resumed', redis.call('HGET', job_prefix .. mapped, 'priority') or ''}
end
local levels = #ARGV - 4
for level = 1, levels do
  local owners, meta, lists = KEYS[2 + 2 * level], KEYS[3 + 2 * level], ARGV[4 + level]
  if level == levels and batch_room ~= '' and tonumber(batch_room) <= 0 then
    if redis.call('ZCARD', owners) > 0 then return {false, 'capped'} end
    return false
  end
  while true do
    local head = redis.call('ZRANGE', owners, 0, 0, 'WITHSCORES')
    if #head == 0 then break end
    local owner, tag = head[1], tonumber(head[2])
    local list = lists .. owner
    local job_id = redis.call('LPOP', list)
    local cost = tonumber(redis.call('HGET', meta, 'cost:' .. owner) or '1')
    if not job_id then
      redis.call('ZREM', owners, owner)
    else
      if redis.call('LLEN', list) == 0 then
        redis.call('ZREM', owners, owner)
        redis.call('HSET', meta, 'finish:' .. owner, tag + cost)
      else
        redis.call('ZADD', owners, tag + cost, owner)
      end
      redis.call('HSET', meta, 'clock', tag)
      local job = redis.call('HMGET', job_prefix .. job_id, 'status', 'priority')
      if job[1] == 'queued' then
        redis.call('ZREM', KEYS[2], job_id)
        redis.call('SET', KEYS[1], job_id, 'EX', ttl)
        redis.call('HSET', KEYS[3], job_id, worker)
        return {job_id, 'picked', job[2] or ''}
      end
    end
  end
end
return false
