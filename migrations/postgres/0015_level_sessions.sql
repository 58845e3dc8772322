-- Levels as sessions (src/domain/session.rs): what a candidate is shown of a level, and how the
-- event numbers its seats. With 'per-level' each level owns a block of the event-wide seat
-- numbers, so the unique index on (event_id, slot) is also unique per (level, seat).
ALTER TABLE events ADD COLUMN seat_numbering TEXT NOT NULL DEFAULT 'event-wide'
    CHECK (seat_numbering IN ('event-wide', 'per-level'));
ALTER TABLE levels ADD COLUMN display_name TEXT;
ALTER TABLE levels ADD COLUMN starts_at_ms BIGINT;
ALTER TABLE levels ADD COLUMN venue TEXT;
-- The levels a code may book (the `levels` column of an allowlist CSV): level names separated by
-- spaces, NULL for any level of the event.
ALTER TABLE allowlist ADD COLUMN levels TEXT;
-- The booking page's language for the event (`language` in the event file; NULL: the browser's
-- Accept-Language chooses).
ALTER TABLE events ADD COLUMN language TEXT;
