-- The same check on `bookings.state`, written as three comparisons instead of an IN list. SQLite
-- compiles a CHECK's IN list of three strings into a temporary B-tree, built and dropped again by
-- every statement that writes a row: for the request path's upsert that was a B-tree opened, a
-- 4 KB page zeroed, three inserts and a close, per booking, about 6 % of `serve`'s instructions
-- (issue 10, seventh pass; counted with scripts/serve-instructions.sh). Comparisons cost nothing
-- of the kind. PostgreSQL evaluates its IN list in place and keeps it.
--
-- SQLite cannot change a CHECK in place, so the table is rebuilt (SQLite's documented procedure
-- for such changes): a new table, every row copied, the old table dropped with its indexes and
-- triggers, the new one renamed, and those indexes and triggers created again as they were.
-- No other table refers to `bookings`, and dropping a table fires none of its DELETE triggers.

CREATE TABLE bookings_rebuilt (
    event_id       TEXT NOT NULL,
    code_hash      TEXT NOT NULL,
    nonce          TEXT NOT NULL,
    admission_id   TEXT NOT NULL,
    slot           INTEGER NOT NULL,
    level          TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state = 'held' OR state = 'paid' OR state = 'released'),
    admitted_ms    INTEGER NOT NULL,
    hold_until_ms  INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    -- 0 while a release is in the database but not yet in Redis.
    redis_synced   INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (event_id, code_hash),
    FOREIGN KEY (event_id, level) REFERENCES levels (event_id, name)
);

INSERT INTO bookings_rebuilt (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms, redis_synced)
SELECT event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms, redis_synced FROM bookings;

DROP TABLE bookings;
ALTER TABLE bookings_rebuilt RENAME TO bookings;

CREATE UNIQUE INDEX bookings_one_holder_per_seat ON bookings (event_id, slot) WHERE state IN ('held', 'paid');
CREATE INDEX bookings_hold_expiry ON bookings (hold_until_ms) WHERE state = 'held';
CREATE INDEX bookings_release_unsynced ON bookings (event_id) WHERE redis_synced = 0;

-- As 0004 (the tombstone check on UPDATE; 0006 dropped the one on INSERT) and 0006.
CREATE TRIGGER bookings_no_resurrection_update BEFORE UPDATE ON bookings
WHEN NEW.state = 'held' AND NEW.admission_id <> OLD.admission_id
 AND EXISTS (SELECT 1 FROM released_admissions t WHERE t.event_id = NEW.event_id AND t.admission_id = NEW.admission_id)
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TRIGGER bookings_never_deleted BEFORE DELETE ON bookings
BEGIN
    SELECT RAISE(ABORT, 'booking rows are never deleted: a released booking keeps its row (tombstones in released_admissions rely on it)');
END;
