-- tsoracle 0.3.0 -> 0.4.0 (ALTER EXTENSION tsoracle UPDATE TO '0.4.0').
-- Keeps every row: the high-water, the counters and the leases stay as they are.

\echo Use "ALTER EXTENSION tsoracle UPDATE TO '0.4.0'" to load this file. \quit

-- The lock protocol of 0.3.0's in-place path goes: every MVCC writer of tsoracle.seq took
-- SHARE ROW EXCLUSIVE, so one open transaction (or a VACUUM) held up every counter. The
-- writes made in place now leave alone a row a running transaction has locked
-- (docs/sequences.md, "The in-place path").
DROP TRIGGER lock_counters ON tsoracle.seq;
DROP FUNCTION tsoracle.lock_counters();

-- Leases tell their holder the lowest value it may stamp (docs/leases.md, "The lowest stamp").
ALTER TABLE tsoracle.lease ADD COLUMN ts_lower_bound_ms bigint;
ALTER TABLE tsoracle.lease ADD COLUMN holds bigint[];
COMMENT ON COLUMN tsoracle.lease.ts_lower_bound_ms IS 'The lowest millisecond the holder may stamp under its latest grant (NULL: a lease granted before 0.4.0, which stamps from expires_at_ms - ttl_ms).';
COMMENT ON COLUMN tsoracle.lease.holds IS 'Earlier grants still holding the resolved timestamp, as (lowest stamp, expiry) pairs in milliseconds.';

-- New functions: leases with both bounds, the handover of a switchover, the restore of a
-- high-water that takes no lock on its row.
CREATE  FUNCTION "tso_lease_acquire_bounds"(
	"holder" TEXT, /* Option < & str > */
	"holder_epoch" bigint, /* Option < i64 > */
	"ttl_ms" INT /* Option < i32 > */
) RETURNS TABLE (
	"lease_id" bigint,  /* i64 */
	"ts_lower_bound" bigint,  /* i64 */
	"ts_upper_bound" bigint,  /* i64 */
	"expires_at_ms" bigint,  /* i64 */
	"epoch" INT  /* i32 */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_lease_acquire_bounds_wrapper';

CREATE  FUNCTION "tso_lease_renew_bounds"(
	"lease_id" bigint /* i64 */
) RETURNS TABLE (
	"ts_lower_bound" bigint,  /* i64 */
	"ts_upper_bound" bigint,  /* i64 */
	"expires_at_ms" bigint,  /* i64 */
	"epoch" INT  /* i32 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_lease_renew_bounds_wrapper';

CREATE  FUNCTION "tso_handover"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_handover_wrapper';

CREATE  FUNCTION tsoracle."raise_restored_high_water"(
	"physical_ms" bigint, /* i64 */
	"epoch" bigint /* i64 */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'raise_restored_high_water_wrapper';

REVOKE EXECUTE ON FUNCTION tso_handover() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_acquire_bounds(text, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_renew_bounds(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_lease_acquire_bounds(text, bigint, integer) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_renew_bounds(bigint) TO tsoracle_lease_holder;
REVOKE EXECUTE ON FUNCTION tsoracle.raise_restored_high_water(bigint, bigint) FROM PUBLIC;

-- The restore merge: a restored high-water raised by the worker (no row lock), the new lease
-- columns merged; in every session (a subscriber's copy and apply merge too).
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
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER merge_restored_row;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER merge_restored_row;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER merge_restored_row;

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

-- Another cluster's resolved timestamp is never taken over by a subscriber.
CREATE OR REPLACE FUNCTION tsoracle.only_the_worker() RETURNS trigger
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
ALTER TABLE tsoracle.resolved ENABLE ALWAYS TRIGGER only_the_worker;

-- Nothing lowers what the tables hold in any session; the writes made in place rely on it.
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
            HINT = 'Drop a sequence key with tso_seq_drop(), release a lease with tso_lease_release(). To write the table anyway, a superuser first runs SET tsoracle.allow_drop = on.';
END
$$;
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued;
-- ENABLE ALWAYS too: a subscriber's apply never deletes nor truncates what it holds.
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued_delete;
ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;
ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;
ALTER TABLE tsoracle.lease ENABLE ALWAYS TRIGGER keep_what_was_issued_truncate;

-- A fleet (docs/fleet.md): what an oracle serves its members, and a member's status.
CREATE  FUNCTION "tso_member_status"() RETURNS TABLE (
	"oracle" TEXT,  /* String */
	"connected" bool,  /* bool */
	"oracle_pid" INT,  /* Option < i32 > */
	"oracle_epoch" bigint,  /* Option < i64 > */
	"connects" bigint,  /* i64 */
	"round_trips" bigint,  /* i64 */
	"calls_served" bigint,  /* i64 */
	"values_fetched" bigint,  /* i64 */
	"values_per_round_trip" double precision,  /* Option < f64 > */
	"mean_round_trip_ms" double precision,  /* Option < f64 > */
	"last_round_trip_ms" double precision,  /* Option < f64 > */
	"last_error" TEXT,  /* Option < String > */
	"last_error_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_member_status_wrapper';

CREATE  FUNCTION tsoracle."member_safe_frontier"() RETURNS TABLE (
	"frontier" bigint,  /* i64 */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_safe_frontier_wrapper';

CREATE  FUNCTION tsoracle."member_seq_peek"(
	"key" TEXT /* & str */
) RETURNS TABLE (
	"next" bigint,  /* Option < i64 > */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_seq_peek_wrapper';

CREATE  FUNCTION tsoracle."member_seq"(
	"keys" TEXT[], /* Vec < String > */
	"counts" INT[] /* Vec < i32 > */
) RETURNS TABLE (
	"start" bigint,  /* i64 */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_seq_wrapper';

CREATE  FUNCTION tsoracle."member_next"(
	"count" INT /* i32 */
) RETURNS bigint[] /* Vec < i64 > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_next_wrapper';

CREATE  FUNCTION tsoracle."member_lease_renew"(
	"id" bigint, /* i64 */
	"legacy" bool /* bool */
) RETURNS TABLE (
	"lease_id" bigint,  /* i64 */
	"ts_lower_bound" bigint,  /* i64 */
	"ts_upper_bound" bigint,  /* i64 */
	"expires_at_ms" bigint,  /* i64 */
	"lease_epoch" INT,  /* i32 */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_lease_renew_wrapper';

CREATE  FUNCTION tsoracle."member_seq_drop"(
	"key" TEXT /* & str */
) RETURNS TABLE (
	"dropped" bool,  /* bool */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_seq_drop_wrapper';

CREATE  FUNCTION tsoracle."member_hello"(
	"member_system_id" bigint, /* i64 */
	"member_version" TEXT, /* & str */
	"member_resolved" bigint /* i64 */
) RETURNS TABLE (
	"system_id" bigint,  /* i64 */
	"version" TEXT,  /* String */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_hello_wrapper';

CREATE  FUNCTION tsoracle."member_lease_release"(
	"lease_id" bigint /* i64 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_lease_release_wrapper';

CREATE  FUNCTION tsoracle."member_lease_acquire"(
	"holder" TEXT, /* & str */
	"holder_epoch" bigint, /* i64 */
	"ttl_ms" INT, /* i32 */
	"legacy" bool /* bool */
) RETURNS TABLE (
	"lease_id" bigint,  /* i64 */
	"ts_lower_bound" bigint,  /* i64 */
	"ts_upper_bound" bigint,  /* i64 */
	"expires_at_ms" bigint,  /* i64 */
	"lease_epoch" INT,  /* i32 */
	"epoch" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_lease_acquire_wrapper';

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
REVOKE EXECUTE ON FUNCTION tsoracle.member_next(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq_peek(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_seq_drop(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_acquire(text, bigint, integer, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_renew(bigint, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_lease_release(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_safe_frontier() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tsoracle.member_hello(bigint, text, bigint) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_next(integer) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq(text[], integer[]) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq_peek(text) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_seq_drop(text) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_acquire(text, bigint, integer, boolean) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_renew(bigint, boolean) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_lease_release(bigint) TO tsoracle_member;
GRANT EXECUTE ON FUNCTION tsoracle.member_safe_frontier() TO tsoracle_member;

-- The fleet's resolved timestamp (docs/fleet.md, "The fleet's resolved timestamp").
CREATE TABLE tsoracle.fleet_member (
    system_id     bigint PRIMARY KEY,
    role          oid NOT NULL,
    resolved      bigint NOT NULL CHECK (resolved >= 0),
    held_by_pid   integer,
    registered_at timestamptz NOT NULL,
    reported_at   timestamptz
);
COMMENT ON TABLE tsoracle.fleet_member IS 'The members of the fleet this oracle serves: each holds the fleet-wide resolved timestamp at or below the highest resolved timestamp it reported, until it reports a higher one or a superuser removes it (tso_fleet_remove).';
CREATE TABLE tsoracle.fleet_resolved (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    ts         bigint NOT NULL CHECK (ts >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.fleet_resolved IS 'The fleet-wide resolved timestamp the tsoracle worker last published: every timestamp at or below ts was obtained, on any cluster of the fleet, by a transaction that had ended.';
INSERT INTO tsoracle.fleet_resolved (id, ts) VALUES (true, 0);
REVOKE ALL ON tsoracle.fleet_member, tsoracle.fleet_resolved FROM PUBLIC;
GRANT SELECT ON tsoracle.fleet_member, tsoracle.fleet_resolved TO PUBLIC;
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

CREATE  FUNCTION "tso_fleet_resolved"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_resolved_wrapper';

CREATE  FUNCTION "tso_fleet_status"() RETURNS TABLE (
	"system_id" bigint,  /* i64 */
	"role" TEXT,  /* String */
	"resolved" bigint,  /* i64 */
	"lag_ms" bigint,  /* Option < i64 > */
	"held_by_pid" INT,  /* Option < i32 > */
	"holds_fleet" bool,  /* bool */
	"durable" bool,  /* bool */
	"session_pid" INT,  /* Option < i32 > */
	"registered_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"reported_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_status_wrapper';

CREATE  FUNCTION "tso_fleet_remove"(
	"system_id" bigint /* i64 */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_remove_wrapper';

CREATE  FUNCTION tsoracle."member_report"(
	"resolved" bigint, /* i64 */
	"held_by_pid" INT /* i32 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'member_report_wrapper';
REVOKE EXECUTE ON FUNCTION tso_fleet_remove(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.member_report(bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tsoracle.member_report(bigint, integer) TO tsoracle_member;
