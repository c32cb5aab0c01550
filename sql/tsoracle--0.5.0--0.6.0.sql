-- tsoracle 0.5.0 -> 0.6.0. The 0.6.0 library serves a database only once its extension is at
-- 0.6.0 (tso_status().state = 'outdated_schema' until then), so this step is run after the
-- restart: ALTER EXTENSION tsoracle UPDATE.

-- On an oracle: which run of each member's cluster speaks for it, and where its entry is held
-- since a run took it over without proving the one before had ended (docs/fleet.md, "One run
-- at a time"), kept so that the oracle's restart or failover forgets neither. Rows of 0.5.0
-- know no run (0): the first run to say hello after the update is taken at its word.
ALTER TABLE tsoracle.fleet_member
    ADD COLUMN run bigint NOT NULL DEFAULT 0 CHECK (run >= 0),
    ADD COLUMN held_at bigint CHECK (held_at >= 0);
COMMENT ON COLUMN tsoracle.fleet_member.run IS 'The run of the member''s cluster that speaks for it (its postmaster''s start, in microseconds; 0: not known), so that after the oracle''s restart or failover a run that does not prove this one ended is still held.';
COMMENT ON COLUMN tsoracle.fleet_member.held_at IS 'Where the entry is held since a run took it over without proving the one before had ended (NULL: not held): no report raises it above, until a superuser runs tso_fleet_admit(system_id).';

-- A counter's incarnation on the oracle (docs/fleet.md, "What is checked, and refused"): a
-- timestamp the worker issues when it creates the key's row, so that a member can tell a key
-- dropped and made again (a higher one) from an oracle gone back (a lower one, or a block
-- below one it handed out). Rows of 0.5.0 are incarnation 0.
ALTER TABLE tsoracle.seq ADD COLUMN made bigint NOT NULL DEFAULT 0 CHECK (made >= 0);
COMMENT ON COLUMN tsoracle.seq.made IS 'The key''s incarnation: a timestamp the worker issued when it created the row (0: made before 0.6.0, or by hand). A member refuses a block of an older incarnation than one it handed out blocks of.';

-- On a member of a fleet: the last block of each counter it handed out, kept when it
-- publishes its resolved timestamp; the oracle's answers below it are refused after any
-- restart. Not dumped: a restored copy is another member.
CREATE TABLE tsoracle.member_counter (
    key        text PRIMARY KEY,
    made       bigint NOT NULL CHECK (made >= 0),
    next       bigint NOT NULL CHECK (next >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.member_counter IS 'On a member: the last block of each counter it handed out (next: one past its last value), with the key''s incarnation on the oracle (made); the member refuses any block the oracle answers below it.';
REVOKE ALL ON tsoracle.member_counter FROM PUBLIC;
-- Written by the worker only (a lower end written by hand would let an oracle gone back hand
-- the member a block again); a superuser deletes a row to accept an oracle restored on purpose.
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE ON tsoracle.member_counter
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_counter ENABLE ALWAYS TRIGGER only_the_worker;

-- A member's blocks come with the key's incarnation (a third column: a member of 0.5.0 reads
-- the first two).
DROP FUNCTION tsoracle.member_seq(text[], integer[]);
CREATE  FUNCTION tsoracle."member_seq"(
	"keys" TEXT[], /* Vec < String > */
	"counts" INT[] /* Vec < i32 > */
) RETURNS TABLE (
	"start" bigint,  /* i64 */
	"epoch" bigint,  /* i64 */
	"made" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_seq_wrapper';
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) TO tsoracle_member;

-- A member of 0.6.0 asks for values with member_next(count, session): its session's filter in
-- the function, the answer as text, the bytes of member_next(count)'s array, which serves
-- members of 0.5.0.
CREATE  FUNCTION tsoracle."member_next"(
	"count" INT, /* i32 */
	"session" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_next_named_wrapper';
REVOKE EXECUTE ON FUNCTION tsoracle.member_next(integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tsoracle.member_next(integer, text) TO tsoracle_member;

-- An oracle's epoch base (docs/worker.md, "The fence"): each fence commits the epoch
-- `base + timeline` (never below the epoch it found), and keeps `base = epoch - timeline`
-- here first, in a commit of its own, so that after pg_upgrade (which starts the timeline again at 1)
-- or a restore that brought a higher epoch, each promotion still raises the epoch and a
-- deposed primary answers a lower one than its successor. Written by the worker only.
CREATE TABLE tsoracle.epoch_base (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    base       bigint NOT NULL CHECK (base >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.epoch_base IS 'The epoch a fence commits is base + its WAL timeline, never below the epoch in tsoracle.high_water: kept so that every promotion raises the epoch, also after pg_upgrade started the timeline again at 1.';
REVOKE ALL ON tsoracle.epoch_base FROM PUBLIC;
COMMENT ON TABLE tsoracle.high_water IS 'Durable upper bound (Unix ms) of every timestamp tsoracle has issued; epoch is the epoch of the last fence (its WAL timeline plus tsoracle.epoch_base.base).';
-- Written by the worker only (a base lowered by hand would let a promotion after pg_upgrade
-- fence at its deposed primary's epoch).
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.epoch_base
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.epoch_base ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.epoch_base
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();

-- A superuser's UPDATE refused for a value a call raised in place after the UPDATE read the
-- row is told to run it again (the HINT), before being told of tsoracle.allow_drop.
CREATE OR REPLACE FUNCTION tsoracle.keep_what_was_issued() RETURNS trigger
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

-- A restored or replicated counter row keeps the newer incarnation (made) of the two merged,
-- as it keeps the larger next: a member that kept a block of the newer one goes on.
CREATE OR REPLACE FUNCTION tsoracle.merge_restored_row() RETURNS trigger
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
CREATE OR REPLACE FUNCTION tsoracle.merge_replicated_row() RETURNS trigger
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

-- A member's mark is dumped, and merged by a restore (docs/operations/backups.md, "A member of
-- a fleet"): a member's dump restored into a cluster on its own no longer hands out again
-- what the fleet handed out through the member.
SELECT pg_catalog.pg_extension_config_dump('tsoracle.member_oracle', '');
DROP TRIGGER only_the_worker ON tsoracle.member_oracle;
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
-- On an oracle: the clusters admitted to its fleet (docs/fleet.md, "Admission"), each bound to
-- the one role it logs in as; a hello from any other cluster, or under another role, is
-- refused before it registers anything. Every member registered before the update counts as
-- admitted, bound to the role it registered as (removed ones too: tso_fleet_admit(system_id)
-- still re-admits them), so that a running fleet keeps being served.
CREATE TABLE tsoracle.fleet_admission (
    system_id   bigint PRIMARY KEY,
    role        oid NOT NULL,
    admitted_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.fleet_admission IS 'The clusters this oracle serves as members (system_id: the identity a member says hello with), each bound to the role it logs in as; written by tso_fleet_admit(system_id, role), superusers only. A hello from any other cluster, or under another role, is refused (42501).';
GRANT SELECT ON tsoracle.fleet_admission TO PUBLIC;
INSERT INTO tsoracle.fleet_admission (system_id, role, admitted_at)
    SELECT system_id, role, registered_at FROM ONLY tsoracle.fleet_member;

CREATE  FUNCTION "tso_fleet_admit"(
	"system_id" bigint, /* i64 */
	"member_role" TEXT /* &str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_admit_as_wrapper';
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint, text) FROM PUBLIC;
CREATE  FUNCTION "tso_fleet_admit"(
	"system_id" bigint, /* i64 */
	"member_role" regrole /* pg_sys::Oid */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_admit_role_wrapper';
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint, regrole) FROM PUBLIC;

-- tso_fleet_status(): the role each member is admitted for, whether a session of it is
-- connected now (session_pid only while that process lives), when it was admitted, and the
-- clusters admitted that never registered (resolved NULL).
DROP FUNCTION tso_fleet_status();
CREATE  FUNCTION "tso_fleet_status"() RETURNS TABLE (
	"system_id" bigint,  /* i64 */
	"role" TEXT,  /* String */
	"resolved" bigint,  /* Option < i64 > */
	"lag_ms" bigint,  /* Option < i64 > */
	"held_by_pid" INT,  /* Option < i32 > */
	"holds_fleet" bool,  /* bool */
	"durable" bool,  /* bool */
	"session_pid" INT,  /* Option < i32 > */
	"connected" bool,  /* bool */
	"admitted_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"registered_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"reported_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_status_wrapper';
