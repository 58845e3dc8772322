-- The waiting list's offers (docs/design.md#the-waiting-list), for the back office that tells
-- the person (email, SMS: its job, not seatrush's) and for the export. One row per offer, keyed by
-- the offer's admission id, written before the offer's booking row: a booking row whose
-- admission has a row here came from the waiting list. The seat and level are the offer's;
-- joined_ms is when the waiter joined (Redis's clock), offered_ms when the seat was freed and
-- offered to it (Redis's clock, in the same script).
CREATE TABLE offers (
    event_id      TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    code_hash     TEXT NOT NULL,
    level         TEXT NOT NULL,
    slot          BIGINT NOT NULL,
    joined_ms     BIGINT NOT NULL,
    offered_ms    BIGINT NOT NULL,
    PRIMARY KEY (event_id, admission_id)
);
