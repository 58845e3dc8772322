-- The request path's write, for a whole batch in one round trip (issue 10). Before it, the batch
-- writer sent a SAVEPOINT, the upsert, two counter updates and a RELEASE per booking, each a
-- loopback round trip: a batch of 256 cost over a thousand, and PostgreSQL reached a quarter of
-- SQLite's admitted/s. This is the one definition of `hold` for PostgreSQL: `Store::hold` calls it
-- with one booking, the batch writer with many.
--
-- Each booking, in array order, gets the outcome it would have had alone:
--   'held'        the row is now held by this admission; the row as written is returned, its
--                 hold running p_hold_ms from the write by the database's clock
--   'unclaimed'   the upsert changed nothing; the row that stopped it is returned (none: no row)
--                 and the caller judges it (already held, reaper won, code has a seat, ...)
--   'seat_taken'  another row holds this seat number (unique violation)
--   'level_full', 'sold_out'
--   'error'       this booking's own database error (message in `state`); the rest go on
-- A booking that is not 'held' leaves nothing behind (its sub-block is rolled back).
--
-- Counters: the batch's level rows and event rows are locked first, levels (sorted) before
-- events (sorted), the order `release` takes them one at a time, so batches never deadlock with
-- releases or with each other. The lock is FOR NO KEY UPDATE, the one an UPDATE of `taken` takes:
-- FOR UPDATE would also block the foreign-key checks (FOR KEY SHARE) of a reaper inserting a
-- booking row, while this batch waits on that very row (measured: deadlocks in the lifecycle
-- test that races the request path against the reaper); the caps are checked against running totals, and each counter is
-- written once per batch. The CHECK constraints on the counters still guard the result.
CREATE FUNCTION seatrush_hold(
    p_events text[], p_codes text[], p_nonces text[], p_ids text[], p_slots bigint[], p_levels text[],
    p_admitted bigint[], p_hold_ms bigint[]
) RETURNS TABLE (
    outcome text, code_hash text, nonce text, admission_id text, slot bigint, level text, state text,
    admitted_ms bigint, hold_until_ms bigint
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    level_events text[] := '{}';  -- the batch's (event, level) pairs, sorted
    level_names text[] := '{}';
    level_taken bigint[] := '{}';
    level_cap bigint[] := '{}';
    level_added bigint[] := '{}';
    event_ids text[] := '{}';     -- the batch's events, sorted
    event_taken bigint[] := '{}';
    event_cap bigint[] := '{}';
    event_added bigint[] := '{}';
    l int;
    e int;
    claimed bigint;
    v_taken bigint;
    v_cap bigint;
    v_event text;
    v_level text;
    now_ms bigint;
BEGIN
    FOR v_event, v_level IN SELECT DISTINCT p_events[i] COLLATE "C" AS ev, p_levels[i] COLLATE "C" AS lv FROM generate_subscripts(p_events, 1) i ORDER BY 1, 2 LOOP
        v_taken := NULL; v_cap := NULL;
        SELECT lv.taken, lv.cap INTO v_taken, v_cap FROM levels lv WHERE lv.event_id = v_event AND lv.name = v_level FOR NO KEY UPDATE;
        level_events := level_events || v_event;
        level_names := level_names || v_level;
        level_taken := level_taken || coalesce(v_taken, 0);
        level_cap := level_cap || coalesce(v_cap, 0);
        level_added := level_added || 0::bigint;
    END LOOP;
    FOR v_event IN SELECT DISTINCT p_events[i] COLLATE "C" AS ev FROM generate_subscripts(p_events, 1) i ORDER BY 1 LOOP
        v_taken := NULL; v_cap := NULL;
        SELECT ev.taken, ev.total_seats INTO v_taken, v_cap FROM events ev WHERE ev.id = v_event FOR NO KEY UPDATE;
        event_ids := event_ids || v_event;
        event_taken := event_taken || coalesce(v_taken, 0);
        event_cap := event_cap || coalesce(v_cap, 0);
        event_added := event_added || 0::bigint;
    END LOOP;

    -- The one clock for holds: the database's, read once the counter rows are ours.
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;

    FOR i IN 1 .. coalesce(array_length(p_events, 1), 0) LOOP
        l := NULL;
        FOR j IN 1 .. array_length(level_events, 1) LOOP
            IF level_events[j] = p_events[i] AND level_names[j] = p_levels[i] THEN l := j; EXIT; END IF;
        END LOOP;
        e := array_position(event_ids, p_events[i]);
        BEGIN
            INSERT INTO bookings AS b (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
                VALUES (p_events[i], p_codes[i], p_nonces[i], p_ids[i], p_slots[i], p_levels[i], 'held', p_admitted[i], now_ms + p_hold_ms[i], now_ms)
                ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
                    slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
                    hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms, redis_synced = 1
                WHERE b.state = 'released' AND b.admission_id <> excluded.admission_id;
            GET DIAGNOSTICS claimed = ROW_COUNT;
            IF claimed = 0 THEN
                outcome := 'unclaimed';
                code_hash := NULL; nonce := NULL; admission_id := NULL; slot := NULL; level := NULL; state := NULL;
                admitted_ms := NULL; hold_until_ms := NULL;
                SELECT b.code_hash, b.nonce, b.admission_id, b.slot, b.level, b.state, b.admitted_ms, b.hold_until_ms
                    INTO code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms
                    FROM bookings b WHERE b.event_id = p_events[i] AND b.code_hash = p_codes[i];
                RETURN NEXT;
                CONTINUE;
            END IF;
            IF level_taken[l] + level_added[l] >= level_cap[l] THEN
                RAISE SQLSTATE 'SR001';
            END IF;
            IF event_taken[e] + event_added[e] >= event_cap[e] THEN
                RAISE SQLSTATE 'SR002';
            END IF;
            level_added[l] := level_added[l] + 1;
            event_added[e] := event_added[e] + 1;
            outcome := 'held';
            code_hash := p_codes[i]; nonce := p_nonces[i]; admission_id := p_ids[i]; slot := p_slots[i];
            level := p_levels[i]; state := 'held'; admitted_ms := p_admitted[i]; hold_until_ms := now_ms + p_hold_ms[i];
        EXCEPTION
            WHEN unique_violation THEN outcome := 'seat_taken';
            WHEN SQLSTATE 'SR001' THEN outcome := 'level_full';
            WHEN SQLSTATE 'SR002' THEN outcome := 'sold_out';
            WHEN OTHERS THEN outcome := 'error';
                code_hash := NULL; nonce := NULL; admission_id := NULL; slot := NULL; level := NULL; state := SQLERRM;
                admitted_ms := NULL; hold_until_ms := NULL;
        END;
        IF outcome <> 'held' AND outcome <> 'error' THEN
            code_hash := NULL; nonce := NULL; admission_id := NULL; slot := NULL; level := NULL; state := NULL;
            admitted_ms := NULL; hold_until_ms := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;

    FOR j IN 1 .. coalesce(array_length(level_events, 1), 0) LOOP
        IF level_added[j] > 0 THEN
            UPDATE levels SET taken = taken + level_added[j] WHERE event_id = level_events[j] AND name = level_names[j];
        END IF;
    END LOOP;
    FOR j IN 1 .. coalesce(array_length(event_ids, 1), 0) LOOP
        IF event_added[j] > 0 THEN
            UPDATE events SET taken = taken + event_added[j] WHERE id = event_ids[j];
        END IF;
    END LOOP;
END
$$;
