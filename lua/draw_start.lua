#!lua
-- draw_start: the drawer freezes the entries (docs/design.md#the-draw-at-the-opening). Only the
-- holder of the draw lock, and only at or after decides_at by Redis's clock: draw_enter.lua adds
-- no entry once the state is `started`, so the set the order is computed from is final.
--
-- KEYS[1] {ev:ID}:draw      hash    decides_at_ms, state
-- KEYS[2] {ev:ID}:drawlock  string  the drawer's owner name
-- ARGV[1] owner
-- Returns 1 started (or already), 0 already done, -1 not the lock's owner, -2 before decides_at,
-- -3 no draw configured.

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local draw = redis.call('HMGET', KEYS[1], 'decides_at_ms', 'state')
if not draw[1] then
  return -3
elseif draw[2] == 'done' then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(draw[1]) then
  return -2
end
redis.call('HSET', KEYS[1], 'state', 'started')
return 1
