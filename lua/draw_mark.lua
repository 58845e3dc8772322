#!lua
-- draw_mark: runs right after admit.lua in the same MULTI (docs/design.md#the-draw-at-the-opening)
-- and records each drawn entry's outcome, read from what admit.lua left, so an admission and its
-- mark reach a replica together or not at all. No flags: under OOM it is refused whole, as the
-- admit before it was.
--
-- KEYS[1] {ev:ID}:adm  KEYS[2] {ev:ID}:taken  KEYS[3] {ev:ID}:cap  KEYS[4] {ev:ID}:free
-- KEYS[5] {ev:ID}:meta  KEYS[6] {ev:ID}:drawn  hash code hash -> "rank outcome"
-- ARGV    groups of four: code hash, nonce, level, rank
-- An entry with a record of its nonce is `admitted`, of another nonce `already_admitted`; with
-- none, the reason admit.lua had: `closed`, `level_full`, `sold_out`. Within one call admissions
-- only fill levels and empty the pool, so a reason that held for an attempt still holds here.
-- When no reason holds the admit did not run (refused whole): -8, nothing written. No state in
-- meta (Redis lost the event): -7, nothing written. Otherwise the number of marks written.

local n = #ARGV / 4
if n < 1 or n ~= math.floor(n) then
  return redis.error_reply('ERR draw_mark takes groups of four arguments')
end
local meta = redis.call('HMGET', KEYS[5], 'state', 'closes_at_ms')
if meta[1] ~= 'open' and meta[1] ~= 'closed' then
  return -7
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local closed = meta[1] == 'closed' or (meta[2] and now >= tonumber(meta[2]))
local free = redis.call('ZCARD', KEYS[4])
local marks = {}
for i = 1, n do
  local base = i * 4 - 4
  local code, nonce, lvl, rank = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4]
  local record = redis.call('HGET', KEYS[1], code)
  local outcome
  if record then
    outcome = (string.match(record, '^(%S+) ') == nonce) and 'admitted' or 'already_admitted'
  elseif closed then
    outcome = 'closed'
  else
    local cap = redis.call('HGET', KEYS[3], lvl)
    local taken = tonumber(redis.call('HGET', KEYS[2], lvl) or '0')
    if not cap or taken >= tonumber(cap) then
      outcome = 'level_full'
    elseif free == 0 then
      outcome = 'sold_out'
    else
      return -8
    end
  end
  marks[#marks + 1] = code
  marks[#marks + 1] = rank .. ' ' .. outcome
end
redis.call('HSET', KEYS[6], unpack(marks))
return n
