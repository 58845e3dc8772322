-- One row per admission the arbiter has claimed released, or a release has ended: a tombstone,
-- never overwritten. The booking row cannot keep that fact: a later admission of the same code
-- may overwrite it, and then a slow write of the dead admission would find a row "released for
-- another admission" and hold a seat Redis has already handed back (found by the model checker,
-- tests/model/MODEL.md finding 2). The database refuses such a write itself: the triggers skip
-- it, the write changes nothing, and its caller judges the row it finds.
CREATE TABLE released_admissions (
    event_id      TEXT NOT NULL,
    admission_id  TEXT NOT NULL,
    PRIMARY KEY (event_id, admission_id)
);

INSERT INTO released_admissions (event_id, admission_id)
SELECT event_id, admission_id FROM bookings WHERE state = 'released';

CREATE TRIGGER bookings_no_resurrection_insert BEFORE INSERT ON bookings
WHEN NEW.state = 'held'
 AND EXISTS (SELECT 1 FROM released_admissions t WHERE t.event_id = NEW.event_id AND t.admission_id = NEW.admission_id)
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TRIGGER bookings_no_resurrection_update BEFORE UPDATE ON bookings
WHEN NEW.state = 'held' AND NEW.admission_id <> OLD.admission_id
 AND EXISTS (SELECT 1 FROM released_admissions t WHERE t.event_id = NEW.event_id AND t.admission_id = NEW.admission_id)
BEGIN
    SELECT RAISE(IGNORE);
END;
