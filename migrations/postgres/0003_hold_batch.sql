-- The request path's write, for a whole batch in one round trip (issue 10). Before it, the batch
-- writer sent a SAVEPOINT, the upsert, two counter updates and a RELEASE per booking, each a
-- loopback round trip: a batch of 256 cost over a thousand, and PostgreSQL reached a tenth to a
-- quarter of SQLite's admitted/s. This is the one definition of `hold` for PostgreSQL:
-- `Store::hold` calls it with one booking, the batch writer with many.
--
-- Each booking, in array order, gets the outcome it would have had alone:
--   'held'        the row is now held by this admission; the row as written is returned, its
--                 hold running p_hold_ms from the write by the database's clock
--   'unclaimed'   the upsert changed nothing; the row that stopped it is returned (none: no row)
--                 and the caller judges it (already held, reaper won, same nonce, code has a seat)
--   'seat_taken'  another row holds this seat number
--   'level_full', 'sold_out'
--   'error'       this booking's own database error (message in `state`); the rest go on
-- A booking that is not 'held' leaves nothing behind.
--
-- Counters: the batch's level rows and event rows are locked first, levels (sorted) before
-- events (sorted), the order `release` takes them one at a time, so batches never deadlock with
-- releases or with each other. The lock is FOR NO KEY UPDATE, the one an UPDATE of `taken` takes:
-- FOR UPDATE would also block the foreign-key check (FOR KEY SHARE) of a reaper inserting a
-- booking row while this batch waits on that very row (measured: deadlocks in the lifecycle test
-- that races the request path against the reaper). The caps are checked against running totals
-- and each counter is written once per batch; the CHECK constraints still guard the result.
--
-- Two paths, same outcomes. The fast path checks each booking with plain reads (the code's row,
-- then the seat) before it writes, so it needs no subtransaction per booking: PL/pgSQL's
-- BEGIN ... EXCEPTION block is one, and past 64 in a transaction they overflow every backend's
-- subtransaction cache. If anything in it fails (a booking's own error, or a write that a
-- concurrent transaction made stale: a seat taken or a row claimed since the read), the whole
-- fast path rolls back and the slow path runs every booking in a sub-block of its own, exactly as
-- the one-at-a-time write would.
CREATE FUNCTION seatrush_hold(
    p_events text[], p_codes text[], p_nonces text[], p_ids text[], p_slots bigint[], p_levels text[],
    p_admitted bigint[], p_hold_ms bigint[]
) RETURNS TABLE (
    outcome text, code_hash text, nonce text, admission_id text, slot bigint, level text, state text,
    admitted_ms bigint, hold_until_ms bigint
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n int := coalesce(array_length(p_events, 1), 0);
    level_events text[] := '{}';  -- the batch's (event, level) pairs, sorted
    level_names text[] := '{}';
    level_taken bigint[] := '{}';
    level_cap bigint[] := '{}';   -- NULL: no such level (the write's foreign key refuses it)
    level_added bigint[] := '{}';
    event_ids text[] := '{}';     -- the batch's events, sorted
    event_taken bigint[] := '{}';
    event_cap bigint[] := '{}';
    event_added bigint[] := '{}';
    at_level int[] := '{}';       -- per booking: its index in level_*, event_*
    at_event int[] := '{}';
    -- the answer, one entry per booking
    o_outcome text[]; o_code text[]; o_nonce text[]; o_id text[]; o_slot bigint[]; o_level text[];
    o_state text[]; o_admitted bigint[]; o_hold bigint[];
    r record;
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
        level_cap := level_cap || v_cap;
        level_added := level_added || 0::bigint;
    END LOOP;
    FOR v_event IN SELECT DISTINCT p_events[i] COLLATE "C" AS ev FROM generate_subscripts(p_events, 1) i ORDER BY 1 LOOP
        v_taken := NULL; v_cap := NULL;
        SELECT ev.taken, ev.total_seats INTO v_taken, v_cap FROM events ev WHERE ev.id = v_event FOR NO KEY UPDATE;
        event_ids := event_ids || v_event;
        event_taken := event_taken || coalesce(v_taken, 0);
        event_cap := event_cap || v_cap;
        event_added := event_added || 0::bigint;
    END LOOP;
    FOR i IN 1 .. n LOOP
        FOR j IN 1 .. array_length(level_events, 1) LOOP
            IF level_events[j] = p_events[i] AND level_names[j] = p_levels[i] THEN at_level[i] := j; EXIT; END IF;
        END LOOP;
        at_event[i] := array_position(event_ids, p_events[i]);
    END LOOP;
    -- The one clock for holds: the database's, read once the counter rows are ours.
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;

    BEGIN  -- the fast path
        FOR i IN 1 .. n LOOP
            SELECT b.code_hash, b.nonce, b.admission_id, b.slot, b.level, b.state, b.admitted_ms, b.hold_until_ms INTO r
                FROM bookings b WHERE b.event_id = p_events[i] AND b.code_hash = p_codes[i];
            IF FOUND AND (r.state <> 'released' OR r.admission_id = p_ids[i]) THEN
                o_outcome[i] := 'unclaimed'; o_code[i] := r.code_hash; o_nonce[i] := r.nonce; o_id[i] := r.admission_id;
                o_slot[i] := r.slot; o_level[i] := r.level; o_state[i] := r.state; o_admitted[i] := r.admitted_ms;
                o_hold[i] := r.hold_until_ms;
                CONTINUE;
            END IF;
            IF EXISTS (SELECT 1 FROM bookings b WHERE b.event_id = p_events[i] AND b.slot = p_slots[i] AND b.state IN ('held', 'paid')) THEN
                o_outcome[i] := 'seat_taken';
                CONTINUE;
            END IF;
            IF level_cap[at_level[i]] IS NULL OR event_cap[at_event[i]] IS NULL THEN
                RAISE SQLSTATE 'SR003';  -- no such level: the write's own error, in the slow path
            END IF;
            IF level_taken[at_level[i]] + level_added[at_level[i]] >= level_cap[at_level[i]] THEN
                o_outcome[i] := 'level_full';
                CONTINUE;
            END IF;
            IF event_taken[at_event[i]] + event_added[at_event[i]] >= event_cap[at_event[i]] THEN
                o_outcome[i] := 'sold_out';
                CONTINUE;
            END IF;
            INSERT INTO bookings AS b (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
                VALUES (p_events[i], p_codes[i], p_nonces[i], p_ids[i], p_slots[i], p_levels[i], 'held', p_admitted[i], now_ms + p_hold_ms[i], now_ms)
                ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
                    slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
                    hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms, redis_synced = 1
                WHERE b.state = 'released' AND b.admission_id <> excluded.admission_id;
            GET DIAGNOSTICS claimed = ROW_COUNT;
            IF claimed = 0 THEN
                RAISE SQLSTATE 'SR003';  -- the row changed since the read: the slow path judges it
            END IF;
            level_added[at_level[i]] := level_added[at_level[i]] + 1;
            event_added[at_event[i]] := event_added[at_event[i]] + 1;
            o_outcome[i] := 'held'; o_code[i] := p_codes[i]; o_nonce[i] := p_nonces[i]; o_id[i] := p_ids[i];
            o_slot[i] := p_slots[i]; o_level[i] := p_levels[i]; o_state[i] := 'held'; o_admitted[i] := p_admitted[i];
            o_hold[i] := now_ms + p_hold_ms[i];
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        -- The slow path: the fast path's writes are gone; so must be its answers and counts.
        o_outcome := '{}'; o_code := '{}'; o_nonce := '{}'; o_id := '{}'; o_slot := '{}'; o_level := '{}';
        o_state := '{}'; o_admitted := '{}'; o_hold := '{}';
        level_added := array_fill(0::bigint, ARRAY[array_length(level_events, 1)]);
        event_added := array_fill(0::bigint, ARRAY[array_length(event_ids, 1)]);
        FOR i IN 1 .. n LOOP
            BEGIN
                INSERT INTO bookings AS b (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
                    VALUES (p_events[i], p_codes[i], p_nonces[i], p_ids[i], p_slots[i], p_levels[i], 'held', p_admitted[i], now_ms + p_hold_ms[i], now_ms)
                    ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
                        slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
                        hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms, redis_synced = 1
                    WHERE b.state = 'released' AND b.admission_id <> excluded.admission_id;
                GET DIAGNOSTICS claimed = ROW_COUNT;
                IF claimed = 0 THEN
                    SELECT b.code_hash, b.nonce, b.admission_id, b.slot, b.level, b.state, b.admitted_ms, b.hold_until_ms INTO r
                        FROM bookings b WHERE b.event_id = p_events[i] AND b.code_hash = p_codes[i];
                    o_outcome[i] := 'unclaimed';
                    IF FOUND THEN
                        o_code[i] := r.code_hash; o_nonce[i] := r.nonce; o_id[i] := r.admission_id; o_slot[i] := r.slot;
                        o_level[i] := r.level; o_state[i] := r.state; o_admitted[i] := r.admitted_ms; o_hold[i] := r.hold_until_ms;
                    END IF;
                    CONTINUE;
                END IF;
                IF level_taken[at_level[i]] + level_added[at_level[i]] >= level_cap[at_level[i]] THEN
                    RAISE SQLSTATE 'SR001';
                END IF;
                IF event_taken[at_event[i]] + event_added[at_event[i]] >= event_cap[at_event[i]] THEN
                    RAISE SQLSTATE 'SR002';
                END IF;
                level_added[at_level[i]] := level_added[at_level[i]] + 1;
                event_added[at_event[i]] := event_added[at_event[i]] + 1;
                o_outcome[i] := 'held'; o_code[i] := p_codes[i]; o_nonce[i] := p_nonces[i]; o_id[i] := p_ids[i];
                o_slot[i] := p_slots[i]; o_level[i] := p_levels[i]; o_state[i] := 'held'; o_admitted[i] := p_admitted[i];
                o_hold[i] := now_ms + p_hold_ms[i];
            EXCEPTION
                WHEN unique_violation THEN o_outcome[i] := 'seat_taken';
                WHEN SQLSTATE 'SR001' THEN o_outcome[i] := 'level_full';
                WHEN SQLSTATE 'SR002' THEN o_outcome[i] := 'sold_out';
                WHEN OTHERS THEN o_outcome[i] := 'error'; o_state[i] := SQLERRM;
            END;
        END LOOP;
    END;

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
    FOR i IN 1 .. n LOOP
        outcome := o_outcome[i]; code_hash := o_code[i]; nonce := o_nonce[i]; admission_id := o_id[i]; slot := o_slot[i];
        level := o_level[i]; state := o_state[i]; admitted_ms := o_admitted[i]; hold_until_ms := o_hold[i];
        RETURN NEXT;
    END LOOP;
END
$$;
