-- A booking's history for candidate support and appeals: every admission, payment, move,
-- extension and release a booking row went through, with the time of the write (the row's
-- updated_ms, the database's clock). The booking row keeps only its latest admission; this
-- keeps the ones before it. Written by triggers, so every path that writes a booking row (the
-- persister's batches, the reaper, expiry, cancel, payment, the move) is covered without each
-- one having to remember it. Code hashes only; rows are never deleted.
CREATE TABLE booking_history (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT NOT NULL,
    code_hash     TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    -- Comparisons, not IN: SQLite builds a temporary B-tree for an IN list on every insert, and
    -- this one runs with every booking written (tests/api/schema.rs checks the plan).
    action        TEXT NOT NULL CHECK (action = 'admitted' OR action = 'paid' OR action = 'moved' OR action = 'extended' OR action = 'released'),
    level         TEXT NOT NULL,
    slot          INTEGER NOT NULL,
    at_ms         INTEGER NOT NULL
);

CREATE INDEX booking_history_by_code ON booking_history (event_id, code_hash, id);

-- A row inserted released is a claim of an admission the database never held: nothing happened
-- to the candidate's booking.
CREATE TRIGGER booking_history_insert AFTER INSERT ON bookings WHEN NEW.state = 'held' OR NEW.state = 'paid'
BEGIN
    INSERT INTO booking_history (event_id, code_hash, admission_id, action, level, slot, at_ms)
    VALUES (NEW.event_id, NEW.code_hash, NEW.admission_id, 'admitted', NEW.level, NEW.slot, NEW.updated_ms);
END;

CREATE TRIGGER booking_history_update AFTER UPDATE ON bookings
BEGIN
    INSERT INTO booking_history (event_id, code_hash, admission_id, action, level, slot, at_ms)
    SELECT NEW.event_id, NEW.code_hash, NEW.admission_id, action, NEW.level, NEW.slot, NEW.updated_ms
    FROM (SELECT CASE
        WHEN NEW.state <> 'released' AND (OLD.state = 'released' OR OLD.admission_id <> NEW.admission_id) THEN 'admitted'
        WHEN OLD.state <> 'released' AND NEW.state = 'released' THEN 'released'
        WHEN OLD.state = 'held' AND NEW.state = 'paid' THEN 'paid'
        WHEN NEW.state <> 'released' AND (OLD.level <> NEW.level OR OLD.slot <> NEW.slot) THEN 'moved'
        WHEN NEW.state = 'held' AND NEW.hold_until_ms > OLD.hold_until_ms THEN 'extended'
    END AS action)
    WHERE action IS NOT NULL;
END;
