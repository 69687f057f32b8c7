-- Coalescing helpers (common/coalescing.py): a primary's followers, carriers, promotion,
-- detaching. Include job_keys first.

local function followers_of(job_key)
  return redis.call('SMEMBERS', job_key .. FOLLOWERS)
end

-- A primary whose own client cancelled while followers ride on its generation.
local function is_carrier(job_key)
  return redis.call('HGET', job_key, 'status') == 'cancelled'
     and redis.call('HGET', job_key, 'detached') == '1'
end

-- The digest's inflight entry stops naming job_id: it names the heir, or nothing.
local function hand_over_inflight(job_key, job_id, heir)
  local digest = redis.call('HGET', job_key, 'cache_key')
  if not digest or redis.call('GET', INFLIGHT .. digest) ~= job_id then return end
  if heir then
    redis.call('SET', INFLIGHT .. digest, heir, 'KEEPTTL')
  else
    redis.call('DEL', INFLIGHT .. digest)
  end
end

-- Followers of job_key that still wait for the shared generation (queued or running).
local function live_followers(job_key)
  local live = {}
  for _, f in ipairs(followers_of(job_key)) do
    local st = redis.call('HGET', JOB .. f, 'status')
    if st == 'queued' or st == 'running' then table.insert(live, f) end
  end
  return live
end

-- A queued primary leaves (cancel, expiry): its oldest live follower takes its place in the queue
-- and becomes the primary of the rest. Returns the heir's id, or false when none is left.
local function promote(job_key, job_id, queued_key)
  local heirs = live_followers(job_key)
  redis.call('DEL', job_key .. FOLLOWERS)
  if #heirs == 0 then return false end
  local created = {}
  for _, f in ipairs(heirs) do created[f] = tonumber(redis.call('HGET', JOB .. f, 'created_at')) end
  table.sort(heirs, function(a, b) return created[a] < created[b] end)  -- the oldest inherits
  local heir = heirs[1]
  local heir_key = JOB .. heir
  local list = redis.call('HGET', job_key, 'fair_list')
  if list then
    local index = redis.call('LPOS', list, job_id)
    if index then redis.call('LSET', list, index, heir) end
    redis.call('HSET', heir_key, 'fair_list', list)
  end
  -- the heir waits in the primary's place: that key's list, at that priority level
  local place = redis.call('HMGET', job_key, 'fair_owner', 'priority_level')
  if place[1] then redis.call('HSET', heir_key, 'fair_owner', place[1], 'priority_level', place[2]) end
  redis.call('HDEL', heir_key, 'coalesced_into')
  local score = redis.call('ZSCORE', queued_key, job_id)
  if score then redis.call('ZADD', queued_key, score, heir) end
  for i = 2, #heirs do
    redis.call('SADD', heir_key .. FOLLOWERS, heirs[i])
    redis.call('HSET', JOB .. heirs[i], 'coalesced_into', heir)
  end
  hand_over_inflight(job_key, job_id, heir)
  return heir
end

-- A follower leaves its primary; a carrier left without followers is told to stop.
local function detach_follower(primary, follower)
  local primary_key = JOB .. primary
  redis.call('SREM', primary_key .. FOLLOWERS, follower)
  if redis.call('SCARD', primary_key .. FOLLOWERS) == 0 and is_carrier(primary_key) then
    redis.call('HSET', primary_key, 'cancel_requested', '1')
  end
end
