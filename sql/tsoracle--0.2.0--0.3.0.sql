-- tsoracle 0.2.0 -> 0.3.0 (ALTER EXTENSION tsoracle UPDATE TO '0.3.0').
-- Keeps every row: the high-water, the counters and the leases stay as they are.

\echo Use "ALTER EXTENSION tsoracle UPDATE TO '0.3.0'" to load this file. \quit

-- New function: the clocks (the wall clock, the reference clock of the lead cap, the steps
-- the worker has seen, how long issuing may go on without another confirmed commit).
CREATE  FUNCTION "tso_clock"() RETURNS TABLE (
	"wall_ms" bigint,  /* i64 */
	"reference_ms" bigint,  /* Option < i64 > */
	"reference_lead_ms" bigint,  /* Option < i64 > */
	"issued_lead_ms" bigint,  /* Option < i64 > */
	"steps_back" bigint,  /* i64 */
	"steps_forward" bigint,  /* i64 */
	"last_step_ms" bigint,  /* Option < i64 > */
	"serve_left_ms" bigint  /* Option < i64 > */
)
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_clock_wrapper';

-- New functions: UUIDv7 made of tsoracle timestamps (README, "UUIDs").
CREATE  FUNCTION "tso_next_uuid"() RETURNS uuid /* Uuid */
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_next_uuid_wrapper';

CREATE  FUNCTION "tso_uuid"(
	"ts" bigint /* i64 */
) RETURNS uuid /* Uuid */
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_uuid_wrapper';

CREATE  FUNCTION "tso_from_uuid"(
	"id" uuid /* Uuid */
) RETURNS bigint /* i64 */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_from_uuid_wrapper';

-- The resolved timestamp (README, "Reading in order"): the table the worker publishes it in
-- for hot standbys, its guard, and the functions.
CREATE TABLE tsoracle.resolved (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    ts         bigint NOT NULL CHECK (ts >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.resolved IS 'The resolved timestamp the tsoracle worker last published: every timestamp at or below ts was issued to a transaction that had ended.';
INSERT INTO tsoracle.resolved (id, ts) VALUES (true, 0);
REVOKE ALL ON tsoracle.resolved FROM PUBLIC;
GRANT SELECT ON tsoracle.resolved TO PUBLIC;

CREATE FUNCTION tsoracle.only_the_worker() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
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
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.resolved
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
    IF NOT tsoracle.note_restore()
       OR pg_catalog.current_setting('tsoracle.allow_drop', true) = 'on' THEN
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

-- The lock protocol of tso_seq's in-place path (docs/sequences.md): a caller that advances a
-- counter in place holds ROW EXCLUSIVE on tsoracle.seq while it writes; every MVCC writer of
-- the table (the worker, the restore merge, a superuser's statement) first takes SHARE ROW
-- EXCLUSIVE, which waits for those writes and keeps new ones out until it commits. So no
-- statement reads a counter that is then moved under it. Statement-level, before any row is
-- read; COPY fires it too.
CREATE FUNCTION tsoracle.lock_counters() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE tsoracle.seq IN SHARE ROW EXCLUSIVE MODE;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.lock_counters() FROM PUBLIC;
CREATE TRIGGER lock_counters BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.seq
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.lock_counters();

CREATE  FUNCTION "tso_resolved"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_resolved_wrapper';

CREATE  FUNCTION "tso_wait_resolved"(
	"ts" bigint, /* i64 */
	"timeout_ms" INT /* i32 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_wait_resolved_wrapper';

CREATE  FUNCTION "tso_resolved_status"() RETURNS TABLE (
	"resolved" bigint,  /* Option < i64 > */
	"lag_ms" bigint,  /* Option < i64 > */
	"holders" INT,  /* i32 */
	"oldest_holder_pid" INT,  /* Option < i32 > */
	"oldest_holder_ts" bigint,  /* Option < i64 > */
	"oldest_holder_since" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"published" bigint,  /* Option < i64 > */
	"published_at_ms" bigint  /* Option < i64 > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_resolved_status_wrapper';
