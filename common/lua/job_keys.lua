-- The job key layout (Keys.job_layout in common/keys.py): the first five ARGV of every script that
-- includes this file. A job's key is JOB .. id; its log, channel and followers set are its key
-- plus EVENTS, WAKE, FOLLOWERS; the job generating a request digest is named in INFLIGHT .. digest.
local JOB, EVENTS, WAKE, FOLLOWERS, INFLIGHT = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
