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
