-- A ticket picks the job it runs (common/scheduling/fair_queue.py): the job it took before, if it is a
-- redelivery; else, level by level, the fairest key's oldest queued job. The pick is recorded
-- against the ticket and as held by the worker. With prefix affinity on (common/scheduling/prefix_affinity.py)
-- a job whose prompt start other workers served, but not this one, is left at the head for one of
-- them that has a free slot, for at most the affinity wait.
-- KEYS: the ticket's key, the queued set, the held hash, then each priority level's owners zset
-- and meta hash, first served first (the last level is the batch level). ARGV: job key prefix,
-- ticket ttl, worker, batch room (how many more batch jobs this worker may take now; '' for no
-- limit), affinity wait (s; 0: off), holder ttl, most holders kept per chain, affinity key
-- prefix, free-slot key prefix, then each level's prefix of its keys' job lists (in the order of
-- KEYS).
-- Returns {job id, 'picked' | 'resumed', the job's priority, affinity outcome ('hit', 'miss',
-- 'new' or '')}; {false, 'capped'} when only batch jobs wait and the worker has no batch room;
-- {false, 'deferred', holder, '1' on the job's first deferral else '0'}; false when nothing waits.
local mapped = redis.call('GET', KEYS[1])
local job_prefix, ttl, worker, batch_room = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local wait, holder_ttl, max_holders = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local affinity_prefix, free_prefix = ARGV[8], ARGV[9]
if mapped then
  redis.call('HSET', KEYS[3], mapped, worker)
  return {mapped, 'resumed', redis.call('HGET', job_prefix .. mapped, 'priority') or ''}
end

-- The workers that started a job with the longest known of these block chains, within the
-- holder ttl (worker -> when), or nil when no chain is known.
local function holders_of(blocks, t)
  local keys = {}
  for block in string.gmatch(blocks, '%S+') do keys[#keys + 1] = affinity_prefix .. block end
  for i = #keys, 1, -1 do
    local flat = redis.call('HGETALL', keys[i])
    if #flat > 0 then
      local holders = {}
      for j = 1, #flat, 2 do
        if t - tonumber(flat[j + 1]) < holder_ttl then holders[flat[j]] = true end
      end
      return holders
    end
  end
  return nil
end

-- This worker holds the job's chains now; a chain keeps its most recent holders only.
local function hold(blocks, t)
  for block in string.gmatch(blocks, '%S+') do
    local key = affinity_prefix .. block
    redis.call('HSET', key, worker, t)
    redis.call('EXPIRE', key, holder_ttl)
    if redis.call('HLEN', key) > max_holders then
      local flat, oldest, at = redis.call('HGETALL', key), nil, nil
      for j = 1, #flat, 2 do
        if not at or tonumber(flat[j + 1]) < at then oldest, at = flat[j], tonumber(flat[j + 1]) end
      end
      redis.call('HDEL', key, oldest)
    end
  end
end

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local first_level = 9
local levels = #ARGV - first_level
for level = 1, levels do
  local owners, meta, lists = KEYS[2 + 2 * level], KEYS[3 + 2 * level], ARGV[first_level + level]
  if level == levels and batch_room ~= '' and tonumber(batch_room) <= 0 then
    if redis.call('ZCARD', owners) > 0 then return {false, 'capped'} end
    return false
  end
  while true do
    local head = redis.call('ZRANGE', owners, 0, 0, 'WITHSCORES')
    if #head == 0 then break end
    local owner, tag = head[1], tonumber(head[2])
    local list = lists .. owner
    local job_id = redis.call('LINDEX', list, 0)
    if not job_id then
      redis.call('ZREM', owners, owner)
    else
      local job_key = job_prefix .. job_id
      local job = redis.call('HMGET', job_key, 'status', 'priority', 'prefix_blocks', 'affinity_since')
      local outcome, t = '', nil
      if job[1] == 'queued' and wait > 0 and job[3] and job[3] ~= '' then
        t = now()
        local holders = holders_of(job[3], t)
        if not holders or next(holders) == nil then
          outcome = 'new'
        elseif holders[worker] then
          outcome = 'hit'
        else
          local roomy = nil
          if t - tonumber(job[4] or t) < wait then
            for holder in pairs(holders) do
              if tonumber(redis.call('GET', free_prefix .. holder) or '0') > 0 then roomy = holder break end
            end
          end
          if roomy then
            if not job[4] then redis.call('HSET', job_key, 'affinity_since', t) end
            return {false, 'deferred', roomy, job[4] and '0' or '1'}
          end
          outcome = 'miss'
        end
      end
      redis.call('LPOP', list)
      local cost = tonumber(redis.call('HGET', meta, 'cost:' .. owner) or '1')
      if redis.call('LLEN', list) == 0 then
        redis.call('ZREM', owners, owner)
        redis.call('HSET', meta, 'finish:' .. owner, tag + cost)
      else
        redis.call('ZADD', owners, tag + cost, owner)
      end
      redis.call('HSET', meta, 'clock', tag)
      if job[1] == 'queued' then
        redis.call('ZREM', KEYS[2], job_id)
        redis.call('SET', KEYS[1], job_id, 'EX', ttl)
        redis.call('HSET', KEYS[3], job_id, worker)
        if outcome ~= '' then
          hold(job[3], t)
          redis.call('HSET', job_key, 'prefix_affinity', outcome)
        end
        return {job_id, 'picked', job[2] or '', outcome}
      end
    end
  end
end
return false
