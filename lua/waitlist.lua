#!lua
-- waitlist: a candidate joins the waiting list of a level that has no room, or asks where it
-- stands (docs/design.md#the-waiting-list). No flags: under OOM Redis refuses the call whole.
-- The offer itself is made by the scripts that free a seat (lua/with_offer.lua).
--
-- KEYS[1] {ev:ID}:adm      hash    code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash    level -> seats held
-- KEYS[3] {ev:ID}:cap      hash    level -> cap
-- KEYS[4] {ev:ID}:free     zset    free seat numbers
-- KEYS[5] {ev:ID}:meta     hash    state, opens_at_ms, closes_at_ms, base:LEVEL (per-level numbering)
-- KEYS[6] {ev:ID}:waitq    zset    every score 0, members "LEVEL SEQ CODE-HASH": per level, in join order
-- KEYS[7] {ev:ID}:waiters  hash    code hash -> "nonce level seq joined-ms"
-- KEYS[8] {ev:ID}:waitseq  string  the last join's sequence number
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] level
-- ARGV[4] most waiters the event's list holds
--
-- Checks, in this order:
--   1. the code holds a seat with this nonce (a seat offered to it, or booked) ->
--      {slot, admitted-ms, admission-id, level}, as admit.lua's check 1: the caller books it as
--      a retry of this nonce
--   2. the code holds a seat with another nonce -> -1 (already admitted)
--   3. the window, as admit.lua judges it: not loaded -> -7, before opens_at -> -5, closed or
--      at/after closes_at -> -6 (the list closes with the sale)
--   4. the code waits already -> {position, level} of its entry, whatever this nonce: one entry
--      per code
--   5. the level has no cap -> the error "ERR unknown level"
--   6. the level has room now (under its cap and a free seat, in its block with per-level
--      numbering) -> -9 (seats available: book instead)
--   7. the event's list holds ARGV[4] waiters -> -10 (waitlist full)
--   8. join at the end of the level's list -> {position, level, 1}: the caller answers only once
--      a replica has the join (its `WAIT`), so a promotion cannot lose a place it was told
-- position is 1 for the level's first waiter.

local code, nonce, level = ARGV[1], ARGV[2], ARGV[3]
local record = redis.call('HGET', KEYS[1], code)
if record then
  local held_nonce, admission, slot, held_level, at = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
  if held_nonce == nonce then
    return {tonumber(slot), tonumber(at), admission, held_level}
  end
  return -1
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local meta = redis.call('HMGET', KEYS[5], 'state', 'opens_at_ms', 'closes_at_ms', 'base:' .. level)
if meta[1] ~= 'open' and meta[1] ~= 'closed' then
  return -7
elseif meta[1] == 'closed' or (meta[3] and now >= tonumber(meta[3])) then
  return -6
elseif meta[2] and now < tonumber(meta[2]) then
  return -5
end

local function position(entry_level, member)
  return {redis.call('ZLEXCOUNT', KEYS[6], '[' .. entry_level .. ' ', '[' .. member), entry_level}
end

local waiter = redis.call('HGET', KEYS[7], code)
if waiter then
  local waiting_level, seq = string.match(waiter, '^%S+ (%S+) (%d+) %d+$')
  return position(waiting_level, waiting_level .. ' ' .. seq .. ' ' .. code)
end

local cap = redis.call('HGET', KEYS[3], level)
if not cap then
  return redis.error_reply('ERR unknown level')
end
if tonumber(redis.call('HGET', KEYS[2], level) or '0') < tonumber(cap) then
  local free
  if meta[4] then
    free = redis.call('ZCOUNT', KEYS[4], tonumber(meta[4]) + 1, tonumber(meta[4]) + tonumber(cap))
  else
    free = redis.call('ZCARD', KEYS[4])
  end
  if free > 0 then
    return -9
  end
end
if redis.call('ZCARD', KEYS[6]) >= tonumber(ARGV[4]) then
  return -10
end

local seq = string.format('%015d', redis.call('INCR', KEYS[8]))
local member = level .. ' ' .. seq .. ' ' .. code
redis.call('ZADD', KEYS[6], 0, member)
redis.call('HSET', KEYS[7], code, string.format('%s %s %s %d', nonce, level, seq, now))
local joined = position(level, member)
joined[3] = 1
return joined
