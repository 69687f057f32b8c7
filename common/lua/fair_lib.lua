-- The fair queue's steps inside the job scripts and the pick (common/scheduling/fair_queue.py).

-- A key that becomes active joins its level at the virtual clock, never below its own last
-- finish tag.
local function fair_join(owners, meta, owner)
  if not redis.call('ZSCORE', owners, owner) then
    local clock = tonumber(redis.call('HGET', meta, 'clock') or '0')
    local finish = tonumber(redis.call('HGET', meta, 'finish:' .. owner) or '0')
    redis.call('ZADD', owners, math.max(clock, finish), owner)
  end
end

-- A new job joins the end of its key's list.
local function fair_enqueue(owners, list, meta, owner, cost, job_id)
  redis.call('RPUSH', list, job_id)
  redis.call('HSET', meta, 'cost:' .. owner, cost)
  fair_join(owners, meta, owner)
end

-- A job that was picked goes back to the head of its key's list (a preempted job).
local function fair_enqueue_first(owners, list, meta, owner, job_id)
  redis.call('LPUSH', list, job_id)
  fair_join(owners, meta, owner)
end

-- A job leaves its fair list wherever it is (cancel, expiry, a finish while queued).
local function fair_remove(job_key, job_id)
  local list = redis.call('HGET', job_key, 'fair_list')
  if list then redis.call('LREM', list, 0, job_id) end
end

-- After its head job is taken, a key's start tag grows by its cost; a key left with no jobs
-- leaves its level and remembers its finish tag. The level's virtual clock is the tag served.
local function fair_advance(owners, meta, owner, tag, list)
  local cost = tonumber(redis.call('HGET', meta, 'cost:' .. owner) or '1')
  if redis.call('LLEN', list) == 0 then
    redis.call('ZREM', owners, owner)
    redis.call('HSET', meta, 'finish:' .. owner, tag + cost)
  else
    redis.call('ZADD', owners, tag + cost, owner)
  end
  redis.call('HSET', meta, 'clock', tag)
end

-- One level as it stands (common/scheduling/fair_queue.py's `_Level`): {owner, start tag, ...}, each
-- owner's number of queued jobs, the level's meta hash {field, value, ...}.
local function fair_snapshot(owners, meta, list_prefix)
  local tags = redis.call('ZRANGE', owners, 0, -1, 'WITHSCORES')
  local lengths = {}
  for i = 1, #tags, 2 do table.insert(lengths, redis.call('LLEN', list_prefix .. tags[i])) end
  return {tags, lengths, redis.call('HGETALL', meta)}
end
