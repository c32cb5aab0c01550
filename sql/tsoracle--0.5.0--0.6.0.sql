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
