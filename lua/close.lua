-- close: mark a loaded event closed, under the operator lock. An event that is not loaded (never
-- opened, or Redis lost it) is left alone: writing `state` there would create a stub without
-- seats that every later `open` would trip over.
--
-- The waiting list closes with the sale: its entries go (docs/design.md#the-waiting-list). A
-- waiter kept would be offered room after an `open` again, though it may have been answered
-- `closed` meanwhile, and seats freed while closed would be on sale while it waits; dropped, its
-- next poll is answered `closed`, or after an `open` joins again at the end.
--
-- KEYS[1] {ev:ID}:meta     hash    see redis_io/keys.rs
-- KEYS[2] {ev:ID}:lock     string  operator lock owner
-- KEYS[3] {ev:ID}:waitq    zset    the waiting list
-- KEYS[4] {ev:ID}:waiters  hash    its entries by code
-- ARGV[1] lock owner of this run
-- Returns 1 when closed; 0 when the event is not loaded; -1 when the lock is not this run's.

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'closed')
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('HINCRBY', KEYS[1], 'generation', 1)
return 1
