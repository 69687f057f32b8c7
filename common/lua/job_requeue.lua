-- A running job its worker stopped to free the slot (a batch line preempted by interactive work,
-- worker/job_runner.py) goes back to the head of its key's fair list, to start over on the next
-- free slot. Only the attempt that holds it may: a job that ended or moved on is left alone. The
-- preemption is counted apart from attempts, so it never makes the job look poisoned
-- (job_start.lua), and the log says that the text starts over.
-- KEYS: job, lease, the job's level's owners zset and meta hash, the held hash.
-- ARGV: the job layout (job_keys), then job id, attempt, worker, job ttl, log maxlen.
-- Returns 1 if requeued, else 0.
--#include job_keys
--#include fair_lib
--#include token_log_lib
local job_id, attempt, worker, ttl, maxlen = unpack(ARGV, 6, 10)
local job = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'fair_list', 'fair_owner')
if job[1] ~= 'running' or job[2] ~= attempt or redis.call('GET', KEYS[2]) ~= worker then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'text', '', 'completion_tokens', '0')
redis.call('HDEL', KEYS[1], 'started_at', 'worker')
redis.call('HINCRBY', KEYS[1], 'preemptions', 1)
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[5], job_id)
fair_enqueue_first(KEYS[3], job[3], KEYS[4], job[4], job_id)
log_event(KEYS[1], maxlen, ttl, 'restart', cjson.encode({attempt = tonumber(attempt),
                                                         reason = 'preempted by interactive work'}))
return 1
