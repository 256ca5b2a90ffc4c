-- forget_consumer.lua: remove a consumer from its group when it holds nothing pending.
--
-- KEYS[1] stream  Stream  the stream (partition) the consumer read
--
-- ARGV[1] the consumer group
-- ARGV[2] the consumer's name
--
-- A clean exit calls this once the consumer has stopped reading and drained its own
-- pending list. XGROUP DELCONSUMER drops the consumer's pending entries with it (no
-- XAUTOCLAIM could reach them again), so the check and the delete are one atomic step.
-- Returns 1 when the consumer is not in the group any more, 0 when it holds pending
-- entries (it is left for another consumer's claim), -1 when the group does not exist.
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if not ok then return -1 end
if #pending > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
