#!lua
-- waitlist_leave: a waiter answered `closed` leaves the list (docs/design.md#the-waiting-list).
-- A `closed` is final, so no later offer may name this code: an `open` after a `close` (or a
-- gate's cached view that said closed before Redis did) would otherwise offer a seat to a
-- candidate already told the sale is over, who no longer asks. An offer made before this runs is
-- a record with the waiter's nonce; the caller answers it as a booking retry does.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:waitq    zset  "LEVEL SEQ CODE-HASH"
-- KEYS[3] {ev:ID}:waiters  hash  code hash -> "nonce level seq joined-ms"
-- ARGV[1] code hash
-- ARGV[2] nonce
-- Returns 1 when the code holds a seat with this nonce (left in the list's hands: it has none),
-- else 0 once the code's entry, if any, is gone.

local record = redis.call('HGET', KEYS[1], ARGV[1])
if record and string.match(record, '^(%S+) ') == ARGV[2] then
  return 1
end
local waiter = redis.call('HGET', KEYS[3], ARGV[1])
if waiter then
  local level, seq = string.match(waiter, '^%S+ (%S+) (%d+) %d+$')
  redis.call('ZREM', KEYS[2], level .. ' ' .. seq .. ' ' .. ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return 0
