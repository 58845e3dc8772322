-- Issue 29 item 8: one lock order. `seatrush_hold` is 0009's, booking for booking, with the
-- batch's level and event rows locked (sorted) before any booking row, in both passes;
-- `Store::release` takes the same order (its level and event rows, then its booking row).
-- Numbered 0029 (the issue) so that it clashes with no migration of the work merged beside it.

CREATE OR REPLACE FUNCTION seatrush_hold(
    p_events text[], p_codes text[], p_nonces text[], p_ids text[], p_slots bigint[], p_levels text[],
    p_admitted bigint[], p_hold_ms bigint[],
    level_events text[], level_names text[], event_ids text[], at_level int[], at_event int[], repeats boolean
) RETURNS TABLE (
    outcome text, code_hash text, nonce text, admission_id text, slot bigint, level text, state text,
    admitted_ms bigint, hold_until_ms bigint
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    n int := coalesce(array_length(p_events, 1), 0);
    level_taken bigint[] := '{}'; -- read by the slow path
    level_cap bigint[] := '{}';   -- NULL: no such level (the slow path refuses its bookings)
    level_added bigint[];
    event_taken bigint[] := '{}';
    event_cap bigint[] := '{}';
    event_added bigint[];
    -- Per booking, its outcome as an index into `outcomes`. A number, not the text: the loops
    -- read it by subscript, which costs O(1) in an array of numbers and O(i) in one of texts.
    outcomes constant text[] := '{held,unclaimed,seat_taken,level_full,sold_out,error}';
    o int[];
    o_error text[] := '{}';       -- an 'error' booking's message
    claimed bigint;
    v_taken bigint;
    v_cap bigint;
    now_ms bigint;
BEGIN
    IF array_length(at_level, 1) IS DISTINCT FROM n OR array_length(at_event, 1) IS DISTINCT FROM n
       OR array_length(level_names, 1) IS DISTINCT FROM array_length(level_events, 1)
       OR (SELECT bool_or(q.lv IS DISTINCT FROM level_names[q.l] OR q.ev IS DISTINCT FROM level_events[q.l]
                          OR q.ev IS DISTINCT FROM event_ids[q.e])
           FROM unnest(p_events, p_levels, at_level, at_event) AS q (ev, lv, l, e)) THEN
        RAISE EXCEPTION 'seatrush_hold: the batch''s shape does not fit its bookings';
    END IF;
    level_added := array_fill(0::bigint, ARRAY[array_length(level_events, 1)]);
    event_added := array_fill(0::bigint, ARRAY[array_length(event_ids, 1)]);
    -- The one clock for holds: the database's, read at the write.
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;

    -- One lock order for every transaction that writes a booking and its counters
    -- (docs/design.md#the-persister): the batch's level rows (sorted), then its event rows
    -- (sorted), then booking rows. Before issue 29 the fast path locked booking rows first and
    -- the counters last, while the slow path locked the counters first: a slow-path batch
    -- holding a level and waiting on a booking row that a fast-path batch or a release
    -- (`Store::release`: the booking row, then its level) held while waiting on that level was a
    -- deadlock, which PostgreSQL broke after `deadlock_timeout` by failing one (40P01, a `503`).
    -- Taken once here, before either pass, the slow path's own locking reads re-read rows this
    -- transaction holds, and `Store::release` takes its level and event rows before its booking.
    PERFORM 1 FROM levels lv
        JOIN unnest(level_events, level_names) AS q (q_event, q_name) ON lv.event_id = q.q_event AND lv.name = q.q_name
        ORDER BY lv.event_id, lv.name FOR NO KEY UPDATE OF lv;
    PERFORM 1 FROM events ev WHERE ev.id = ANY (event_ids) ORDER BY ev.id FOR NO KEY UPDATE;

    -- Pass 1 is the fast path; any error in it (a refusal, a repeat, a changed row) rolls it back
    -- and pass 2, the slow path, decides the batch again. Both count the batch in the same place.
    FOR pass IN 1 .. 2 LOOP
        BEGIN
            IF pass = 1 THEN
                IF repeats THEN
                    RAISE SQLSTATE 'SR003';  -- a booking would see the one before it: the slow path
                END IF;
                -- Every booking is written in one statement; the ones the upsert refuses are 'unclaimed'
                -- (their row, locked by the upsert until commit, is read into the answer below). In code
                -- order, so two writers' batches never wait on each other's rows in a cycle.
                WITH written AS (
                    INSERT INTO bookings AS b (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
                        SELECT q.ev, q.code, q.nonce, q.id, q.slot, q.lv, 'held', q.admitted, now_ms + q.hold_ms, now_ms
                        FROM unnest(p_events, p_codes, p_nonces, p_ids, p_slots, p_levels, p_admitted, p_hold_ms)
                            AS q (ev, code, nonce, id, slot, lv, admitted, hold_ms)
                        ORDER BY q.ev, q.code
                        ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
                            slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
                            hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms
                        WHERE b.state = 'released' AND b.admission_id <> excluded.admission_id
                        RETURNING b.event_id, b.code_hash
                )
                SELECT array_agg(CASE WHEN w.code_hash IS NULL THEN 2 ELSE 1 END ORDER BY q.i) INTO o
                    FROM unnest(p_events, p_codes) WITH ORDINALITY AS q (ev, code, i)
                    LEFT JOIN written w ON w.event_id = q.ev AND w.code_hash = q.code;
                FOR i IN 1 .. n LOOP
                    IF o[i] = 1 THEN
                        level_added[at_level[i]] := level_added[at_level[i]] + 1;
                        event_added[at_event[i]] := event_added[at_event[i]] + 1;
                    END IF;
                END LOOP;
            ELSE
                -- The slow path, 0003's: the fast path's writes are gone; so must be its answers and counts.
                o := array_fill(6, ARRAY[n]);
                o_error := array_fill(NULL::text, ARRAY[n]);
                level_added := array_fill(0::bigint, ARRAY[array_length(level_events, 1)]);
                event_added := array_fill(0::bigint, ARRAY[array_length(event_ids, 1)]);
                -- The counter rows are locked and read first, levels (sorted) before events (sorted): the
                -- caps are judged booking by booking against running totals. FOR NO KEY UPDATE is the
                -- lock an UPDATE of `taken` takes: FOR UPDATE would also block foreign-key checks
                -- (FOR KEY SHARE) on these rows, which need not wait for a batch.
                FOR j IN 1 .. array_length(level_events, 1) LOOP
                    v_taken := NULL; v_cap := NULL;
                    SELECT lv.taken, lv.cap INTO v_taken, v_cap FROM levels lv
                        WHERE lv.event_id = level_events[j] AND lv.name = level_names[j] FOR NO KEY UPDATE;
                    level_taken[j] := coalesce(v_taken, 0);
                    level_cap[j] := v_cap;
                END LOOP;
                FOR j IN 1 .. array_length(event_ids, 1) LOOP
                    v_taken := NULL; v_cap := NULL;
                    SELECT ev.taken, ev.total_seats INTO v_taken, v_cap FROM events ev WHERE ev.id = event_ids[j] FOR NO KEY UPDATE;
                    event_taken[j] := coalesce(v_taken, 0);
                    event_cap[j] := v_cap;
                END LOOP;
                now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
                FOR i IN 1 .. n LOOP
                    BEGIN
                        INSERT INTO bookings AS b (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
                            VALUES (p_events[i], p_codes[i], p_nonces[i], p_ids[i], p_slots[i], p_levels[i], 'held', p_admitted[i], now_ms + p_hold_ms[i], now_ms)
                            ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
                                slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
                                hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms
                            WHERE b.state = 'released' AND b.admission_id <> excluded.admission_id;
                        GET DIAGNOSTICS claimed = ROW_COUNT;
                        IF claimed = 0 THEN
                            o[i] := 2;
                            CONTINUE;
                        END IF;
                        IF level_cap[at_level[i]] IS NULL THEN
                            RAISE foreign_key_violation USING MESSAGE =
                                format('event %s has no level %s', p_events[i], p_levels[i]);
                        END IF;
                        IF level_taken[at_level[i]] + level_added[at_level[i]] >= level_cap[at_level[i]] THEN
                            RAISE SQLSTATE 'SR001';
                        END IF;
                        IF event_taken[at_event[i]] + event_added[at_event[i]] >= event_cap[at_event[i]] THEN
                            RAISE SQLSTATE 'SR002';
                        END IF;
                        level_added[at_level[i]] := level_added[at_level[i]] + 1;
                        event_added[at_event[i]] := event_added[at_event[i]] + 1;
                        o[i] := 1;
                    EXCEPTION
                        WHEN unique_violation THEN o[i] := 3;
                        WHEN SQLSTATE 'SR001' THEN o[i] := 4;
                        WHEN SQLSTATE 'SR002' THEN o[i] := 5;
                        WHEN OTHERS THEN o[i] := 6; o_error[i] := SQLERRM;
                    END;
                END LOOP;
            END IF;
            -- Counted against the caps last (their rows are locked since the start); the counters'
            -- CHECK constraints refuse a batch past a cap, and a seat held by another row fails the
            -- write on the seat index: either way the slow path then refuses exactly the bookings
            -- one-at-a-time writes would.
            FOR j IN 1 .. array_length(level_events, 1) LOOP
                IF level_added[j] > 0 THEN
                    UPDATE levels SET taken = taken + level_added[j] WHERE event_id = level_events[j] AND name = level_names[j];
                    GET DIAGNOSTICS claimed = ROW_COUNT;
                    IF claimed <> 1 THEN
                        RAISE SQLSTATE 'SR004';  -- no such level: the slow path refuses its bookings
                    END IF;
                END IF;
            END LOOP;
            FOR j IN 1 .. array_length(event_ids, 1) LOOP
                IF event_added[j] > 0 THEN
                    UPDATE events SET taken = taken + event_added[j] WHERE id = event_ids[j];
                    GET DIAGNOSTICS claimed = ROW_COUNT;
                    IF claimed <> 1 THEN
                        RAISE SQLSTATE 'SR004';
                    END IF;
                END IF;
            END LOOP;
            EXIT;
        EXCEPTION WHEN OTHERS THEN
            IF pass = 2 THEN
                RAISE;  -- the slow path judged every booking alone: an error here is the batch's
            END IF;
        END;
    END LOOP;

    -- A held booking is answered with the row as written, an 'unclaimed' one with the row that
    -- stopped it (none: NULLs), which the upsert locked and no one else can have changed since.
    RETURN QUERY
        SELECT outcomes[x.o],
               CASE x.o WHEN 1 THEN x.code ELSE b.code_hash END,
               CASE x.o WHEN 1 THEN x.nonce ELSE b.nonce END,
               CASE x.o WHEN 1 THEN x.id ELSE b.admission_id END,
               CASE x.o WHEN 1 THEN x.slot ELSE b.slot END,
               CASE x.o WHEN 1 THEN x.lv ELSE b.level END,
               CASE x.o WHEN 1 THEN 'held' WHEN 6 THEN x.error ELSE b.state END,
               CASE x.o WHEN 1 THEN x.admitted ELSE b.admitted_ms END,
               CASE x.o WHEN 1 THEN now_ms + x.hold_ms ELSE b.hold_until_ms END
        -- (unnest pads o_error, empty unless the slow path ran, with NULLs)
        FROM unnest(o, p_events, p_codes, p_nonces, p_ids, p_slots, p_levels, p_admitted, p_hold_ms, o_error) WITH ORDINALITY
            AS x (o, ev, code, nonce, id, slot, lv, admitted, hold_ms, error, i)
        -- LIMIT: one index probe per 'unclaimed' booking, never a join over the whole table
        LEFT JOIN LATERAL (SELECT * FROM bookings b WHERE x.o = 2 AND b.event_id = x.ev AND b.code_hash = x.code LIMIT 1) b ON true
        ORDER BY x.i;
END
$$;
