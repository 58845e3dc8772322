-- The arbiter of a move (docs/design.md#moving-a-booking): the request that moves a booking and
-- a settle that gives up on it (after a crash, a short WAIT or a refusal) each insert the move's
-- outcome, and the first to insert decides. The move's own transaction inserts 'done' with the
-- booking row's new level and seat, so a move given up on can never land after its seats were
-- settled in Redis, and a settle finds 'done' when the move landed.
CREATE TABLE move_claims (
    event_id  TEXT NOT NULL,
    move_id   TEXT NOT NULL,
    outcome   TEXT NOT NULL CHECK (outcome IN ('done', 'aborted')),
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (event_id, move_id)
);
