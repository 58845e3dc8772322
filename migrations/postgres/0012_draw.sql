-- The draw at the opening (docs/design.md#the-draw-at-the-opening). `fair_start_seconds` is the
-- event file's setting (0: first come). `draws` keeps the secret the first `open` drew and its
-- SHA-256, the commitment published from then on, so a re-open never changes it; `drawn_ms` is
-- set when the draw is done. `draw_entries` is the order the draw used, for `draw verify`: each
-- entry's rank, code hash and outcome.
ALTER TABLE events ADD COLUMN fair_start_seconds BIGINT NOT NULL DEFAULT 0;

CREATE TABLE draws (
    event_id    TEXT PRIMARY KEY REFERENCES events (id),
    secret      TEXT NOT NULL,
    commitment  TEXT NOT NULL,
    drawn_ms    BIGINT
);

CREATE TABLE draw_entries (
    event_id   TEXT NOT NULL REFERENCES draws (event_id),
    draw_rank  BIGINT NOT NULL,
    code_hash  TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    PRIMARY KEY (event_id, draw_rank),
    UNIQUE (event_id, code_hash)
);
