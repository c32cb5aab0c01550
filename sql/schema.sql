-- tsoracle: the durable state, in schema tsoracle of the database named by tsoracle.database.
-- Written only by the extension's background worker (and merged by restores, see
-- tsoracle.merge_restored_row). Installed first (bootstrap), before the functions.

CREATE SCHEMA tsoracle;
COMMENT ON SCHEMA tsoracle IS 'Durable state of the tsoracle extension; written only by its worker.';

-- The durable high-water: no timestamp is ever issued above it, and the fence starts above it.
-- Written by the worker only, with GREATEST (it never goes back).
-- No row at creation: the worker inserts it at its first fence.
CREATE TABLE tsoracle.high_water (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    physical_ms bigint NOT NULL CHECK (physical_ms >= 0),
    epoch       bigint NOT NULL CHECK (epoch >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.high_water IS 'Durable upper bound (Unix ms) of every timestamp tsoracle has issued; epoch is the epoch of the last fence (its WAL timeline plus tsoracle.epoch_base.base).';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.high_water', '');

-- Dense counters for tso_seq(): `next` is the start of the next block. Advanced only by the
-- worker, in group commits, never backwards. `owner` is the role that created the key (NULL:
-- a key from before 0.2.0, shared by every tsoracle_seq_user).
CREATE TABLE tsoracle.seq (
    key        text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 128),
    next       bigint NOT NULL CHECK (next >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    owner      regrole,
    made       bigint NOT NULL DEFAULT 0 CHECK (made >= 0)
);
COMMENT ON COLUMN tsoracle.seq.made IS 'The key''s incarnation: a timestamp the worker issued when it created the row (0: made before 0.6.0, or by hand). A member refuses a block of an older incarnation than one it handed out blocks of.';
COMMENT ON TABLE tsoracle.seq IS 'tso_seq() counters: next is the first value of the next block granted for key; owner may use it (with its members) and drop it.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.seq', '');

-- Leases (tso_lease_acquire): a holder may stamp timestamps up to ts_upper_bound_ms (a
-- durable high-water) until expires_at_ms. lease_id is the acquire-time bound, unique for
-- all time because the high-water never repeats. `owner` is the role that acquired it.
CREATE TABLE tsoracle.lease (
    lease_id          bigint PRIMARY KEY,
    holder            text NOT NULL CHECK (octet_length(holder) BETWEEN 1 AND 128),
    holder_epoch      bigint NOT NULL,
    ts_upper_bound_ms bigint NOT NULL,
    expires_at_ms     bigint NOT NULL,
    ttl_ms            bigint NOT NULL CHECK (ttl_ms > 0),
    superseded        boolean NOT NULL DEFAULT false,
    granted_at        timestamptz NOT NULL DEFAULT now(),
    renewed_at        timestamptz,
    owner             regrole,
    ts_lower_bound_ms bigint,
    holds             bigint[]
);
COMMENT ON TABLE tsoracle.lease IS 'Live tsoracle leases; written only by the worker. Only owner (or a superuser) may renew or release a lease.';
COMMENT ON COLUMN tsoracle.lease.ts_lower_bound_ms IS 'The lowest millisecond the holder may stamp under its latest grant (NULL: a lease granted before 0.4.0, which stamps from expires_at_ms - ttl_ms).';
COMMENT ON COLUMN tsoracle.lease.holds IS 'Earlier grants still holding the resolved timestamp, as (lowest stamp, expiry) pairs in milliseconds.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.lease', '');

-- The resolved timestamp as the worker last published it (tso_resolved() on a hot standby
-- reads it as far as the standby has replayed). Written by the worker only; not dumped (it is
-- derived, and a restored cluster publishes its own).
CREATE TABLE tsoracle.resolved (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    ts         bigint NOT NULL CHECK (ts >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.resolved IS 'The resolved timestamp the tsoracle worker last published: every timestamp at or below ts was issued to a transaction that had ended.';
INSERT INTO tsoracle.resolved (id, ts) VALUES (true, 0);

-- A fleet's resolved timestamp R_f (docs/fleet.md), on its oracle: each member registered,
-- with the highest resolved timestamp it reported, and R_f as the worker last published it
-- (tso_fleet_resolved() on a hot standby reads it as far as the standby has replayed).
-- Written by the worker only; not dumped (a restored oracle's members register again).
CREATE TABLE tsoracle.fleet_member (
    system_id     bigint PRIMARY KEY,
    role          oid NOT NULL,
    resolved      bigint NOT NULL CHECK (resolved >= 0),
    held_by_pid   integer,
    registered_at timestamptz NOT NULL,
    reported_at   timestamptz,
    removed_at    timestamptz,
    run           bigint NOT NULL DEFAULT 0 CHECK (run >= 0),
    held_at       bigint CHECK (held_at >= 0)
);
COMMENT ON TABLE tsoracle.fleet_member IS 'The members of the fleet this oracle serves: each holds the fleet-wide resolved timestamp at or below the highest resolved timestamp it reported, until it reports a higher one or a superuser removes it (tso_fleet_remove). A removed member (removed_at) holds nothing and is refused until a superuser re-admits it (tso_fleet_admit).';
COMMENT ON COLUMN tsoracle.fleet_member.run IS 'The run of the member''s cluster that speaks for it (its postmaster''s start, in microseconds; 0: not known), so that after the oracle''s restart or failover a run that does not prove this one ended is still held.';
COMMENT ON COLUMN tsoracle.fleet_member.held_at IS 'Where the entry is held since a run took it over without proving the one before had ended (NULL: not held): no report raises it above, until a superuser runs tso_fleet_admit(system_id).';
-- On an oracle: the clusters admitted to its fleet (docs/fleet.md, "Admission"), each bound to
-- the one role it logs in as. A hello from a cluster not admitted, or under another role, is
-- refused before it registers anything. Written by tso_fleet_admit() (superusers only), in
-- the caller's transaction; kept with the cluster (its standbys, pg_upgrade).
CREATE TABLE tsoracle.fleet_admission (
    system_id   bigint PRIMARY KEY,
    role        oid NOT NULL,
    admitted_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.fleet_admission IS 'The clusters this oracle serves as members (system_id: the identity a member says hello with), each bound to the role it logs in as; written by tso_fleet_admit(system_id, role), superusers only. A hello from any other cluster, or under another role, is refused (42501).';
CREATE TABLE tsoracle.fleet_resolved (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    ts         bigint NOT NULL CHECK (ts >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.fleet_resolved IS 'The fleet-wide resolved timestamp the tsoracle worker last published: every timestamp at or below ts was obtained, on any cluster of the fleet, by a transaction that had ended.';
INSERT INTO tsoracle.fleet_resolved (id, ts) VALUES (true, 0);

-- On a member of a fleet (docs/fleet.md): the oracle that served it, as its worker last saw
-- it — the oracle's system identifier and the highest epoch it answered with. Written by the
-- worker before it hands out anything of a new epoch, so that after any restart, and on a
-- promoted standby of the member, it still refuses a deposed primary and another cluster.
-- No row: never served. A superuser deletes the row to accept a new oracle on purpose.
-- Dumped: the mark of a member, restored with its data (tsoracle.merge_restored_mark), so that a
-- cluster that holds what the fleet handed out never hands it out again on its own.
CREATE TABLE tsoracle.member_oracle (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    system_id  bigint NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.member_oracle IS 'On a member: the oracle that served it (system identifier) and the highest epoch it answered with; the member refuses any other oracle, and any older epoch (a deposed primary). Delete the row to accept a new oracle.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.member_oracle', '');

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

-- On a member of a fleet: the last block of each counter it handed out (docs/fleet.md, "What
-- is checked, and refused"): the key's incarnation on the oracle (tsoracle.seq.made) and one
-- past the block's last value. Raised by the worker when it publishes its resolved
-- timestamp (it lags by that interval), never lowered; the oracle's answers below it are
-- refused after any restart. Not dumped: a restored copy is another member.
CREATE TABLE tsoracle.member_counter (
    key        text PRIMARY KEY,
    made       bigint NOT NULL CHECK (made >= 0),
    next       bigint NOT NULL CHECK (next >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.member_counter IS 'On a member: the last block of each counter it handed out (next: one past its last value), with the key''s incarnation on the oracle (made); the member refuses any block the oracle answers below it.';

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

REVOKE ALL ON SCHEMA tsoracle FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA tsoracle FROM PUBLIC;
-- The high-water may be read by anyone (monitoring, tso_status() on a standby).
GRANT USAGE ON SCHEMA tsoracle TO PUBLIC;
GRANT SELECT ON tsoracle.high_water TO PUBLIC;
-- And the published resolved timestamp (tso_resolved() on a standby).
GRANT SELECT ON tsoracle.resolved TO PUBLIC;
-- And the fleet's (tso_fleet_resolved() and tso_fleet_status() on a standby).
GRANT SELECT ON tsoracle.fleet_member, tsoracle.fleet_resolved, tsoracle.fleet_admission TO PUBLIC;
