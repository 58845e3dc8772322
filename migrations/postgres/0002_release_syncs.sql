-- Releases the database has made and no replica has acknowledged yet, one row per released
-- admission. Kept apart from `bookings`: a new booking of the same code may overwrite its released
-- row before that release is acknowledged, and the duty to run it again must outlive the row
-- (issue 9, hole 11: a failover then brought back a record and a count nobody held).
CREATE TABLE release_syncs (
    event_id      TEXT NOT NULL,
    code_hash     TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    nonce         TEXT NOT NULL,
    slot          BIGINT NOT NULL,
    level         TEXT NOT NULL,
    admitted_ms   BIGINT NOT NULL,
    released_ms   BIGINT NOT NULL,
    PRIMARY KEY (event_id, code_hash, admission_id)
);

INSERT INTO release_syncs (event_id, code_hash, admission_id, nonce, slot, level, admitted_ms, released_ms)
SELECT event_id, code_hash, admission_id, nonce, slot, level, admitted_ms, updated_ms
FROM bookings WHERE state = 'released' AND redis_synced = 0;
