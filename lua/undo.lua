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
-- KEYS[4] {ev:ID}:pending  zset  "code-hash admission-id" -> admitted-ms
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] admission id
-- KEYS[5] {ev:ID}:meta     hash  state, closes_at_ms (the waiting list closes with the sale)
-- KEYS[6] {ev:ID}:waitq    zset  "LEVEL SEQ CODE-HASH", the waiting list (lua/with_offer.lua)
-- KEYS[7] {ev:ID}:waiters  hash  code hash -> "nonce level seq joined-ms"
-- KEYS[8] {ev:ID}:allow    set   code hashes allowed to book
-- KEYS[9] {ev:ID}:cap      hash  level -> cap
-- ARGV[4] optional: "seat-held" when the database says another booking holds this seat (Redis
--         lost that booking's record); the seat then stays out of the pool instead of being
--         handed out again, and `reconcile` restores the lost record and count. Anything else
--         ("free") frees the seat.
-- ARGV[5] optional: a fresh admission id for the offer of the room made to the first waiter of a
--         level with room (without it, KEYS[5..9] are not read and the seat stays in the pool).
--         A `seat-held` undo makes room too: its level's count comes down, and with event-wide
--         numbering a seat elsewhere in the pool may then be that level's.
-- Returns 1 when the admission was undone, 0 when nothing changed, or the offer
-- {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms} when the room went to a
-- waiter (docs/design.md#the-waiting-list).

local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return 0
end
local nonce, admission, slot, level = string.match(record, '^(%S+) (%S+) (%d+) (%S+) %d+$')
if nonce ~= ARGV[2] or admission ~= ARGV[3] then
  return 0
end
-- The pending entry is named by the admission (src/redis_io/keys.rs pending_member).
local entry = ARGV[1] .. ' ' .. ARGV[3]
if not redis.call('ZSCORE', KEYS[4], entry) then
  return 0
end
if ARGV[4] ~= 'seat-held' then
  redis.call('ZADD', KEYS[3], slot, slot)
end
redis.call('HINCRBY', KEYS[2], level, -1)
local offers = ARGV[5] and offer_room({adm = KEYS[1], pending = KEYS[4], meta = KEYS[5], waitq = KEYS[6],
  waiters = KEYS[7], allow = KEYS[8], cap = KEYS[9], taken = KEYS[2], free = KEYS[3]}, {ARGV[5]}) or {}
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], entry)
return offers[1] or 1
