-- Issue 29: a final refusal spends its attempt (docs/design.md#a-final-refusal-spends-its-attempt).
-- A retry refused by Redis (its record lost by a promotion) is checked against the code's row;
-- the same attempt's earlier write, stalled behind a lock or a database outage, could land after
-- that read and hold a seat for a candidate told "no". The refusal therefore records the attempt
-- (event, code, nonce) as spent in the same step as its read, and the database skips any later
-- held write of a spent attempt, as it skips a released admission's (0004).
--
-- `refused` is the answer the attempt was told (`sold_out`, `closed`, ...); NULL marks a row a
-- held write made for itself. That marker is what orders the two: the refusal and the write both
-- take this row's lock (an upsert), so whichever comes second sees the first committed: a write
-- after the refusal is skipped, a refusal after the write reads the write's row.
CREATE TABLE attempts (
    event_id   TEXT NOT NULL,
    code_hash  TEXT NOT NULL,
    nonce      TEXT NOT NULL,
    refused    TEXT,
    PRIMARY KEY (event_id, code_hash, nonce)
);

CREATE FUNCTION seatrush_attempt_unspent() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    spent text;
BEGIN
    INSERT INTO attempts AS a (event_id, code_hash, nonce) VALUES (NEW.event_id, NEW.code_hash, NEW.nonce)
        ON CONFLICT (event_id, code_hash, nonce) DO UPDATE SET refused = a.refused
        RETURNING a.refused INTO spent;
    IF spent IS NOT NULL THEN
        RETURN NULL;  -- skip the write: this attempt was told a final refusal
    END IF;
    RETURN NEW;
END
$$;

-- Named to fire after 0004's triggers (PostgreSQL fires them by name): a write those skip leaves
-- no marker.
CREATE TRIGGER bookings_unspent_attempt_insert BEFORE INSERT ON bookings
    FOR EACH ROW WHEN (NEW.state = 'held') EXECUTE FUNCTION seatrush_attempt_unspent();

CREATE TRIGGER bookings_unspent_attempt_update BEFORE UPDATE ON bookings
    FOR EACH ROW WHEN (NEW.state = 'held' AND (NEW.nonce IS DISTINCT FROM OLD.nonce OR NEW.admission_id IS DISTINCT FROM OLD.admission_id))
    EXECUTE FUNCTION seatrush_attempt_unspent();

-- The refusal's one step: the attempt's row locked first (waiting out a held write of it that has
-- not committed yet), then the code's booking read by a statement of its own (so it sees that
-- write), and the attempt spent unless the booking holds a seat for this very nonce.
CREATE FUNCTION seatrush_spend_attempt(p_event text, p_code text, p_nonce text, p_refused text)
RETURNS TABLE (
    code_hash text, nonce text, admission_id text, slot bigint, level text, state text,
    admitted_ms bigint, hold_until_ms bigint
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r bookings%ROWTYPE;
    found_row boolean;
BEGIN
    INSERT INTO attempts AS a (event_id, code_hash, nonce) VALUES (p_event, p_code, p_nonce)
        ON CONFLICT (event_id, code_hash, nonce) DO UPDATE SET refused = a.refused;
    SELECT * INTO r FROM bookings b WHERE b.event_id = p_event AND b.code_hash = p_code;
    found_row := FOUND;
    IF NOT found_row OR r.state NOT IN ('held', 'paid') OR r.nonce <> p_nonce THEN
        UPDATE attempts a SET refused = coalesce(a.refused, p_refused)
            WHERE a.event_id = p_event AND a.code_hash = p_code AND a.nonce = p_nonce;
    END IF;
    IF found_row THEN
        RETURN QUERY SELECT r.code_hash, r.nonce, r.admission_id, r.slot, r.level, r.state, r.admitted_ms, r.hold_until_ms;
    END IF;
END
$$;
