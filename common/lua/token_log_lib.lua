-- Log an event in a job's token log and announce it on the job's channel with its content:
-- "<previous entry id> <entry id> <event> <data>", the format common/token_log.py reads
-- (`parse_announcement`); the previous id lets a listener see a gap. `extra` (optional) is a
-- flat list of more fields for the entry that are not announced (a chunk's token ids, for the
-- attempt that continues it: common/continuation.py). Include job_keys first.
local function log_event(job_key, maxlen, ttl, event, data, extra)
  local stream = job_key .. EVENTS
  local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  local id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'event', event, 'data', data,
                        unpack(extra or {}))
  redis.call('EXPIRE', stream, ttl)
  redis.call('PUBLISH', job_key .. WAKE,
             (newest and newest[1] or '0') .. ' ' .. id .. ' ' .. event .. ' ' .. data)
end
