-- allow_remove: takes codes off an event's allowlist while the sale runs. The live set loses them
-- (so a `serve` asking Redis, `--allowlist-in-memory false`, refuses them at once), and each is
-- noted in KEYS[3] with the `allow_version` it was removed from: a `serve` holding that version
-- in memory drops them from its copy when it sees `allow_removed` move (src/sale/allowlist.rs).
-- A later `open` stamps a new version from the database, which no longer lists them, so the
-- notes of older versions are read past, and a code imported again after its removal is let in.
-- Admission records are not touched: a code that holds a seat keeps it.
--
-- KEYS[1] {ev:ID}:meta  hash    KEYS[2] {ev:ID}:allow  set    KEYS[3] {ev:ID}:allow_removed  hash
-- KEYS[4] {ev:ID}:lock  string
-- ARGV[1] lock owner of this run; ARGV[2..] code hashes
-- Returns how many were in the live set; -1 when the event is not loaded (nothing to do: the next
-- `open` loads the database's allowlist); -2 when the lock is not this run's.

if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return -2
end
local version = redis.call('HGET', KEYS[1], 'allow_version')
if not version then
  return -1
end
local removed = 0
for i = 2, #ARGV do
  removed = removed + redis.call('SREM', KEYS[2], ARGV[i])
  redis.call('HSET', KEYS[3], ARGV[i], version)
end
redis.call('HINCRBY', KEYS[1], 'allow_removed', 1)
return removed
