#!lua
-- draw_enter: a booking attempt while the event's draw is not done (docs/design.md#the-draw-at-the-opening),
-- judged by Redis's clock and the draw's state here, atomically with recording the entry.
--
-- KEYS[1] {ev:ID}:draw     hash  decides_at_ms, commitment, secret, state (absent, started, done)
-- KEYS[2] {ev:ID}:entries  hash  code hash -> "nonce level", one entry per code
-- KEYS[3] {ev:ID}:drawn    hash  code hash -> "rank outcome"
-- KEYS[4] {ev:ID}:adm      hash  code hash -> admission record (nonce first)
-- KEYS[5] {ev:ID}:meta     hash  state, opens_at_ms, closes_at_ms
-- ARGV[1] code hash   ARGV[2] nonce   ARGV[3] level
-- Returns, in this order of checks:
--   {'refused', outcome}  this code's entry, this nonce, was refused by the draw: its final answer
--   {'open'}              go on to the admit script: no draw, the draw is done, or this nonce's
--                         admission exists (check 1 answers it) or was drawn
--   -7 not loaded, -6 closed, -5 before opens_at (as admit.lua's window)
--   {'queued', decides_at_ms}  the code has an entry (any nonce: one entry per code), or this
--                         call recorded it (before decides_at and before a drawer started)
--   {'drawing'}           the window is over, the code has no entry, the draw is not done: retry

local code, nonce = ARGV[1], ARGV[2]
local entry = redis.call('HGET', KEYS[2], code)
local entry_nonce = entry and string.match(entry, '^(%S+) ')
if entry_nonce == nonce then
  local mark = redis.call('HGET', KEYS[3], code)
  local outcome = mark and string.match(mark, '^%d+ (%S+)$')
  if outcome and outcome ~= 'admitted' then
    return {'refused', outcome}
  elseif outcome then
    return {'open'}
  end
end
local draw = redis.call('HMGET', KEYS[1], 'decides_at_ms', 'state')
if not draw[1] or draw[2] == 'done' then
  return {'open'}
end
local record = redis.call('HGET', KEYS[4], code)
if record and string.match(record, '^(%S+) ') == nonce then
  return {'open'}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local meta = redis.call('HMGET', KEYS[5], 'state', 'opens_at_ms', 'closes_at_ms')
if meta[1] ~= 'open' and meta[1] ~= 'closed' then
  return -7
elseif meta[1] == 'closed' or (meta[3] and now >= tonumber(meta[3])) then
  return -6
elseif meta[2] and now < tonumber(meta[2]) then
  return -5
end
if entry then
  return {'queued', draw[1]}
end
if now < tonumber(draw[1]) and draw[2] ~= 'started' then
  redis.call('HSET', KEYS[2], code, nonce .. ' ' .. ARGV[3])
  return {'queued', draw[1]}
end
return {'drawing'}
