#!lua
-- move: the first half of moving a booking to another level (docs/design.md#moving-a-booking).
-- Takes a seat in the new level and rewrites the code's record to it, and keeps the old seat out
-- of the pool and counted in its level, noted in a move marker, until the database has decided:
-- for the length of the move the booking holds both, so neither can be lost nor taken by anyone
-- else. `move_settle.lua` then frees the old seat (the database took the move) or gives the old
-- seat back to the record and frees the new one (it did not). No flags: it takes a seat, so
-- under OOM it is refused whole, as admit.lua is.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held
-- KEYS[3] {ev:ID}:cap      hash  level -> cap
-- KEYS[4] {ev:ID}:free     zset  free seat numbers
-- KEYS[5] {ev:ID}:pending  zset  "code-hash admission-id": admissions not yet in the database
-- KEYS[6] {ev:ID}:moves    hash  code hash -> "move-id nonce admission-id old-slot old-level new-slot new-level"
-- KEYS[7] {ev:ID}:moving   zset  code hash -> when its move began (Redis's clock, ms)
-- KEYS[8] {ev:ID}:meta     hash  with per-level seat numbering base:LEVEL, the new level's block
--                                offset: the new seat is taken from that block, as admit.lua does
-- ARGV[1] code hash  ARGV[2] nonce  ARGV[3] admission id (the booking the database holds)
-- ARGV[4] the new level  ARGV[5] a fresh move id
-- Checks, in this order:
--   the record is not this admission (released, or another booking) -> -1
--   the admission is still pending (not yet in the database)        -> -4
--   a move of the code is in flight                                 -> -5
--   the record is in the new level already                          -> {slot, 0}
--   the new level has no cap                                        -> error "ERR unknown level"
--   the new level is at its cap                                     -> -3
--   no free seat                                                    -> -2
--   moved                                                           -> {new slot, 1}

local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return -1
end
local nonce, admission, slot, level, admitted = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
if nonce ~= ARGV[2] or admission ~= ARGV[3] then
  return -1
end
if redis.call('ZSCORE', KEYS[5], ARGV[1] .. ' ' .. admission) then
  return -4
end
if redis.call('HEXISTS', KEYS[6], ARGV[1]) == 1 then
  return -5
end
local to = ARGV[4]
if level == to then
  return {tonumber(slot), 0}
end
local cap = redis.call('HGET', KEYS[3], to)
if not cap then
  return redis.error_reply('ERR unknown level')
end
if tonumber(redis.call('HGET', KEYS[2], to) or '0') >= tonumber(cap) then
  return -3
end
local seat
local base = redis.call('HGET', KEYS[8], 'base:' .. to)
if base then
  -- The lowest free seat of the new level's room, never one of another level's block.
  local lowest = redis.call('ZRANGEBYSCORE', KEYS[4], tonumber(base) + 1, tonumber(base) + tonumber(cap), 'LIMIT', 0, 1)
  if #lowest == 0 then
    return -2
  end
  seat = lowest[1]
  redis.call('ZREM', KEYS[4], seat)
else
  local popped = redis.call('ZPOPMIN', KEYS[4])
  if #popped == 0 then
    return -2
  end
  seat = popped[1]
end
redis.call('HINCRBY', KEYS[2], to, 1)
redis.call('HSET', KEYS[1], ARGV[1], nonce .. ' ' .. admission .. ' ' .. seat .. ' ' .. to .. ' ' .. admitted)
redis.call('HSET', KEYS[6], ARGV[1],
  ARGV[5] .. ' ' .. nonce .. ' ' .. admission .. ' ' .. slot .. ' ' .. level .. ' ' .. seat .. ' ' .. to)
local now = redis.call('TIME')
redis.call('ZADD', KEYS[7], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[1])
return {tonumber(seat), 1}
