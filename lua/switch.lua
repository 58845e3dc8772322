-- switch: `open`'s atomic step. Renames the keys one `open` run staged into place and writes the
-- caps and meta, but only while that run still holds the operator lock and the event is still in
-- the state the run read before staging; otherwise it changes nothing, and `open` is run again.
--
-- KEYS[1]  {ev:ID}:meta     hash    see redis_io/keys.rs
-- KEYS[2]  {ev:ID}:lock     string  operator lock owner
-- KEYS[3]  {ev:ID}:cap      hash    level -> cap
-- KEYS[4]  {ev:ID}:allow    set     live allowlist
-- KEYS[5]  allow, staged by this run
-- KEYS[6]  {ev:ID}:free     zset    free seat numbers
-- KEYS[7]  free, staged by this run (rebuild only)
-- KEYS[8]  {ev:ID}:taken    hash    level -> seats held
-- KEYS[9]  taken, staged by this run (rebuild only)
-- KEYS[10] {ev:ID}:adm      hash    admission records
-- KEYS[11] adm, staged by this run (rebuild only)
-- KEYS[12] {ev:ID}:pending  zset    admissions not yet in the database
-- KEYS[13] {ev:ID}:levels   hash    code hash -> levels it may book (restricted codes only)
-- KEYS[14] levels, staged by this run (absent when no code is restricted)
-- ARGV[1]  lock owner of this run
-- ARGV[2]  "rebuild" (the event was not loaded: install seats, counters and records too) or
--          "refresh" (loaded: replace the allowlist, caps, window; resize the seat pool)
-- ARGV[3]  refresh: the meta generation the run read ("" when the field was absent)
-- ARGV[4]  refresh: the total_seats the run read
-- ARGV[5]  total_seats    ARGV[6] hold_seconds
-- ARGV[7]  opens_at_ms or ""    ARGV[8] closes_at_ms or ""
-- ARGV[9]  allow_version (fresh per run)    ARGV[10] opened_at_ms
-- ARGV[11] the levels' display fields as JSON (level -> {name, starts_at_ms, venue}), or ""
-- ARGV[12..] level, cap, base, level, cap, base, ...: base is the level's seat block offset
--          with per-level numbering (meta field base:LEVEL, read by admit.lua), "" for event-wide
-- Returns 1 when switched; -1 when the lock is not this run's; -2 when the event changed since
-- the run read it (loaded by another open, closed, or wiped).

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local loaded = redis.call('EXISTS', KEYS[1]) == 1
local generation = 0
if ARGV[2] == 'rebuild' then
  if loaded then
    return -2
  end
else
  if not loaded then
    return -2
  end
  local read = redis.call('HGET', KEYS[1], 'generation') or ''
  if read ~= ARGV[3] or redis.call('HGET', KEYS[1], 'total_seats') ~= ARGV[4] then
    return -2
  end
  generation = tonumber(read) or 0
end

-- RENAME keeps the staged key's expiry (set so a crashed run leaves no garbage): drop it.
local function install(staged, live)
  if redis.call('EXISTS', staged) == 1 then
    redis.call('RENAME', staged, live)
    redis.call('PERSIST', live)
  else
    redis.call('DEL', live)
  end
end

install(KEYS[5], KEYS[4])
install(KEYS[14], KEYS[13])
local total = tonumber(ARGV[5])
if ARGV[2] == 'rebuild' then
  install(KEYS[7], KEYS[6])
  install(KEYS[9], KEYS[8])
  install(KEYS[11], KEYS[10])
  redis.call('DEL', KEYS[12])
else
  local old = tonumber(ARGV[4])
  for seat = old + 1, total do
    redis.call('ZADD', KEYS[6], seat, seat)
  end
  if total < old then
    redis.call('ZREMRANGEBYSCORE', KEYS[6], total + 1, '+inf')
  end
end

redis.call('DEL', KEYS[3])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 5) == 'base:' then
    redis.call('HDEL', KEYS[1], field)
  end
end
for i = 12, #ARGV, 3 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] ~= '' then
    redis.call('HSET', KEYS[1], 'base:' .. ARGV[i], ARGV[i + 2])
  end
end
if redis.call('EXISTS', KEYS[13]) == 1 then
  redis.call('HSET', KEYS[1], 'restricted', '1')
else
  redis.call('HDEL', KEYS[1], 'restricted')
end
if ARGV[11] == '' then redis.call('HDEL', KEYS[1], 'sessions') else redis.call('HSET', KEYS[1], 'sessions', ARGV[11]) end
redis.call('HSET', KEYS[1], 'total_seats', ARGV[5], 'hold_seconds', ARGV[6], 'state', 'open',
  'opened_at_ms', ARGV[10], 'allow_version', ARGV[9], 'generation', generation + 1)
if ARGV[7] == '' then redis.call('HDEL', KEYS[1], 'opens_at_ms') else redis.call('HSET', KEYS[1], 'opens_at_ms', ARGV[7]) end
if ARGV[8] == '' then redis.call('HDEL', KEYS[1], 'closes_at_ms') else redis.call('HSET', KEYS[1], 'closes_at_ms', ARGV[8]) end
return 1
