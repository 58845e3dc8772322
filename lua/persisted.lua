#!lua flags=allow-oom
-- persisted: the booking row is in the database; drop the admission's pending entry so the
-- reaper leaves it alone. allow-oom: it only frees memory.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:pending  zset  code hash -> admitted-ms
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] admission id
-- Returns 1 when the pending entry was dropped, 0 when the record is another admission's or the
-- entry was already gone.

local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return 0
end
local nonce, admission = string.match(record, '^(%S+) (%S+) ')
if nonce ~= ARGV[2] or admission ~= ARGV[3] then
  return 0
end
return redis.call('ZREM', KEYS[2], ARGV[1])
