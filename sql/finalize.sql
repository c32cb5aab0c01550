-- tsoracle: privileges and the restore merge, installed last (finalize).

-- Restores (pg_dump/pg_restore, or any superuser's INSERT/COPY) write rows the worker may
-- already hold. Each such row is merged, never lowering anything: the high-water and the
-- counters keep the larger value, an existing lease is kept. When the transaction commits,
-- tsoracle.note_restore() has the worker stop serving and fence again above what was
-- restored. The worker's own writes pass through unchanged.
CREATE FUNCTION tsoracle.merge_restored_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The upsert below fires this trigger again: let that row through.
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        RETURN NEW;
    END IF;
    -- A subscriber's copy or apply (replica) merges counters and leases without fencing again
    -- (the worker reads counters from the table, and loads leases at its next fence); a
    -- restore, and any high-water, have the worker fence again above what came in.
    IF pg_catalog.current_setting('session_replication_role') = 'replica' THEN
        IF TG_TABLE_NAME = 'high_water' THEN
            PERFORM tsoracle.note_restore();
        END IF;
    ELSIF NOT tsoracle.note_restore() THEN
        RETURN NEW;
    END IF;
    -- An upsert, not "update, else insert": the worker may insert the same key between the
    -- two (its first fence after CREATE EXTENSION, a new counter), and ON CONFLICT waits for
    -- it and merges instead of failing the restore on the primary key.
    IF TG_TABLE_NAME = 'high_water' THEN
        -- While the oracle serves this database, the worker raises the high-water itself
        -- and this transaction writes (and locks) no row: a restore that stays open for long
        -- (pg_restore --single-transaction) never holds up the oracle's window extensions.
        IF tsoracle.raise_restored_high_water((NEW).physical_ms, (NEW).epoch) THEN
            RETURN NULL;
        END IF;
        INSERT INTO tsoracle.high_water AS h SELECT (NEW).*
            ON CONFLICT (id) DO UPDATE
            SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms),
                epoch = GREATEST(h.epoch, EXCLUDED.epoch),
                updated_at = now();
    ELSIF TG_TABLE_NAME = 'seq' THEN
        INSERT INTO tsoracle.seq AS s SELECT (NEW).*
            ON CONFLICT (key) DO UPDATE
            SET next = GREATEST(s.next, EXCLUDED.next),
                owner = COALESCE(s.owner, EXCLUDED.owner),
                made = GREATEST(s.made, EXCLUDED.made),
                updated_at = now();
    ELSIF TG_TABLE_NAME = 'lease' THEN
        INSERT INTO tsoracle.lease AS l SELECT (NEW).*
            ON CONFLICT (lease_id) DO UPDATE
            SET ts_upper_bound_ms = GREATEST(l.ts_upper_bound_ms, EXCLUDED.ts_upper_bound_ms),
                expires_at_ms = GREATEST(l.expires_at_ms, EXCLUDED.expires_at_ms),
                ts_lower_bound_ms = LEAST(l.ts_lower_bound_ms, EXCLUDED.ts_lower_bound_ms),
                holds = l.holds OPERATOR(pg_catalog.||) EXCLUDED.holds;
    ELSE
        RETURN NEW;
    END IF;
    RETURN NULL;  -- inserted or merged above
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.merge_restored_row() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.note_restore() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.raise_restored_high_water(bigint, bigint) FROM PUBLIC;
-- ENABLE ALWAYS: in every session, also under session_replication_role = replica, as a logical
-- subscription's initial copy and apply run: a subscriber merges the rows it receives into its
-- own instead of failing on their keys.
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.high_water
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.seq
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER merge_restored_row;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER merge_restored_row;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER merge_restored_row;

-- A member's mark (tsoracle.member_oracle) is dumped with its data, which holds values its
-- oracle handed out. Restored into a cluster on its own, the mark makes it a cluster that has
-- been a member: it serves nothing until it has left the fleet by the runbook (which copies
-- the oracle's high-water and counters in first). Restored into a member of the same oracle,
-- it merges (the higher epoch); into a member of another oracle, it is refused. The worker's
-- own writes pass through unchanged; nobody else updates the row.
CREATE FUNCTION tsoracle.merge_restored_mark() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held bigint;
BEGIN
    -- A subscriber's copy or apply (replica): skipped; this cluster keeps its own.
    IF pg_catalog.current_setting('session_replication_role') = 'replica' THEN
        RETURN NULL;
    END IF;
    -- The worker's own writes, and the raise below (which fires this trigger again).
    IF pg_catalog.pg_trigger_depth() > 1 OR NOT tsoracle.note_restore() THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'only the tsoracle worker writes table %.%', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT m.system_id INTO held FROM ONLY tsoracle.member_oracle AS m FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    IF held OPERATOR(pg_catalog.<>) (NEW).system_id THEN
        RAISE EXCEPTION 'cannot restore a member of the oracle % into a member of the oracle %', (NEW).system_id, held
            USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'The dump holds values the other oracle handed out: this cluster''s oracle could hand them out again.',
            HINT = 'Restore the dump into a member of the oracle it came from, or into a cluster on its own and leave the fleet there (docs/operations/backups.md, "A member of a fleet").';
    END IF;
    UPDATE ONLY tsoracle.member_oracle
        SET epoch = GREATEST(epoch, (NEW).epoch), updated_at = pg_catalog.now();
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.merge_restored_mark() FROM PUBLIC;
CREATE TRIGGER merge_restored_mark BEFORE INSERT OR UPDATE ON tsoracle.member_oracle
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_mark();
ALTER TABLE tsoracle.member_oracle ENABLE ALWAYS TRIGGER merge_restored_mark;

-- A subscriber's apply of an update (session_replication_role = replica, ENABLE REPLICA):
-- merged as a restored row is, never lowering what this cluster holds; a higher high-water has
-- the worker fence again above it once the apply commits. The high-water goes through the MVCC update here (the
-- applying transaction holds its row); the fence raises the window above it.
CREATE FUNCTION tsoracle.merge_replicated_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'high_water' THEN
        -- Above what this cluster holds: fence again above it once the apply commits.
        IF NEW.physical_ms > OLD.physical_ms OR NEW.epoch > OLD.epoch THEN
            PERFORM tsoracle.note_restore();
        END IF;
        NEW.id := OLD.id;
        NEW.physical_ms := GREATEST(NEW.physical_ms, OLD.physical_ms);
        NEW.epoch := GREATEST(NEW.epoch, OLD.epoch);
    ELSIF TG_TABLE_NAME = 'seq' THEN
        NEW.key := OLD.key;
        NEW.next := GREATEST(NEW.next, OLD.next);
        NEW.owner := COALESCE(OLD.owner, NEW.owner);
        NEW.made := GREATEST(NEW.made, OLD.made);
    ELSIF TG_TABLE_NAME = 'lease' THEN
        NEW.lease_id := OLD.lease_id;
        NEW.ts_upper_bound_ms := GREATEST(NEW.ts_upper_bound_ms, OLD.ts_upper_bound_ms);
        NEW.expires_at_ms := GREATEST(NEW.expires_at_ms, OLD.expires_at_ms);
        NEW.ts_lower_bound_ms := LEAST(NEW.ts_lower_bound_ms, OLD.ts_lower_bound_ms);
        NEW.holds := OLD.holds OPERATOR(pg_catalog.||) NEW.holds;
    END IF;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.merge_replicated_row() FROM PUBLIC;
CREATE TRIGGER merge_replicated_row BEFORE UPDATE ON tsoracle.high_water
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_replicated_row();
CREATE TRIGGER merge_replicated_row BEFORE UPDATE ON tsoracle.seq
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_replicated_row();
CREATE TRIGGER merge_replicated_row BEFORE UPDATE ON tsoracle.lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_replicated_row();
ALTER TABLE tsoracle.high_water ENABLE REPLICA TRIGGER merge_replicated_row;
ALTER TABLE tsoracle.seq ENABLE REPLICA TRIGGER merge_replicated_row;
ALTER TABLE tsoracle.lease ENABLE REPLICA TRIGGER merge_replicated_row;

-- Only the worker writes tsoracle.resolved: a row written by anyone else would move the
-- resolved timestamp that standbys serve.
CREATE FUNCTION tsoracle.only_the_worker() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Another cluster's resolved timestamp, replicated here (a subscription's copy or apply):
    -- skipped; this cluster publishes its own.
    IF pg_catalog.current_setting('session_replication_role') = 'replica' AND TG_LEVEL = 'ROW' THEN
        RETURN NULL;
    END IF;
    IF tsoracle.note_restore() THEN
        RAISE EXCEPTION 'only the tsoracle worker writes table %.%', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.only_the_worker() FROM PUBLIC;
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.resolved
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.resolved ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.resolved
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.fleet_member
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.fleet_member ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.fleet_member
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.fleet_resolved
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.fleet_resolved ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.fleet_resolved
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
-- A member's memory of its oracle: written by the worker only (a lower epoch written by hand
-- would let a deposed primary serve it), or merged by a restore (below, after the function it
-- calls); a superuser deletes the row to accept a new oracle.
-- An oracle's epoch base: written by the worker only (a base lowered by hand would let a
-- promotion after pg_upgrade fence at its deposed primary's epoch).
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.epoch_base
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.epoch_base ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.epoch_base
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
-- A member's handed-out counter blocks: written by the worker only (a lower end written by
-- hand would let an oracle gone back hand the member a block again); a superuser deletes a row
-- to accept an oracle restored on purpose.
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE ON tsoracle.member_counter
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_counter ENABLE ALWAYS TRIGGER only_the_worker;
-- A member's leases: written by the worker only (a row deleted by hand would let R pass a live
-- lease's stamps).
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.member_lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_lease ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.member_lease
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
-- A member's identity: written by the worker only (a copy given its original's identity by
-- hand would let the oracle keep one entry for two clusters).
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.member_identity
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_identity ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.member_identity
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();

-- Nobody but the worker lowers or removes what the durable tables hold: a lowered or
-- deleted high-water, counter or live lease would let the oracle issue again what it has
-- already issued (after the next restart, or at once for a lease). The WHEN clauses keep the
-- worker's own updates, which only raise, and the restore merge's off the trigger on the hot
-- path; the function lets the worker's deletes through (a dropped key, a released or expired
-- lease) and, like the drop guard, a superuser who has said they accept the loss (SET
-- tsoracle.allow_drop = on).
CREATE FUNCTION tsoracle.keep_what_was_issued() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A subscriber's apply of a delete (replica): the subscriber keeps what it holds (a key
    -- dropped or a lease released on the publisher stays; its own worker removes what it is
    -- done with). A replicated TRUNCATE is refused below: the apply stops until a DBA decides.
    IF TG_OP = 'DELETE' AND pg_catalog.current_setting('session_replication_role') = 'replica'
       AND pg_catalog.current_setting('tsoracle.allow_drop', true) IS DISTINCT FROM 'on' THEN
        RETURN NULL;
    END IF;
    -- A subscriber's apply of an update (replica): merge_replicated_row, which fires next,
    -- raises the row.
    IF NOT tsoracle.note_restore()
       OR pg_catalog.current_setting('tsoracle.allow_drop', true) = 'on'
       OR (TG_OP = 'UPDATE' AND pg_catalog.current_setting('session_replication_role') = 'replica') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'cannot % table %.%: only the tsoracle worker lowers or removes what it holds',
            CASE TG_OP WHEN 'UPDATE' THEN 'lower a row of' WHEN 'DELETE' THEN 'delete from'
                ELSE 'truncate' END,
            TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'object_in_use',
            DETAIL = CASE TG_TABLE_NAME
                WHEN 'high_water' THEN 'It holds the durable high-water: after a restart the oracle would issue timestamps it has already returned.'
                WHEN 'seq' THEN 'It holds the sequence counters: a lowered or deleted counter grants its blocks again.'
                ELSE 'It holds the leases: the safe frontier could pass a holder that still stamps below its bound.'
            END,
            HINT = CASE WHEN TG_OP = 'UPDATE' AND TG_TABLE_NAME <> 'lease'
                    AND pg_catalog.to_jsonb(NEW) -> 'key' IS NOT DISTINCT FROM pg_catalog.to_jsonb(OLD) -> 'key'
                    AND pg_catalog.to_jsonb(NEW) -> 'id' IS NOT DISTINCT FROM pg_catalog.to_jsonb(OLD) -> 'id'
                THEN 'If this UPDATE did not mean to lower it, run it again: tsoracle raised the row in place after the UPDATE read it (docs/operations/maintenance.md). '
                ELSE '' END
                || 'Drop a sequence key with tso_seq_drop(), release a lease with tso_lease_release(). To write the table anyway, a superuser first runs SET tsoracle.allow_drop = on.';
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.keep_what_was_issued() FROM PUBLIC;
CREATE TRIGGER keep_what_was_issued BEFORE UPDATE ON tsoracle.high_water
    FOR EACH ROW WHEN (NEW.physical_ms < OLD.physical_ms OR NEW.epoch < OLD.epoch
        OR NEW.id IS DISTINCT FROM OLD.id)
    EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued BEFORE UPDATE ON tsoracle.seq
    FOR EACH ROW WHEN (NEW.next < OLD.next OR NEW.key IS DISTINCT FROM OLD.key)
    EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued BEFORE UPDATE ON tsoracle.lease
    FOR EACH ROW WHEN (NEW.ts_upper_bound_ms < OLD.ts_upper_bound_ms
        OR NEW.expires_at_ms < OLD.expires_at_ms OR NEW.lease_id IS DISTINCT FROM OLD.lease_id)
    EXECUTE FUNCTION tsoracle.keep_what_was_issued();
-- ENABLE ALWAYS: an UPDATE in any session, also one that sets session_replication_role =
-- replica, locks the row before it is written and is refused a lowered value. The writes made
-- in place (a counter's advance, the worker's raise of the high-water) rely on both, and check
-- that the trigger is so before each write (docs/sequences.md, "The in-place path").
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued;
CREATE TRIGGER keep_what_was_issued_delete BEFORE DELETE ON tsoracle.high_water
    FOR EACH ROW EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued_delete BEFORE DELETE ON tsoracle.seq
    FOR EACH ROW EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued_delete BEFORE DELETE ON tsoracle.lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued_truncate BEFORE TRUNCATE ON tsoracle.high_water
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued_truncate BEFORE TRUNCATE ON tsoracle.seq
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.keep_what_was_issued();
CREATE TRIGGER keep_what_was_issued_truncate BEFORE TRUNCATE ON tsoracle.lease
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.keep_what_was_issued();
-- ENABLE ALWAYS too: a subscriber's apply never deletes nor truncates what it holds.
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;

REVOKE EXECUTE ON FUNCTION tso_seed(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_handover() FROM PUBLIC;

-- Predefined roles. Sequences and leases are privileges: grant tsoracle_seq_user to roles
-- that may create and advance counters, tsoracle_lease_holder to lease holders.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_lease_holder') THEN
        CREATE ROLE tsoracle_lease_holder NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_seq_user') THEN
        CREATE ROLE tsoracle_seq_user NOLOGIN;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_renew(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_release(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_renew(bigint) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_release(bigint) TO tsoracle_lease_holder;
REVOKE EXECUTE ON FUNCTION tso_lease_acquire_bounds(text, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_renew_bounds(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_lease_acquire_bounds(text, bigint, integer) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_renew_bounds(bigint) TO tsoracle_lease_holder;
REVOKE EXECUTE ON FUNCTION tso_seq(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_batch(text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_peek(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_drop(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_seq(text, integer) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_batch(text[], integer[]) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_peek(text) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_drop(text) TO tsoracle_seq_user;

-- A fleet (docs/fleet.md): the functions a member's worker calls on its oracle, executable by
-- tsoracle_member only. Grant it to the role the members log in as: that is all it needs.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_member') THEN
        CREATE ROLE tsoracle_member NOLOGIN;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.member_hello(bigint, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_report(bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_next(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_next(integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq_peek(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq_drop(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_acquire(text, bigint, integer, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_renew(bigint, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_release(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_safe_frontier() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tsoracle.member_hello(bigint, text, bigint) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_report(bigint, integer) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_next(integer) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_next(integer, text) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq_peek(text) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq_drop(text) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_acquire(text, bigint, integer, boolean) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_renew(bigint, boolean) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_release(bigint) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_safe_frontier() TO tsoracle_member;

-- Removing a member of the fleet gives up R_f's wait for it: superusers only.
REVOKE EXECUTE ON FUNCTION tso_fleet_remove(bigint) FROM PUBLIC;
-- Re-admitting a removed member: superusers only.
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint) FROM PUBLIC;
-- Admitting a cluster to the fleet, bound to its role: superusers only.
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint, regrole) FROM PUBLIC;
