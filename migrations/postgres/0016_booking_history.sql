-- A booking's history for candidate support and appeals: every admission, payment, move,
-- extension and release a booking row went through, with the time of the write (the row's
-- updated_ms, the database's clock). The booking row keeps only its latest admission; this
-- keeps the ones before it. Written by a trigger, so every path that writes a booking row
-- (seatrush_hold's batches, the reaper, expiry, cancel, payment, the move) is covered without
-- each one having to remember it. Code hashes only; rows are never deleted.
CREATE TABLE booking_history (
    id            BIGSERIAL PRIMARY KEY,
    event_id      TEXT NOT NULL,
    code_hash     TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    action        TEXT NOT NULL CHECK (action IN ('admitted', 'paid', 'moved', 'extended', 'released')),
    level         TEXT NOT NULL,
    slot          BIGINT NOT NULL,
    at_ms         BIGINT NOT NULL
);

CREATE INDEX booking_history_by_code ON booking_history (event_id, code_hash, id);

CREATE FUNCTION seatrush_booking_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    what TEXT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- A row inserted released is a claim of an admission the database never held.
        IF NEW.state IN ('held', 'paid') THEN
            what := 'admitted';
        END IF;
    ELSIF NEW.state IN ('held', 'paid') AND (OLD.state = 'released' OR OLD.admission_id <> NEW.admission_id) THEN
        what := 'admitted';
    ELSIF OLD.state IN ('held', 'paid') AND NEW.state = 'released' THEN
        what := 'released';
    ELSIF OLD.state = 'held' AND NEW.state = 'paid' THEN
        what := 'paid';
    ELSIF NEW.state IN ('held', 'paid') AND (OLD.level <> NEW.level OR OLD.slot <> NEW.slot) THEN
        what := 'moved';
    ELSIF NEW.state = 'held' AND NEW.hold_until_ms > OLD.hold_until_ms THEN
        what := 'extended';
    END IF;
    IF what IS NOT NULL THEN
        INSERT INTO booking_history (event_id, code_hash, admission_id, action, level, slot, at_ms)
        VALUES (NEW.event_id, NEW.code_hash, NEW.admission_id, what, NEW.level, NEW.slot, NEW.updated_ms);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER booking_history AFTER INSERT OR UPDATE ON bookings
    FOR EACH ROW EXECUTE FUNCTION seatrush_booking_history();
