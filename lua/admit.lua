#!lua
-- admit: one booking attempt, decided atomically. No flags: under OOM Redis refuses it whole,
-- before it runs, so a full Redis never half-admits.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held in that level (pending, persisted or paid)
-- KEYS[3] {ev:ID}:cap      hash  level -> cap
-- KEYS[4] {ev:ID}:free     zset  free seat numbers, score = seat number
-- KEYS[5] {ev:ID}:pending  zset  code hash -> admitted-ms, admissions not yet in the database
-- ARGV[1] code hash
-- ARGV[2] nonce
-- ARGV[3] level
-- ARGV[4] admission id, fresh for this call (kept only if this call admits)
-- ARGV[5] optional: "retry-only" when a gate (window, allowlist) refuses the request unless it
--         is a retry: then only check 1 may answer, and anything else returns -4, writing nothing.
--
-- Checks, in this order (DESIGN.md):
--   1. admitted with this nonce  -> {slot, admitted-ms, admission-id, level} of the original
--   2. admitted with other nonce -> -1
--   3. level at its cap          -> -3
--   4. no free seat              -> -2
--   5. admit                     -> {slot, admitted-ms, admission-id, level}
-- With "retry-only", anything but check 1 -> -4 (the gate's refusal stands).
-- Error reply "ERR unknown level" when the level has no cap (the HTTP gate refuses it first).

local record = redis.call('HGET', KEYS[1], ARGV[1])
if record then
  local nonce, admission, slot, level, at = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
  if nonce == ARGV[2] then
    -- Rewrite the same value: the WAIT after this call then covers the original write too.
    redis.call('HSET', KEYS[1], ARGV[1], record)
    return {tonumber(slot), tonumber(at), admission, level}
  end
  if ARGV[5] == 'retry-only' then
    return -4
  end
  return -1
end
if ARGV[5] == 'retry-only' then
  return -4
end

local cap = redis.call('HGET', KEYS[3], ARGV[3])
if not cap then
  return redis.error_reply('ERR unknown level')
end
local taken = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if taken >= tonumber(cap) then
  return -3
end

local seat = redis.call('ZPOPMIN', KEYS[4])
if #seat == 0 then
  return -2
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%s %s %s %s %d', ARGV[2], ARGV[4], seat[1], ARGV[3], now))
redis.call('ZADD', KEYS[5], now, ARGV[1])
return {tonumber(seat[1]), now, ARGV[4], ARGV[3]}
