#!lua
-- admit: one or more booking attempts for one event, each decided atomically and in order, as if
-- each were a call of its own with nothing in between. No flags: under OOM Redis refuses the call
-- whole, before it runs, so a full Redis never half-admits.
--
-- A committer round sends its admits in one call (one call an admit was a command, a script run
-- and a reply each: most of the primary's work). Every attempt's checks, writes and reply are
-- those it would have had alone; a batch only removes interleavings (tests/model/MODEL.md).
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held in that level (pending, persisted or paid)
-- KEYS[3] {ev:ID}:cap      hash  level -> cap
-- KEYS[4] {ev:ID}:free     zset  free seat numbers, score = seat number
-- KEYS[5] {ev:ID}:pending  zset  code hash -> admitted-ms, admissions not yet in the database
-- ARGV    one or more groups of five:
--   code hash; nonce; level; admission id, fresh for this attempt (kept only if it admits);
--   mode: "admit", or "retry-only" when a gate (window, allowlist) refuses the request unless it
--   is a retry: then only check 1 may answer, and anything else is -4, writing nothing.
--
-- Checks, in this order (DESIGN.md):
--   1. admitted with this nonce  -> {slot, admitted-ms, admission-id, level} of the original
--   2. admitted with other nonce -> -1
--   3. level at its cap          -> -3
--   4. no free seat              -> -2
--   5. admit                     -> {slot, admitted-ms, admission-id, level}
-- With "retry-only", anything but check 1 -> -4 (the gate's refusal stands).
-- Error "ERR unknown level" when the level has no cap (the HTTP gate refuses it first); it is
-- that attempt's reply alone and writes nothing.
-- Returns one reply per group, in order. Malformed ARGV is an error for the whole call, before
-- anything is written.

if #ARGV == 0 or #ARGV % 5 ~= 0 then
  return redis.error_reply('ERR admit takes groups of five arguments')
end
for i = 5, #ARGV, 5 do
  if ARGV[i] ~= 'admit' and ARGV[i] ~= 'retry-only' then
    return redis.error_reply('ERR admit mode must be admit or retry-only')
  end
end

local function admit(code, nonce, lvl, id, retry_only)
  local record = redis.call('HGET', KEYS[1], code)
  if record then
    local held_nonce, admission, slot, level, at = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
    if held_nonce == nonce then
      -- Rewrite the same value: the WAIT after this call then covers the original write too.
      redis.call('HSET', KEYS[1], code, record)
      return {tonumber(slot), tonumber(at), admission, level}
    end
    if retry_only then
      return -4
    end
    return -1
  end
  if retry_only then
    return -4
  end

  local cap = redis.call('HGET', KEYS[3], lvl)
  if not cap then
    return {err = 'ERR unknown level'}
  end
  local taken = tonumber(redis.call('HGET', KEYS[2], lvl) or '0')
  if taken >= tonumber(cap) then
    return -3
  end

  local seat = redis.call('ZPOPMIN', KEYS[4])
  if #seat == 0 then
    return -2
  end

  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HINCRBY', KEYS[2], lvl, 1)
  redis.call('HSET', KEYS[1], code, string.format('%s %s %s %s %d', nonce, id, seat[1], lvl, now))
  redis.call('ZADD', KEYS[5], now, code)
  return {tonumber(seat[1]), now, id, lvl}
end

local replies = {}
for i = 1, #ARGV, 5 do
  replies[#replies + 1] = admit(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4] == 'retry-only')
end
return replies
