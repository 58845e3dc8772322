-- The tombstone trigger on INSERT ran for every booking written (an upsert fires it even when the
-- row exists), and it can only ever refuse a row that does not exist yet, which cannot carry a
-- tombstone: a tombstone is written in the transaction that claims or releases the code's booking
-- row, so the row is there, and booking rows are never deleted, so it stays. Every later write of
-- that admission is an UPDATE, which 0004's update trigger still judges. The guard it leaned on is
-- now the schema's: deleting a booking row is refused. (Issue 10; PostgreSQL's 0006 does the same
-- and more. SQLite keeps its foreign key from bookings to levels: checked in process, it is cheap.)
DROP TRIGGER bookings_no_resurrection_insert;

CREATE TRIGGER bookings_never_deleted BEFORE DELETE ON bookings
BEGIN
    SELECT RAISE(ABORT, 'booking rows are never deleted: a released booking keeps its row (tombstones in released_admissions rely on it)');
END;
