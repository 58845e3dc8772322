#!lua flags=allow-oom
-- persisted: the booking rows are in the database; drop each admission's pending entry so the
-- reaper leaves it alone. allow-oom: it only frees memory.
--
-- KEYS[1] {ev:ID}:adm      hash  code hash -> "nonce admission-id slot level admitted-ms"
-- KEYS[2] {ev:ID}:pending  zset  code hash -> admitted-ms
-- ARGV    one or more triples: code hash, nonce, admission id. The database writer marks its
--         whole batch in one call (one call a booking was a command, a script run and a reply
--         each); the marks are independent, so running them together only removes interleavings.
-- Returns how many pending entries were dropped: for one triple, 1 when it was dropped, 0 when
-- the record is another admission's or the entry was already gone.

local dropped = 0
for i = 1, #ARGV - 2, 3 do
  local code = ARGV[i]
  local record = redis.call('HGET', KEYS[1], code)
  if record then
    local nonce, admission = string.match(record, '^(%S+) (%S+) ')
    if nonce == ARGV[i + 1] and admission == ARGV[i + 2] then
      dropped = dropped + redis.call('ZREM', KEYS[2], code)
    end
  end
end
return dropped
