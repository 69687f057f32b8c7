-- Prefix affinity's steps inside the pick script (common/scheduling/prefix_affinity.py). `affinity`
-- is the pick's table of named settings: wait_s, holder_ttl_s, max_holders, prefix (of the block
-- chains' holder hashes) and free_slots_prefix (of each worker's free-slot count).

-- The workers that started a job with the longest known of these block chains, within the
-- holder ttl (worker -> when), or nil when no chain is known.
local function affinity_holders(affinity, blocks, t)
  local keys = {}
  for block in string.gmatch(blocks, '%S+') do keys[#keys + 1] = affinity.prefix .. block end
  for i = #keys, 1, -1 do
    local flat = redis.call('HGETALL', keys[i])
    if #flat > 0 then
      local holders = {}
      for j = 1, #flat, 2 do
        if t - tonumber(flat[j + 1]) < affinity.holder_ttl_s then holders[flat[j]] = true end
      end
      return holders
    end
  end
  return nil
end

-- `worker` holds the job's chains now; a chain keeps its most recent holders only.
local function affinity_hold(affinity, worker, blocks, t)
  for block in string.gmatch(blocks, '%S+') do
    local key = affinity.prefix .. block
    redis.call('HSET', key, worker, t)
    redis.call('EXPIRE', key, affinity.holder_ttl_s)
    if redis.call('HLEN', key) > affinity.max_holders then
      local flat, oldest, at = redis.call('HGETALL', key), nil, nil
      for j = 1, #flat, 2 do
        if not at or tonumber(flat[j + 1]) < at then oldest, at = flat[j], tonumber(flat[j + 1]) end
      end
      redis.call('HDEL', key, oldest)
    end
  end
end

-- Where a queued job with these block chains goes when `worker` looks at it at time `t`, first
-- left at `since` (nil: never): the outcome of taking it here ('new', 'hit' or 'miss'), or nil and
-- the holder with a free slot that it is left for, while the affinity wait lasts.
local function affinity_route(affinity, worker, blocks, since, t)
  local holders = affinity_holders(affinity, blocks, t)
  if not holders or next(holders) == nil then return 'new' end
  if holders[worker] then return 'hit' end
  if t - tonumber(since or t) < affinity.wait_s then
    for holder in pairs(holders) do
      if tonumber(redis.call('GET', affinity.free_slots_prefix .. holder) or '0') > 0 then
        return nil, holder
      end
    end
  end
  return 'miss'
end
