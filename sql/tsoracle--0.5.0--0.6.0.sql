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
