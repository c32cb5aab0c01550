-- tsoracle 0.4.0 -> 0.5.0: a member of a fleet remembers the oracle that served it; a removed
-- member stays out until it is re-admitted; a member keeps the leases granted through it; a
-- member's copy promoted beside it takes an identity of its own.

-- On a member of a fleet (docs/fleet.md): the oracle that served it, as its worker last saw
-- it — the oracle's system identifier and the highest epoch it answered with. Written by the
-- worker before it hands out anything of a new epoch, so that after any restart, and on a
-- promoted standby of the member, it still refuses a deposed primary and another cluster.
-- No row: never served. A superuser deletes the row to accept a new oracle on purpose. Not
-- dumped: a restored copy is another member.
CREATE TABLE tsoracle.member_oracle (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    system_id  bigint NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.member_oracle IS 'On a member: the oracle that served it (system identifier) and the highest epoch it answered with; the member refuses any other oracle, and any older epoch (a deposed primary). Delete the row to accept a new oracle.';
REVOKE ALL ON tsoracle.member_oracle FROM PUBLIC;
-- Written by the worker only (a lower epoch written by hand would let a deposed primary serve
-- it); a superuser deletes the row to accept a new oracle.
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE ON tsoracle.member_oracle
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_oracle ENABLE ALWAYS TRIGGER only_the_worker;

-- A removed member stays out of the fleet until a superuser re-admits it (tso_fleet_admit).
ALTER TABLE tsoracle.fleet_member ADD COLUMN removed_at timestamptz;
COMMENT ON TABLE tsoracle.fleet_member IS 'The members of the fleet this oracle serves: each holds the fleet-wide resolved timestamp at or below the highest resolved timestamp it reported, until it reports a higher one or a superuser removes it (tso_fleet_remove). A removed member (removed_at) holds nothing and is refused until a superuser re-admits it (tso_fleet_admit).';

CREATE  FUNCTION "tso_fleet_admit"(
	"system_id" bigint /* i64 */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_admit_wrapper';
-- Re-admitting a removed member: superusers only.
REVOKE EXECUTE ON FUNCTION tso_fleet_admit(bigint) FROM PUBLIC;

-- On a member of a fleet: each lease granted through it (one row per grant: a renewal's new
-- lowest stamp is a row of its own), kept by the worker before the holder hears of it, so that
-- the member's resolved timestamp still waits for it after any restart (docs/fleet.md). Rows
-- expired by both clocks are deleted. Not dumped: a restored copy is another member.
CREATE TABLE tsoracle.member_lease (
    lease_id        bigint NOT NULL,
    lower_ms        bigint NOT NULL,
    upper_ms        bigint NOT NULL,
    expires_at_ms   bigint NOT NULL,
    expires_mono_ms bigint NOT NULL,
    PRIMARY KEY (lease_id, lower_ms)
);
COMMENT ON TABLE tsoracle.member_lease IS 'On a member: the leases granted through it, which hold its resolved timestamp below their lowest stamp (lower_ms) until they expire.';
REVOKE ALL ON tsoracle.member_lease FROM PUBLIC;
-- Written by the worker only: a row deleted by hand would let R pass a live lease's stamps.
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.member_lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_lease ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.member_lease
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();

-- On a member of a fleet: the identity it registers under on the oracle (docs/fleet.md) and
-- the timeline it was last registered on. No row: its system identifier. A copy of the member
-- (pg_basebackup, a restore) promoted beside its live original finds that identity in use and
-- takes one of its own; a promoted standby whose old primary is gone keeps it. Written by the
-- worker only. Not dumped: a restored copy is another member.
CREATE TABLE tsoracle.member_identity (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    member_id  bigint NOT NULL CHECK (member_id <> 0),
    timeline   bigint NOT NULL CHECK (timeline > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.member_identity IS 'On a member: the identity it registers under on the oracle (member_id: its system identifier, or one of its own taken when it was promoted beside a live original that shares it) and the timeline it was last registered on.';
REVOKE ALL ON tsoracle.member_identity FROM PUBLIC;
-- A member's identity: written by the worker only (a copy given its original's identity by
-- hand would let the oracle keep one entry for two clusters).
CREATE TRIGGER only_the_worker BEFORE INSERT OR UPDATE OR DELETE ON tsoracle.member_identity
    FOR EACH ROW EXECUTE FUNCTION tsoracle.only_the_worker();
ALTER TABLE tsoracle.member_identity ENABLE ALWAYS TRIGGER only_the_worker;
CREATE TRIGGER only_the_worker_truncate BEFORE TRUNCATE ON tsoracle.member_identity
    FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.only_the_worker();
