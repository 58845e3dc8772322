#!lua
-- amend: `event apply` while the sale is open. Writes only what cannot break an invariant: a cap
-- raised or a level added (admit.lua reads caps from KEYS[3] on every call), and a later
-- `closes_at_ms` (or none). Everything is checked before anything is written, so a refused
-- change leaves Redis as it was; the catalog of every `serve` re-reads meta and caps within
-- CATALOG_TTL (src/sale/catalog.rs).
--
-- A raised cap is room made, so the room is offered to the waiting list in this same script
-- (lua/with_offer.lua, spliced in), before any refresher's admit can run
-- (docs/design.md#the-waiting-list). The `event apply` process has no offer loop, so each offer
-- is also pushed onto KEYS[11], where the next reaper pass of a `serve` takes it and books it as
-- its own; a `serve` that dies holding it leaves it pending, for the reaper to settle and pass on.
--
-- KEYS[1] {ev:ID}:meta     hash    KEYS[2] {ev:ID}:lock  string    KEYS[3] {ev:ID}:cap  hash
-- KEYS[4] {ev:ID}:waitq    zset    KEYS[5] {ev:ID}:waiters  hash   KEYS[6] {ev:ID}:allow  set
-- KEYS[7] {ev:ID}:adm      hash    KEYS[8] {ev:ID}:pending  zset   KEYS[9] {ev:ID}:taken  hash
-- KEYS[10] {ev:ID}:free    zset    KEYS[11] {ev:ID}:adopt   list   offers for a serve to book,
--          each "CODE-HASH NONCE ADMISSION-ID SLOT LEVEL ADMITTED-MS JOINED-MS"
-- ARGV[1] lock owner of this `event apply` run
-- ARGV[2] closes_at_ms, or "" for none
-- ARGV[3] N, the number of fresh admission ids that follow (the most offers this run makes)
-- ARGV[4 .. 3+N] the ids
-- ARGV[4+N ..] level, cap, level, cap, ...
-- Returns {1, offers made} when written; 0 when the event is not loaded (the next `open` loads
-- the database's values); -1 when the lock is not this run's; -2 when a cap would fall; -3 when
-- closes_at would come earlier.

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if not redis.call('HGET', KEYS[1], 'state') then
  return 0
end
local ids = {}
for i = 4, 3 + tonumber(ARGV[3]) do
  ids[#ids + 1] = ARGV[i]
end
local first_level = 4 + #ids
for i = first_level, #ARGV, 2 do
  local current = redis.call('HGET', KEYS[3], ARGV[i])
  if current and tonumber(ARGV[i + 1]) < tonumber(current) then
    return -2
  end
end
local closes = redis.call('HGET', KEYS[1], 'closes_at_ms')
if ARGV[2] ~= '' and (not closes or tonumber(ARGV[2]) < tonumber(closes)) then
  return -3
end

for i = first_level, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'closes_at_ms')
else
  redis.call('HSET', KEYS[1], 'closes_at_ms', ARGV[2])
end
local offers = offer_room({adm = KEYS[7], pending = KEYS[8], meta = KEYS[1], waitq = KEYS[4], waiters = KEYS[5],
  allow = KEYS[6], cap = KEYS[3], taken = KEYS[9], free = KEYS[10]}, ids)
for _, o in ipairs(offers) do
  redis.call('RPUSH', KEYS[11], string.format('%s %s %s %d %s %d %d', o[1], o[2], o[3], o[4], o[5], o[6], o[7]))
end
return {1, #offers}
