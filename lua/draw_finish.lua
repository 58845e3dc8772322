#!lua
-- draw_finish: the draw is done once every entry has its mark (docs/design.md#the-draw-at-the-opening);
-- from then on the secret is public and first come resumes. Only the lock's holder.
--
-- KEYS[1] {ev:ID}:draw  KEYS[2] {ev:ID}:drawlock  KEYS[3] {ev:ID}:entries  KEYS[4] {ev:ID}:drawn
-- ARGV[1] owner
-- Returns 1 done, -1 not the lock's owner, -2 entries without a mark.

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if redis.call('HLEN', KEYS[4]) < redis.call('HLEN', KEYS[3]) then
  return -2
end
redis.call('HSET', KEYS[1], 'state', 'done')
return 1
