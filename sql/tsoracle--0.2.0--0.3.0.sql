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
