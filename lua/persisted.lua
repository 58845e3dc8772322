#!lua flags=allow-oom
-- persisted: the booking rows are in the database; drop each admission's pending entry so the
-- reaper leaves it alone. allow-oom: it only frees memory.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:pending  zset  code hash -> admitted-ms
-- ARGV    one or more triples: code hash, nonce, admission id. The database writer marks its
--         whole batch in one call (one call a booking was a command, a script run and a reply
--         each); the marks are independent, so running them together only removes interleavings.
--         A mark changes no record, so every mark's record is read in one HMGET and every entry
--         dropped in one ZREM (two commands a mark cost more than the rest of the call: issue 32).
-- Returns how many pending entries were dropped: for one triple, 1 when it was dropped, 0 when
-- the record is another admission's or the entry was already gone.

-- In chunks of at most CHUNK marks: unpack() passes a value per mark on Lua's stack (8,000 at
-- most), and a database batch may be larger (--persist-batch-max).
local CHUNK = 1000
local dropped = 0
local marks = math.floor(#ARGV / 3)
for first = 1, marks, CHUNK do
  local last = math.min(marks, first + CHUNK - 1)
  local codes = {}
  for m = first, last do
    codes[#codes + 1] = ARGV[m * 3 - 2]
  end
  local records = redis.call('HMGET', KEYS[1], unpack(codes))
  local drop = {}
  for k, record in ipairs(records) do
    if record then
      local m = first + k - 1
      -- The record begins "nonce admission-id ": a prefix test, not a pattern match (nonces and
      -- admission ids have no spaces: Nonce::parse, fresh_admission_id).
      local prefix = ARGV[m * 3 - 1] .. ' ' .. ARGV[m * 3] .. ' '
      if string.sub(record, 1, #prefix) == prefix then
        drop[#drop + 1] = codes[k]
      end
    end
  end
  if #drop > 0 then
    dropped = dropped + redis.call('ZREM', KEYS[2], unpack(drop))
  end
end
return dropped
