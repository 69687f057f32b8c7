-- Move a batch to a new status only from one of the allowed ones.
-- KEYS: batch. ARGV: allowed current statuses (comma-separated), new status, then fields to set.
-- Returns 1 if this call made the change, else 0.
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 0 end
local allowed = false
for s in string.gmatch(ARGV[1], '[^,]+') do if s == st then allowed = true end end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
if #ARGV > 2 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
return 1
