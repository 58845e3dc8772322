-- The back-office database is the last guard: it refuses a second row for a code, a seat held
-- twice, and a level or event over its cap among held and paid rows, whatever Redis says.

CREATE TABLE events (
    id            TEXT PRIMARY KEY,
    total_seats   BIGINT NOT NULL CHECK (total_seats > 0),
    hold_seconds  BIGINT NOT NULL CHECK (hold_seconds > 0),
    opens_at_ms   BIGINT,
    closes_at_ms  BIGINT,
    state         TEXT NOT NULL DEFAULT 'draft' CHECK (state IN ('draft', 'open', 'closed')),
    taken         BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT events_taken_within_seats CHECK (taken >= 0 AND taken <= total_seats)
);

CREATE TABLE levels (
    event_id  TEXT NOT NULL REFERENCES events (id),
    name      TEXT NOT NULL,
    cap       BIGINT NOT NULL CHECK (cap > 0),
    taken     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, name),
    CONSTRAINT levels_taken_within_cap CHECK (taken >= 0 AND taken <= cap)
);

CREATE TABLE allowlist (
    event_id   TEXT NOT NULL REFERENCES events (id),
    code_hash  TEXT NOT NULL,
    PRIMARY KEY (event_id, code_hash)
);

-- One row per (event, code): a released candidate who books again reuses the row.
CREATE TABLE bookings (
    event_id       TEXT NOT NULL,
    code_hash      TEXT NOT NULL,
    nonce          TEXT NOT NULL,
    admission_id   TEXT NOT NULL,
    slot           BIGINT NOT NULL,
    level          TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('held', 'paid', 'released')),
    admitted_ms    BIGINT NOT NULL,
    hold_until_ms  BIGINT NOT NULL,
    updated_ms     BIGINT NOT NULL,
    -- 0 while a release is in the database but not yet in Redis.
    redis_synced   BIGINT NOT NULL DEFAULT 1,
    PRIMARY KEY (event_id, code_hash),
    FOREIGN KEY (event_id, level) REFERENCES levels (event_id, name)
);

CREATE UNIQUE INDEX bookings_one_holder_per_seat ON bookings (event_id, slot) WHERE state IN ('held', 'paid');
CREATE INDEX bookings_hold_expiry ON bookings (hold_until_ms) WHERE state = 'held';
CREATE INDEX bookings_release_unsynced ON bookings (event_id) WHERE redis_synced = 0;
