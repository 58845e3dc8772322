-- Issue 29: a final refusal spends its attempt (docs/design.md#a-final-refusal-spends-its-attempt).
-- The refusal records (event, code, nonce) with the answer it was told, in the same write
-- transaction as its read of the code's row (SQLite runs one writer at a time, so a held write
-- either committed before that read, which then sees it, or comes after the record and is
-- skipped here, as 0004 skips a released admission's).
CREATE TABLE attempts (
    event_id   TEXT NOT NULL,
    code_hash  TEXT NOT NULL,
    nonce      TEXT NOT NULL,
    refused    TEXT,
    PRIMARY KEY (event_id, code_hash, nonce)
);

CREATE TRIGGER bookings_unspent_attempt_insert BEFORE INSERT ON bookings
WHEN NEW.state = 'held'
 AND EXISTS (SELECT 1 FROM attempts a WHERE a.event_id = NEW.event_id AND a.code_hash = NEW.code_hash
                                        AND a.nonce = NEW.nonce AND a.refused IS NOT NULL)
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TRIGGER bookings_unspent_attempt_update BEFORE UPDATE ON bookings
WHEN NEW.state = 'held' AND (NEW.nonce <> OLD.nonce OR NEW.admission_id <> OLD.admission_id)
 AND EXISTS (SELECT 1 FROM attempts a WHERE a.event_id = NEW.event_id AND a.code_hash = NEW.code_hash
                                        AND a.nonce = NEW.nonce AND a.refused IS NOT NULL)
BEGIN
    SELECT RAISE(IGNORE);
END;
