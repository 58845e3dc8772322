#!lua flags=allow-oom
-- heal_seats: return to the pool the seats Redis keeps out of it with nobody holding them. A seat
-- leaks when Redis lost its holder, another admission took it, the database refused that one
-- (SeatTaken: the seat stays out of the pool, since the database holds it), and the holder was
-- released before a heal gave its record back: its release found nothing to free. Runs under the
-- event's operator lock.
--
-- KEYS[1] {ev:ID}:adm   hash    code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:free  zset    free seat numbers
-- KEYS[3] {ev:ID}:lock  string  operator lock owner
-- KEYS[4] {ev:ID}:moves hash    code hash -> a move in flight: "id nonce admission old-slot
--                               old-level new-slot new-level"
-- KEYS[5..11] {ev:ID}:pending, :meta, :waitq, :waiters, :allow, :cap, :taken (the waiting list's)
-- ARGV[1] lock owner of this run
-- ARGV[2..] seats that, when the heal read Redis and then the database, were neither free, nor in
--           a record, nor held in the database; then as many fresh admission ids, one for each
--           offer the seats returned may make (lua/with_offer.lua)
--
-- A seat goes back only if it is still out of the pool and no record holds it now (every record
-- is read: this runs only when a heal found a leak). A seat taken since the heal read it is in a
-- record, so it stays. Nor does a seat a move in flight names: its old seat stays the booking's
-- until move_settle.lua frees it (or takes the booking back to it), and is in no record once the
-- record names the new seat; returned here, it would be taken again and then freed a second time
-- by the settle, free and held at once. The room returned goes to the waiting list in the same
-- script, as a release's does (docs/design.md#the-waiting-list).
-- Returns -1 when the lock is not this run's; else {seats returned, offer, offer, ...}, each offer
-- {code hash, nonce, admission id, slot, level, admitted-ms, joined-ms}.

if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return -1
end
local n = (#ARGV - 1) / 2
if n ~= math.floor(n) then
  return redis.error_reply('ERR heal_seats takes the owner, then seats and as many admission ids')
end
local held = {}
for _, record in ipairs(redis.call('HVALS', KEYS[1])) do
  local seat = string.match(record, '^%S+ %S+ (%d+) ')
  if seat then
    held[seat] = true
  end
end
for _, marker in ipairs(redis.call('HVALS', KEYS[4])) do
  local old_seat, new_seat = string.match(marker, '^%S+ %S+ %S+ (%d+) %S+ (%d+) %S+$')
  if old_seat then
    held[old_seat] = true
    held[new_seat] = true
  end
end
local returned, ids = 0, {}
for i = 2, n + 1 do
  local seat = ARGV[i]
  if not held[seat] and not redis.call('ZSCORE', KEYS[2], seat) then
    redis.call('ZADD', KEYS[2], seat, seat)
    returned = returned + 1
    ids[returned] = ARGV[i + n]
  end
end
local offers = offer_room({adm = KEYS[1], pending = KEYS[5], meta = KEYS[6], waitq = KEYS[7], waiters = KEYS[8],
  allow = KEYS[9], cap = KEYS[10], taken = KEYS[11], free = KEYS[2]}, ids)
table.insert(offers, 1, returned)
return offers
