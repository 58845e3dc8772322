-- One payment per admission: when it was paid (by the database's clock, as holds are) and the
-- payment provider's reference (NULL for an operator's payment that named none). Keyed by the
-- admission, not the code, so a released candidate's new booking starts unpaid and never
-- inherits the old booking's reference; the booking row itself is left as it was.
CREATE TABLE payments (
    event_id      TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    code_hash     TEXT NOT NULL,
    paid_ms       BIGINT NOT NULL,
    reference     TEXT,
    PRIMARY KEY (event_id, admission_id)
);

-- A provider's reference names one payment: a retried webhook finds it, a reused one is refused.
CREATE UNIQUE INDEX payments_one_per_reference ON payments (event_id, reference) WHERE reference IS NOT NULL;
