-- The operator's actions (payments, cancels), kept for an appeal: when, what, which code (its
-- hash only), from which client address, and how it ended.
CREATE TABLE audit_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    event_id   TEXT NOT NULL,
    action     TEXT NOT NULL,
    code_hash  TEXT NOT NULL,
    client     TEXT NOT NULL,
    outcome    TEXT NOT NULL
);
CREATE INDEX audit_log_by_event ON audit_log (event_id, id);

-- The fingerprint of the pepper the allowlist's hashes were made with ('none' for plain
-- SHA-256; NULL until the first import), so a sale is never served with another pepper.
ALTER TABLE events ADD COLUMN allowlist_pepper TEXT;
