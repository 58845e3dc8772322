#!lua
-- waitlist_leave: a waiter answered `closed` leaves the list (docs/design.md#the-waiting-list).
-- A `closed` is final, so no later offer may name this code: an `open` after a `close` (or a
-- gate's cached view that said closed before Redis did) would otherwise offer a seat to a
-- candidate already told the sale is over, who no longer asks. An offer made before this runs
-- already took the entry out and left a record with the waiter's nonce: the caller then answers
-- through the booking path, which finds it.
--
-- KEYS[1] {ev:ID}:waitq    zset  "LEVEL SEQ CODE-HASH"
-- KEYS[2] {ev:ID}:waiters  hash  code hash -> "nonce level seq joined-ms"
-- ARGV[1] code hash
-- Returns 1 when the code's entry was removed, 0 when it had none.

local waiter = redis.call('HGET', KEYS[2], ARGV[1])
if not waiter then
  return 0
end
local level, seq = string.match(waiter, '^%S+ (%S+) (%d+) %d+$')
redis.call('ZREM', KEYS[1], level .. ' ' .. seq .. ' ' .. ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
