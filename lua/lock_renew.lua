-- lock_renew: extend or release the per-event operator lock, only for its owner, so a command
-- whose lock expired and was taken by another never extends or deletes the other's lock.
--
-- KEYS[1] {ev:ID}:lock  string  owner of the lock
-- ARGV[1] owner (as written by SET NX when the lock was taken)
-- ARGV[2] new expiry in milliseconds, or 0 to release
-- Returns 1 when the lock was ours (and is now extended or released), 0 when it was not.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
