-- A ticket picks the job it runs (common/scheduling/fair_queue.py): the job it took before, if it
-- is a redelivery; else, level by level, the fairest key's oldest queued job, unless batch lines
-- may take no more of this worker's slots (common/scheduling/batch_share.py) or prefix affinity
-- leaves the job for another worker (common/scheduling/prefix_affinity.py). The pick is recorded
-- against the ticket and as held by the worker.
-- KEYS: the ticket's key, the queued set, the held hash, then each priority level's owners zset
-- and meta hash, first served first (the last level is the batch level).
-- ARGV[1]: JSON of named arguments: job_prefix, ticket_ttl_s, worker, batch_room (how many more
-- batch lines this worker may take now; absent: no limit), level_lists (each level's prefix of
-- its keys' job lists, in the order of KEYS) and affinity (see affinity_lib; wait_s 0: off).
-- Returns {job id, 'picked' | 'resumed', the job's priority, affinity outcome ('hit', 'miss',
-- 'new' or '')}; {false, 'capped'} when only batch jobs wait and the worker has no batch room;
-- {false, 'deferred', holder, '1' on the job's first deferral else '0'}; false when nothing waits.
--#include fair_lib
--#include affinity_lib
local ticket_key, queued_key, held_key = KEYS[1], KEYS[2], KEYS[3]
local args = cjson.decode(ARGV[1])
local worker, affinity = args.worker, args.affinity

local mapped = redis.call('GET', ticket_key)
if mapped then
  redis.call('HSET', held_key, mapped, worker)
  return {mapped, 'resumed', redis.call('HGET', args.job_prefix .. mapped, 'priority') or ''}
end

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local levels = #args.level_lists
for level = 1, levels do
  local owners, meta, lists = KEYS[2 + 2 * level], KEYS[3 + 2 * level], args.level_lists[level]
  if level == levels and args.batch_room ~= nil and args.batch_room <= 0 then
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
      local job_key = args.job_prefix .. job_id
      local job = redis.call('HMGET', job_key, 'status', 'priority', 'prefix_blocks', 'affinity_since')
      local outcome, t = '', nil
      if job[1] == 'queued' and affinity.wait_s > 0 and job[3] and job[3] ~= '' then
        t = now()
        local holder
        outcome, holder = affinity_route(affinity, worker, job[3], job[4], t)
        if holder then
          if not job[4] then redis.call('HSET', job_key, 'affinity_since', t) end
          return {false, 'deferred', holder, job[4] and '0' or '1'}
        end
      end
      redis.call('LPOP', list)
      fair_advance(owners, meta, owner, tag, list)
      if job[1] == 'queued' then
        redis.call('ZREM', queued_key, job_id)
        redis.call('SET', ticket_key, job_id, 'EX', args.ticket_ttl_s)
        redis.call('HSET', held_key, job_id, worker)
        if outcome ~= '' then
          affinity_hold(affinity, worker, job[3], t)
          redis.call('HSET', job_key, 'prefix_affinity', outcome)
        end
        return {job_id, 'picked', job[2] or '', outcome}
      end
    end
  end
end
return false
