-- with_offer: the offer of room to the waiting list. Not a script of its own: it is spliced into
-- every script that makes room in a level — frees a seat or a level's count (release.lua,
-- undo.lua, move_settle.lua, heal_seats.lua) — right after the script's first line
-- (src/redis_io/scripts.rs `with_offer`), so the room is made and offered in one script and no
-- admit of a refresher can run in between (docs/design.md#the-waiting-list).
--
-- offer_room(k, ids): k holds the key names {adm, pending, meta, waitq, waiters, allow, cap,
-- taken, free}; ids are fresh admission ids, one for each offer it may make. Call it once the
-- script has put its seats back in the pool and taken its counts down, and while a freed record
-- is still in {ev:ID}:adm, so a waiter who is the releasing code itself is skipped, not handed a
-- seat again.
--
-- It restores the fourth invariant whatever made the room: while a level with room (under its cap,
-- and a free seat in what it may take: its block with per-level numbering, the whole pool
-- otherwise) has a waiter, the earliest such waiter of all levels gets the lowest seat that level
-- may take. With event-wide numbering a seat freed in one level is thus offered to another level's
-- waiter when its own level has none, or a later one. Each offer is the waiter's admission,
-- written as admit.lua writes one (record, pending entry, the level's count up, the seat out of the
-- pool), so the committer's WAIT, the persister, the arbiter and the reaper treat it as any
-- admission.
-- Returns the offers, each {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms}.
--
-- {ev:ID}:waitq is a sorted set with every score 0 and members "LEVEL SEQ CODE-HASH" (SEQ zero
-- padded, one counter for the event), so one level's waiters are one lexical range, in join order,
-- and SEQ orders waiters of different levels; a level name's characters all sort after '!', so
-- "[LEVEL " .. "(LEVEL!" holds that level alone.

-- Waiters skipped (booked meanwhile, removed from the allowlist) in one run, before the room stays
-- on sale: a bound on one script's work, far above what a sale meets.
local OFFER_SKIPS_MAX = 100

local function offer_room(k, ids)
  if #ids == 0 or redis.call('ZCARD', k.waitq) == 0 then
    return {}
  end
  local meta = redis.call('HMGET', k.meta, 'state', 'closes_at_ms')
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- The list closes with the sale.
  if meta[1] ~= 'open' or (meta[2] and now >= tonumber(meta[2])) then
    return {}
  end
  local levels, caps, taken, bases = {}, {}, {}, {}
  local cap_fields = redis.call('HGETALL', k.cap)
  for i = 1, #cap_fields, 2 do
    local level = cap_fields[i]
    levels[#levels + 1] = level
    caps[level] = tonumber(cap_fields[i + 1])
    taken[level] = tonumber(redis.call('HGET', k.taken, level) or '0')
    local base = redis.call('HGET', k.meta, 'base:' .. level)
    bases[level] = base and tonumber(base)
  end
  -- The lowest seat `level` may take now, or nil.
  local function free_seat(level)
    local seat
    if bases[level] then
      seat = redis.call('ZRANGEBYSCORE', k.free, bases[level] + 1, bases[level] + caps[level], 'LIMIT', 0, 1)[1]
    else
      seat = redis.call('ZRANGE', k.free, 0, 0)[1]
    end
    return seat
  end
  -- The earliest waiter of the levels with room: its entry, level and seat.
  local function first_with_room()
    local best, best_level, best_seat
    for _, level in ipairs(levels) do
      if taken[level] < caps[level] then
        local seat = free_seat(level)
        local first = seat and redis.call('ZRANGEBYLEX', k.waitq, '[' .. level .. ' ', '(' .. level .. '!', 'LIMIT', 0, 1)[1]
        if first and (not best or string.match(first, ' (%d+) ') < string.match(best, ' (%d+) ')) then
          best, best_level, best_seat = first, level, seat
        end
      end
    end
    return best, best_level, best_seat
  end
  local offers, skips = {}, 0
  while #offers < #ids and skips <= OFFER_SKIPS_MAX do
    local entry, level, seat = first_with_room()
    if not entry then
      break
    end
    redis.call('ZREM', k.waitq, entry)
    local code = string.match(entry, ' (%S+)$')
    local waiter = redis.call('HGET', k.waiters, code)
    redis.call('HDEL', k.waiters, code)
    -- A waiter gets at most one seat: one who holds a seat now (any level) is dropped, as is one
    -- taken off the allowlist while waiting.
    if waiter and redis.call('HEXISTS', k.adm, code) == 0 and redis.call('SISMEMBER', k.allow, code) == 1 then
      local nonce, joined = string.match(waiter, '^(%S+) %S+ %d+ (%d+)$')
      local id = ids[#offers + 1]
      redis.call('ZREM', k.free, seat)
      redis.call('HINCRBY', k.taken, level, 1)
      taken[level] = taken[level] + 1
      redis.call('HSET', k.adm, code, string.format('%s %s %s %s %d', nonce, id, seat, level, now))
      redis.call('ZADD', k.pending, now, code .. ' ' .. id)
      offers[#offers + 1] = {code, nonce, id, tonumber(seat), level, now, tonumber(joined)}
    else
      skips = skips + 1
    end
  end
  return offers
end
