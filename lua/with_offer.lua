-- with_offer: the offer of a freed seat to its level's first waiter. Not a script of its own: it
-- is spliced into every script that frees a seat (release.lua, undo.lua), right after the
-- script's first line (src/redis_io/scripts.rs `with_offer`), so the seat is freed and offered
-- in one script and no admit of a refresher can run in between
-- (docs/design.md#the-waiting-list).
--
-- offer_seat(k, level, slot, id): k holds the key names {adm, pending, meta, waitq, waiters,
-- allow}; level and slot are the freed seat's; id is a fresh admission id for the offer.
-- Call it while the freed record is still in {ev:ID}:adm, so a waiter who is the releasing code
-- itself is skipped, not handed its own seat back.
-- Returns nil when nobody may have the seat (the caller puts it back in the pool), else the
-- offer {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms}: the waiter's
-- admission, written as admit.lua writes one (record and pending entry), so the committer's
-- WAIT, the persister, the arbiter and the reaper treat it as any admission. The level's count
-- is the caller's: the seat passes from one holder to the next in the same level, and with
-- per-level numbering stays in the level's block.
--
-- {ev:ID}:waitq is a sorted set with every score 0 and members "LEVEL SEQ CODE-HASH" (SEQ zero
-- padded), so one level's waiters are one lexical range, in join order; a level name's
-- characters all sort after '!', so "[LEVEL " .. "(LEVEL!" holds that level alone.

-- Waiters skipped (booked meanwhile, removed from the allowlist) before the seat goes back to the
-- pool: a bound on one script's work, far above what a sale meets.
local OFFER_SKIPS_MAX = 100

local function offer_seat(k, level, slot, id)
  local meta = redis.call('HMGET', k.meta, 'state', 'closes_at_ms')
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- The list closes with the sale.
  if meta[1] ~= 'open' or (meta[2] and now >= tonumber(meta[2])) then
    return nil
  end
  for _ = 1, OFFER_SKIPS_MAX do
    local first = redis.call('ZRANGEBYLEX', k.waitq, '[' .. level .. ' ', '(' .. level .. '!', 'LIMIT', 0, 1)
    if #first == 0 then
      return nil
    end
    redis.call('ZREM', k.waitq, first[1])
    local code = string.match(first[1], ' (%S+)$')
    local waiter = redis.call('HGET', k.waiters, code)
    redis.call('HDEL', k.waiters, code)
    -- A waiter gets at most one seat: one who holds a seat now (any level) is dropped, as is one
    -- taken off the allowlist while waiting.
    if waiter and redis.call('HEXISTS', k.adm, code) == 0 and redis.call('SISMEMBER', k.allow, code) == 1 then
      local nonce, joined = string.match(waiter, '^(%S+) %S+ %d+ (%d+)$')
      redis.call('HSET', k.adm, code, string.format('%s %s %s %s %d', nonce, id, slot, level, now))
      redis.call('ZADD', k.pending, now, code)
      return {code, nonce, id, tonumber(slot), level, now, tonumber(joined)}
    end
  end
  return nil
end
