-- `bookings.redis_synced` and its index go: nothing has read them since migration 0002 moved the
-- duty to run a release again into `release_syncs` (which the release sync reads and keeps), yet
-- every hold still wrote the column's default.
DROP INDEX bookings_release_unsynced;
ALTER TABLE bookings DROP COLUMN redis_synced;
