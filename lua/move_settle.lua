#!lua flags=allow-oom
-- move_settle: the second half of a move, once the database has decided it
-- (docs/design.md#moving-a-booking). Guarded by the move id: a second run, or a run for another
-- move, changes nothing. allow-oom: it only frees.
--
-- KEYS[1] {ev:ID}:adm     hash   KEYS[2] {ev:ID}:taken  hash   KEYS[3] {ev:ID}:free  zset
-- KEYS[4] {ev:ID}:moves   hash   KEYS[5] {ev:ID}:moving zset
-- KEYS[6..11] {ev:ID}:pending, :meta, :waitq, :waiters, :allow, :cap (the waiting list's, read
--         only with ARGV[4])
-- ARGV[1] code hash  ARGV[2] move id  ARGV[3] "done" (the database took the move) or "aborted"
-- ARGV[4] optional: a fresh admission id for the offer of the seat freed to the first waiter of a
--         level with room (lua/with_offer.lua; docs/design.md#the-waiting-list)
--
-- done:    the old seat goes back to the pool and its level's count down. (A release that ran
--          meanwhile freed the record's seat, the new one; the old one is still this move's.)
-- aborted: if the record is still this booking in the new seat, it gets its old seat back and the
--          new seat goes to the pool; if the booking was released meanwhile (its release freed
--          the new seat), the old seat goes to the pool.
-- Either way a record of this booking that is in neither seat (rewritten by a repair) is left as
-- it is. Returns 1 when the marker was settled, 0 when there was none for this move, or the offer
-- {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms} when the freed seat's room
-- went to a waiter.

local marker = redis.call('HGET', KEYS[4], ARGV[1])
if not marker then
  return 0
end
local id, nonce, admission, old_slot, old_level, new_slot, new_level =
  string.match(marker, '^(%S+) (%S+) (%S+) (%d+) (%S+) (%d+) (%S+)$')
if id ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])

-- The seat freed goes back to the pool, its level's count down, and the room to the list.
local function free(slot, level)
  redis.call('ZADD', KEYS[3], slot, slot)
  redis.call('HINCRBY', KEYS[2], level, -1)
  local offers = ARGV[4] and offer_room({adm = KEYS[1], pending = KEYS[6], meta = KEYS[7], waitq = KEYS[8],
    waiters = KEYS[9], allow = KEYS[10], cap = KEYS[11], taken = KEYS[2], free = KEYS[3]}, {ARGV[4]}) or {}
  return offers[1] or 1
end

local record = redis.call('HGET', KEYS[1], ARGV[1])
local mine, at_new = false, false
if record then
  local n, a, s, l, admitted = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
  mine = n == nonce and a == admission
  at_new = mine and s == new_slot and l == new_level
  if mine and not at_new then
    return 1
  end
  if ARGV[3] == 'aborted' and at_new then
    redis.call('HSET', KEYS[1], ARGV[1], n .. ' ' .. a .. ' ' .. old_slot .. ' ' .. old_level .. ' ' .. admitted)
    return free(new_slot, new_level)
  end
end
return free(old_slot, old_level)
