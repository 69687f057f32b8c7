"""Coalescing: an identical deterministic request that arrives while the same one is queued or
running attaches to it instead of generating twice.

Each request still gets a job of its own (id, record, token log, done event, owner), so polling,
SSE, `Last-Event-ID`, cancel and ownership work exactly as for any job. Only the generation is
shared: the first job (the *primary*) is queued and run; later identical ones are *followers*,
listed in the primary's followers set. The worker writes every chunk, the start, a restart and the
end to the primary and to each follower in the same Lua script (`jobs._APPEND_FENCED` etc.), so
all of them see the same tokens. A follower that attaches while the primary runs gets a copy of
the log so far, in the same script that attaches it.

Cancelling is per job, with the generation reference-counted:
- a follower's cancel detaches it (its log ends with `done: cancelled`); the others go on;
- a queued primary's cancel hands its place in the queue to its first follower (promotion);
- a running primary's cancel ends the primary for its client (`done: cancelled`) but, while
  followers remain, the generation goes on for them (the primary is *detached*: a carrier);
  when the last follower leaves a carrier, the worker is asked to stop.

The request digest (model + prompt token ids + sampling, the result-cache key) names the primary
in `inflight:<digest>` while it is queued or running. Two identical requests admitted in the same
instant may both become primaries: that costs a duplicate generation, never a wrong answer.
"""
from __future__ import annotations

# Lua helpers shared by the job scripts. `job_prefix` is Keys.job("") ("<ns>:job:"); a job's log is
# `<job key>:events`, its wake-up channel `<job key>:wake`, its followers `<job key>:followers`.
LUA_HELPERS = """
local function followers_of(job_key)
  return redis.call('SMEMBERS', job_key .. ':followers')
end

local function is_carrier(job_key)
  return redis.call('HGET', job_key, 'status') == 'cancelled'
     and redis.call('HGET', job_key, 'detached') == '1'
end

-- The digest's inflight entry stops naming job_id: it names the heir, or nothing.
local function hand_over_inflight(job_key, job_id, inflight_prefix, heir)
  local digest = redis.call('HGET', job_key, 'cache_key')
  if not digest or redis.call('GET', inflight_prefix .. digest) ~= job_id then return end
  if heir then
    redis.call('SET', inflight_prefix .. digest, heir, 'KEEPTTL')
  else
    redis.call('DEL', inflight_prefix .. digest)
  end
end

-- Log an event and announce it with its content ("<previous id> <id> <event> <data>", see
-- common/keys.py), so SSE relays need not read it back; the previous id lets them see a gap.
local function log_event(job_key, maxlen, ttl, event, data)
  local stream = job_key .. ':events'
  local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  local id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'event', event, 'data', data)
  redis.call('EXPIRE', stream, ttl)
  redis.call('PUBLISH', job_key .. ':wake', (newest and newest[1] or '0') .. ' ' .. id .. ' ' .. event .. ' ' .. data)
end

-- Followers of job_key that still wait for the shared generation (queued or running).
local function live_followers(job_key, job_prefix)
  local live = {}
  for _, f in ipairs(followers_of(job_key)) do
    local st = redis.call('HGET', job_prefix .. f, 'status')
    if st == 'queued' or st == 'running' then table.insert(live, f) end
  end
  return live
end

-- A queued primary leaves (cancel, expiry): its oldest live follower takes its place in the queue
-- and becomes the primary of the rest. Returns the heir's id, or false when none is left.
local function promote(job_key, job_id, job_prefix, queued_key, inflight_prefix)
  local heirs = live_followers(job_key, job_prefix)
  redis.call('DEL', job_key .. ':followers')
  if #heirs == 0 then return false end
  local created = {}
  for _, f in ipairs(heirs) do created[f] = tonumber(redis.call('HGET', job_prefix .. f, 'created_at')) end
  table.sort(heirs, function(a, b) return created[a] < created[b] end)  -- the oldest inherits
  local heir = heirs[1]
  local heir_key = job_prefix .. heir
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
    redis.call('SADD', heir_key .. ':followers', heirs[i])
    redis.call('HSET', job_prefix .. heirs[i], 'coalesced_into', heir)
  end
  hand_over_inflight(job_key, job_id, inflight_prefix, heir)
  return heir
end

-- A follower leaves its primary; a carrier left without followers is told to stop.
local function detach_follower(job_prefix, primary, follower)
  local primary_key = job_prefix .. primary
  redis.call('SREM', primary_key .. ':followers', follower)
  if redis.call('SCARD', primary_key .. ':followers') == 0 and is_carrier(primary_key) then
    redis.call('HSET', primary_key, 'cancel_requested', '1')
  end
end
"""

# Attach a new job (KEYS[2], log KEYS[3]) to the primary named by KEYS[1] (the inflight key), if
# that primary is queued or running and not being cancelled. ARGV: 1 new job id, 2 ttl,
# 3 job prefix, 4 log maxlen, 5.. the new job's fields. Returns the primary's id, or false.
ATTACH = LUA_HELPERS + """
local primary = redis.call('GET', KEYS[1])
if not primary then return false end
local pk = ARGV[3] .. primary
local st = redis.call('HGET', pk, 'status')
if (st ~= 'queued' and st ~= 'running') or redis.call('HGET', pk, 'cancel_requested') == '1' then
  return false
end
redis.call('HSET', KEYS[2], unpack(ARGV, 5))
local copied = redis.call('HMGET', pk, 'started_at', 'worker', 'text', 'completion_tokens')
redis.call('HSET', KEYS[2], 'status', st, 'coalesced_into', primary,
           'text', copied[3] or '', 'completion_tokens', copied[4] or '0')
if st == 'running' then
  redis.call('HSET', KEYS[2], 'started_at', copied[1], 'worker', copied[2] or '')
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
for _, entry in ipairs(redis.call('XRANGE', pk .. ':events', '-', '+')) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', unpack(entry[2]))
end
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('SADD', pk .. ':followers', ARGV[1])
redis.call('EXPIRE', pk .. ':followers', ARGV[2])
return primary
"""
