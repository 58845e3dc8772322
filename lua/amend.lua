-- amend: `event apply` while the sale is open. Writes only what cannot break an invariant: a cap
-- raised or a level added (admit.lua reads caps from KEYS[3] on every call), and a later
-- `closes_at_ms` (or none). Everything is checked before anything is written, so a refused
-- change leaves Redis as it was; the catalog of every `serve` re-reads meta and caps within
-- CATALOG_TTL (src/sale/catalog.rs).
--
-- KEYS[1] {ev:ID}:meta  hash    KEYS[2] {ev:ID}:lock  string    KEYS[3] {ev:ID}:cap  hash
-- ARGV[1] lock owner of this `event apply` run
-- ARGV[2] closes_at_ms, or "" for none
-- ARGV[3..] level, cap, level, cap, ...
-- Returns 1 when written; 0 when the event is not loaded (the next `open` loads the database's
-- values); -1 when the lock is not this run's; -2 when a cap would fall; -3 when closes_at would
-- come earlier.

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if not redis.call('HGET', KEYS[1], 'state') then
  return 0
end
for i = 3, #ARGV, 2 do
  local current = redis.call('HGET', KEYS[3], ARGV[i])
  if current and tonumber(ARGV[i + 1]) < tonumber(current) then
    return -2
  end
end
local closes = redis.call('HGET', KEYS[1], 'closes_at_ms')
if ARGV[2] ~= '' and (not closes or tonumber(ARGV[2]) < tonumber(closes)) then
  return -3
end

for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'closes_at_ms')
else
  redis.call('HSET', KEYS[1], 'closes_at_ms', ARGV[2])
end
return 1
