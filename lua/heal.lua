#!lua flags=allow-oom
-- heal: give Redis back the bookings the database holds and Redis lost (a promoted replica that
-- missed acknowledged writes, a primary restarted from an old snapshot). Runs under the event's
-- operator lock, so no `open` switch or repair runs meanwhile. allow-oom: a Redis that lost data
-- may also be full, and the heal must still run.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:taken    hash  level -> seats held
-- KEYS[3] {ev:ID}:free     zset  free seat numbers
-- KEYS[4] {ev:ID}:lock     string  operator lock owner
-- KEYS[5] {ev:ID}:moves    hash  code hash -> a move in flight (move.lua's marker)
-- ARGV[1] lock owner of this run
-- ARGV    then groups of four, one per database holder Redis has no record for when the heal
--         read it: code hash; its record; level; seat
--
-- Each group is applied only if the code still has no record: a code admitted afresh since the
-- heal read Redis is in flight, and the arbiter settles it first (the next heal brings the holder
-- back). Nor while another record holds the seat: Redis handed it to an admission still in
-- flight, and a record written beside it would share the seat, so the undo of that admission
-- (a short WAIT, the reaper) would put back in the pool a seat this holder keeps. That admission
-- is settled first too (the database refuses it: SeatTaken), and the next heal restores the
-- holder. Nor while the code has a move in flight: the heal read the database before or after
-- the move's own write, and move_settle.lua decides from the record it finds, so a record put
-- back from a stale read would be left in place (counted in a level the booking has left); the
-- settle comes first and the next heal restores what is still missing. An applied group writes the record, counts the seat in its level and takes the seat
-- out of the pool (a seat out of the pool and held by no record, a leaked one, is taken as is). Seats Redis counts with nobody holding them are not this script's: their
-- records go through release.lua, guarded by nonce and admission id.
-- Returns -1 when the lock is not this run's (nothing written); else one 0/1 per group.

if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return -1
end
local n = (#ARGV - 1) / 4
if n ~= math.floor(n) or n > 1000 then
  return redis.error_reply('ERR heal takes the owner and up to 1000 groups of four arguments')
end
-- The seats the records hold, read once and only if some group's seat is out of the pool.
local held_by_records
local function held(seat)
  if not held_by_records then
    held_by_records = {}
    for _, r in ipairs(redis.call('HVALS', KEYS[1])) do
      local slot = string.match(r, '^%S+ %S+ (%d+) ')
      if slot then
        held_by_records[slot] = true
      end
    end
  end
  return held_by_records[seat] == true
end
local applied = {}
for i = 0, n - 1 do
  local code, record, level, seat = ARGV[2 + i * 4], ARGV[3 + i * 4], ARGV[4 + i * 4], ARGV[5 + i * 4]
  -- The code's record first: a busy sale's every sweep finds holders admitted since it read
  -- Redis, whose seats are out of the pool, and for each the seat check would read every record
  -- (HVALS, a pattern match a record: a third of a second on the primary at 300,000 records,
  -- issue 32). Such a group is left whatever its seat, so the seat is looked at only without one.
  local unrecorded = redis.call('HEXISTS', KEYS[1], code) == 0
  local seat_in_use = unrecorded and not redis.call('ZSCORE', KEYS[3], seat) and held(seat)
  local moving = unrecorded and redis.call('HEXISTS', KEYS[5], code) == 1
  if unrecorded and not seat_in_use and not moving and redis.call('HSETNX', KEYS[1], code, record) == 1 then
    if held_by_records then
      held_by_records[seat] = true
    end
    redis.call('HINCRBY', KEYS[2], level, 1)
    redis.call('ZREM', KEYS[3], seat)
    applied[#applied + 1] = 1
  else
    applied[#applied + 1] = 0
  end
end
return applied
