-- The event's pay-link template (`payment_url` in the event file; NULL for none), which the
-- booking page fills in after a 201 (src/domain/payment_url.rs).
ALTER TABLE events ADD COLUMN payment_url TEXT;
