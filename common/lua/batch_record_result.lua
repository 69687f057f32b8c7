-- Account for one line of a batch, once.
-- KEYS: batch, results, pending. ARGV: line, 'completed' | 'failed', result, input tokens,
-- output tokens. Returns 1 if this call accounted for the line, else 0.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3]) == 0 then return 0 end
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[5])
return 1
