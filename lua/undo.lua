#!lua flags=allow-oom
-- undo: return the seat of an admission that never reached the database (a short replica
-- acknowledgement, a database refusal, or the reaper). allow-oom: it frees memory, so it must run
-- when Redis is full.
--
-- The rollback guard: it changes something only if the record still carries this nonce and this
-- admission id, and the admission is still pending. A second run, a run after the candidate booked
-- again, or a run after the booking was persisted returns 0 and changes nothing.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held
-- KEYS[3] {ev:ID}:free     zset  free seat numbers
-- KEYS[4] {ev:ID}:pending  zset  code hash -> admitted-ms
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] admission id
-- ARGV[4] optional: "seat-held" when the database says another booking holds this seat (Redis
--         lost that booking's record); the seat then stays out of the pool instead of being
--         handed out again, and `reconcile` restores the lost record and count.
-- Returns 1 when the admission was undone, 0 when nothing changed.

local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return 0
end
local nonce, admission, slot, level = string.match(record, '^(%S+) (%S+) (%d+) (%S+) %d+$')
if nonce ~= ARGV[2] or admission ~= ARGV[3] then
  return 0
end
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if ARGV[4] ~= 'seat-held' then
  redis.call('ZADD', KEYS[3], slot, slot)
end
redis.call('HINCRBY', KEYS[2], level, -1)
return 1
