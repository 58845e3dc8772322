#!lua
-- admit: one or more booking attempts for one event, each decided atomically and in order, as if
-- each were a call of its own with nothing in between. No flags: under OOM Redis refuses the call
-- whole, before it runs, so a full Redis never half-admits.
--
-- A committer round sends its admits in one call. The script then reads each key once and writes
-- each once, whatever the number of attempts: one redis.call costs about as much as the rest of
-- an attempt, and it was eight an attempt (issue 10). Every attempt's checks and reply are those
-- it would have had alone, and the keys end as the attempts one after another would leave them
-- (tests/model/lua_match.rs checks both against the model); a batch only removes interleavings.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held in that level (pending, persisted or paid)
-- KEYS[3] {ev:ID}:cap      hash  level -> cap
-- KEYS[4] {ev:ID}:free     zset  free seat numbers, score = seat number
-- KEYS[5] {ev:ID}:pending  zset  "code-hash admission-id" -> admitted-ms, admissions not yet in the
--                                database (named by their admission, so the database writer's mark
--                                is a plain ZREM that can only drop its own: issue 32)
-- KEYS[6] {ev:ID}:meta     hash  state ("open" once switched in, "closed"), opens_at_ms, closes_at_ms,
--                                and with per-level seat numbering base:LEVEL, the level's block
--                                offset: its seats are base+1 .. base+cap (docs/design.md#seat-numbering)
-- ARGV    one or more groups of five:
--   code hash; nonce; level; admission id, fresh for this attempt (kept only if it admits);
--   mode: "admit", or "retry-only" when a gate (window, allowlist) refuses the request unless it
--   is a retry: then only check 1 may answer, and anything else is -4, writing nothing.
--
-- Checks, in this order (docs/design.md#the-admit-script):
--   1. admitted with this nonce  -> {slot, admitted-ms, admission-id, level} of the original
--   2. outside the sale window, by Redis's clock and the event's state here:
--      not loaded (no state: Redis lost the event) -> -7, before opens_at -> -5,
--      closed or at/after closes_at -> -6
--   3. admitted with other nonce -> -1
--   4. level at its cap          -> -3
--   5. no free seat              -> -2 (per-level numbering: none free in the level's block)
--   6. admit                     -> {slot, admitted-ms, admission-id, level}: the lowest free
--                                   seat, of the level's block with per-level numbering
-- The gates in front check the window too, from each serve's cached view and clock; this check is
-- the one that holds when a cache is stale or a host's clock runs ahead.
-- With "retry-only", anything but check 1 -> -4 (the gate's refusal stands).
-- Error "ERR unknown level" when the level has no cap (the HTTP gate refuses it first); it is
-- that attempt's reply alone and writes nothing.
-- Returns one reply per group, in order. Malformed ARGV is an error for the whole call, before
-- anything is read or written.

-- At most 1,000 attempts: unpack() below passes a value per attempt on Lua's stack.
local n = #ARGV / 5
if n < 1 or n ~= math.floor(n) or n > 1000 then
  return redis.error_reply('ERR admit takes 1 to 1000 groups of five arguments')
end
local codes = {}
for i = 1, n do
  local mode = ARGV[i * 5]
  if mode ~= 'admit' and mode ~= 'retry-only' then
    return redis.error_reply('ERR admit mode must be admit or retry-only')
  end
  codes[i] = ARGV[i * 5 - 4]
end

-- Records as they stand after the attempts so far: Redis's, then this call's.
local records = {}
local found = redis.call('HMGET', KEYS[1], unpack(codes))
for i = 1, n do
  if found[i] then
    records[codes[i]] = found[i]
  end
end
local free = redis.call('ZCARD', KEYS[4])
-- Per level the call names: its cap (false when it has none), its seats held so far, and with
-- per-level numbering its block's offset and free seats (a level without a base takes from the
-- whole pool). Read for every level at once, one HMGET a hash, not three HGETs a level: nothing
-- is written before the end, so a read up front sees what a read at the first attempt would.
local levels, caps, taken, added, bases, level_free = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local lvl = ARGV[i * 5 - 2]
  if added[lvl] == nil then
    added[lvl] = 0
    levels[#levels + 1] = lvl
  end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- The window: false while fresh admissions may go on, else the refusal they all get.
local window = false
local meta_fields = {'state', 'opens_at_ms', 'closes_at_ms'}
for k, lvl in ipairs(levels) do
  meta_fields[3 + k] = 'base:' .. lvl
end
local meta = redis.call('HMGET', KEYS[6], unpack(meta_fields))
local cap_of = redis.call('HMGET', KEYS[3], unpack(levels))
local taken_of = redis.call('HMGET', KEYS[2], unpack(levels))
for k, lvl in ipairs(levels) do
  caps[lvl] = cap_of[k]
  taken[lvl] = tonumber(taken_of[k] or '0')
  if cap_of[k] and meta[3 + k] then
    bases[lvl] = tonumber(meta[3 + k])
    level_free[lvl] = redis.call('ZCOUNT', KEYS[4], bases[lvl] + 1, bases[lvl] + tonumber(cap_of[k]))
  end
end
if meta[1] ~= 'open' and meta[1] ~= 'closed' then
  window = -7
elseif meta[1] == 'closed' or (meta[3] and now >= tonumber(meta[3])) then
  window = -6
elseif meta[2] and now < tonumber(meta[2]) then
  window = -5
end

local replies, admitted, written = {}, {}, {}
for i = 1, n do
  local base = i * 5 - 5
  local code, nonce, lvl, id = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4]
  local retry_only = ARGV[base + 5] == 'retry-only'
  local record = records[code]
  local reply
  if record then
    -- A table: admitted earlier in this call, its seat known once the seats are popped.
    local in_call = type(record) == 'table'
    local held_nonce, admission, slot, level, at
    if in_call then
      held_nonce = record.nonce
    else
      held_nonce, admission, slot, level, at = string.match(record, '^(%S+) (%S+) (%d+) (%S+) (%d+)$')
    end
    if held_nonce == nonce then
      if in_call then
        reply = record
      else
        -- Rewrite the same value: the WAIT after this call then covers the original write too.
        written[#written + 1] = code
        reply = {tonumber(slot), tonumber(at), admission, level}
      end
    elseif retry_only then
      reply = -4
    elseif window then
      reply = window
    else
      reply = -1
    end
  elseif retry_only then
    reply = -4
  elseif window then
    reply = window
  else
    if not caps[lvl] then
      reply = {err = 'ERR unknown level'}
    elseif taken[lvl] >= tonumber(caps[lvl]) then
      reply = -3
    elseif (bases[lvl] and level_free[lvl] or free) == 0 then
      reply = -2
    else
      -- The seat is the next of the lowest free ones (of the level's block), popped together below.
      free = free - 1
      if bases[lvl] then
        level_free[lvl] = level_free[lvl] - 1
      end
      taken[lvl] = taken[lvl] + 1
      added[lvl] = added[lvl] + 1
      admitted[#admitted + 1] = i
      written[#written + 1] = code
      reply = {nonce = nonce, id = id, level = lvl, attempt = i}
      records[code] = reply
    end
  end
  replies[i] = reply
end

if #admitted > 0 then
  -- Seats for the whole pool's attempts come from one ZPOPMIN; a block's, from one range read
  -- and one ZREM per level. Either way each attempt takes the next lowest, in attempt order.
  local pool, blocks, popped = {}, {}, {}
  local whole = 0
  for _, i in ipairs(admitted) do
    if not bases[replies[i].level] then
      whole = whole + 1
    end
  end
  if whole > 0 then
    local seats = redis.call('ZPOPMIN', KEYS[4], string.format('%d', whole))
    for k = 1, whole do
      pool[k] = seats[2 * k - 1]
    end
  end
  for lvl, base in pairs(bases) do
    if added[lvl] > 0 then
      blocks[lvl] = redis.call('ZRANGEBYSCORE', KEYS[4], base + 1, base + tonumber(caps[lvl]), 'LIMIT', 0, added[lvl])
      redis.call('ZREM', KEYS[4], unpack(blocks[lvl]))
      popped[lvl] = 0
    end
  end
  local pending = {}
  local next_whole = 0
  -- Concatenation, and the clock turned to text once: string.format calls sprintf for every
  -- item, five an admission (issue 32). Numbers handed to redis.call are text too: Redis 7.0
  -- turns each Lua number argument into text with a "%.17g" snprintf, about 3,000 instructions
  -- a number, so the scores are the clock's text and the counts are formatted as integers.
  local at = string.format('%d', now)
  for _, i in ipairs(admitted) do
    local code, a = codes[i], replies[i]
    local seat
    if bases[a.level] then
      popped[a.level] = popped[a.level] + 1
      seat = blocks[a.level][popped[a.level]]
    else
      next_whole = next_whole + 1
      seat = pool[next_whole]
    end
    records[code] = a.nonce .. ' ' .. a.id .. ' ' .. seat .. ' ' .. a.level .. ' ' .. at
    a.reply = {tonumber(seat), now, a.id, a.level}
    pending[#pending + 1] = at
    pending[#pending + 1] = code .. ' ' .. a.id
  end
  -- Every level's new count in one HSET, from the count read above: nothing else wrote it since.
  local counts = {}
  for _, lvl in ipairs(levels) do
    if added[lvl] > 0 then
      counts[#counts + 1] = lvl
      counts[#counts + 1] = string.format('%d', taken[lvl])
    end
  end
  redis.call('HSET', KEYS[2], unpack(counts))
  redis.call('ZADD', KEYS[5], unpack(pending))
end
if #written > 0 then
  local fields = {}
  for _, code in ipairs(written) do
    fields[#fields + 1] = code
    fields[#fields + 1] = records[code]
  end
  redis.call('HSET', KEYS[1], unpack(fields))
end
-- An attempt admitted in this call, and any same-nonce retry of it, answer with its seat.
for i = 1, n do
  if type(replies[i]) == 'table' and replies[i].attempt then
    replies[i] = replies[i].reply
  end
end
return replies
