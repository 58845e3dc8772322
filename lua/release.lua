#!lua flags=allow-oom
-- release: return the seat of a booking the database has already released (hold expired,
-- cancelled). allow-oom: it frees memory, so it must run when Redis is full.
--
-- Guarded like undo: it changes something only if the record still carries this nonce and this
-- admission id, so a second run, or a run after the candidate booked again, changes nothing.
-- Unlike undo it does not need the admission to be pending.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held
-- KEYS[3] {ev:ID}:free     zset  free seat numbers
-- KEYS[4] {ev:ID}:pending  zset  "code-hash admission-id" -> admitted-ms
-- KEYS[5] {ev:ID}:syncs    string  releases run, counted on every call
-- KEYS[6] {ev:ID}:meta     hash    state, closes_at_ms (the waiting list closes with the sale)
-- KEYS[7] {ev:ID}:waitq    zset    "LEVEL SEQ CODE-HASH", the waiting list (lua/with_offer.lua)
-- KEYS[8] {ev:ID}:waiters  hash    code hash -> "nonce level seq joined-ms"
-- KEYS[9] {ev:ID}:allow    set     code hashes allowed to book
-- KEYS[10] {ev:ID}:cap     hash    level -> cap
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] admission id
-- ARGV[4] optional: a fresh admission id for the offer of the room made to the first waiter of a
--         level with room (without it, KEYS[6..10] are not read and the seat stays in the pool)
-- Returns 1 when the seat went back to the pool, 0 when nothing changed, or the offer
-- {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms} when the room went to a
-- waiter (docs/design.md#the-waiting-list): the caller books it as a retry of the waiter's nonce.
--
-- Every call writes (the INCR), so the WAIT that follows on the same connection covers this
-- connection's latest write even when an earlier run (whose WAIT fell short) already deleted the
-- record: a release is only marked synced once a replica has it
-- (docs/design.md#releases-and-their-sync).

redis.call('INCR', KEYS[5])
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return 0
end
local nonce, admission, slot, level = string.match(record, '^(%S+) (%S+) (%d+) (%S+) %d+$')
if nonce ~= ARGV[2] or admission ~= ARGV[3] then
  return 0
end
redis.call('ZADD', KEYS[3], slot, slot)
redis.call('HINCRBY', KEYS[2], level, -1)
local offers = ARGV[4] and offer_room({adm = KEYS[1], pending = KEYS[4], meta = KEYS[6], waitq = KEYS[7],
  waiters = KEYS[8], allow = KEYS[9], cap = KEYS[10], taken = KEYS[2], free = KEYS[3]}, {ARGV[4]}) or {}
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1] .. ' ' .. ARGV[3])
return offers[1] or 1
