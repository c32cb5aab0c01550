//! tsoracle: strictly increasing timestamps and durable sequences from SQL.
//!
//! Layout: the pure algorithm is the `tsoracle-core` crate; here are the PostgreSQL parts:
//! `shmem` (shared state), `worker` (the only writer of durable state), `oracle` (the
//! caller's side), `api` (the SQL surface), `guc`, `error` and `replica`.

use pgrx::prelude::*;

mod api;
mod clock;
mod error;
mod guc;
mod lease;
mod oracle;
mod replica;
mod seq;
mod shmem;
mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod testing;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // Settings, shared memory and the worker exist only when preloaded (a postmaster-level
    // setting cannot even be defined later); otherwise every function reports how to fix
    // it (TsoError::NotPreloaded).
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        guc::define();
        shmem::init();
        worker::register();
    }
}

extension_sql!(
    r#"
CREATE SCHEMA tsoracle;
COMMENT ON SCHEMA tsoracle IS 'Durable state of the tsoracle extension; written only by its worker.';

-- The durable high-water: no timestamp is ever issued above it, and the fence starts above it.
-- Written by the worker only, with GREATEST (it never goes back).
-- No row at creation: the worker inserts it, so a pg_dump restore does not collide.
CREATE TABLE tsoracle.high_water (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    physical_ms bigint NOT NULL CHECK (physical_ms >= 0),
    epoch       bigint NOT NULL CHECK (epoch >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.high_water IS 'Durable upper bound (Unix ms) of every timestamp tsoracle has issued; epoch is the WAL timeline of the last fence.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.high_water', '');

-- Dense counters for tso_seq(): `next` is the start of the next block. Advanced only by the
-- worker, in group commits, never backwards.
CREATE TABLE tsoracle.seq (
    key        text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 128),
    next       bigint NOT NULL CHECK (next >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tsoracle.seq IS 'tso_seq() counters: next is the first value of the next block granted for key.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.seq', '');

-- Leases (tso_lease_acquire): a holder may stamp timestamps up to ts_upper_bound_ms (a
-- durable high-water) until expires_at_ms. lease_id is the acquire-time bound, unique for
-- all time because the high-water never repeats.
CREATE TABLE tsoracle.lease (
    lease_id          bigint PRIMARY KEY,
    holder            text NOT NULL CHECK (octet_length(holder) BETWEEN 1 AND 128),
    holder_epoch      bigint NOT NULL,
    ts_upper_bound_ms bigint NOT NULL,
    expires_at_ms     bigint NOT NULL,
    ttl_ms            bigint NOT NULL CHECK (ttl_ms > 0),
    superseded        boolean NOT NULL DEFAULT false,
    granted_at        timestamptz NOT NULL DEFAULT now(),
    renewed_at        timestamptz
);
COMMENT ON TABLE tsoracle.lease IS 'Live tsoracle leases; written only by the worker.';
SELECT pg_catalog.pg_extension_config_dump('tsoracle.lease', '');

REVOKE ALL ON SCHEMA tsoracle FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA tsoracle FROM PUBLIC;
-- The high-water may be read by anyone (monitoring, tso_status() on a standby).
GRANT USAGE ON SCHEMA tsoracle TO PUBLIC;
GRANT SELECT ON tsoracle.high_water TO PUBLIC;
"#,
    name = "tsoracle_schema",
    bootstrap
);

extension_sql!(
    r#"
REVOKE EXECUTE ON FUNCTION tso_seed(bigint) FROM PUBLIC;

-- Leases are a privilege: grant the role tsoracle_lease_holder (or EXECUTE) to holders.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_lease_holder') THEN
        CREATE ROLE tsoracle_lease_holder NOLOGIN;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_renew(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_release(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_renew(bigint) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_release(bigint) TO tsoracle_lease_holder;
"#,
    name = "tsoracle_privileges",
    finalize
);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'tsoracle'", "tsoracle.database = 'pgrx_tests'"]
    }
}
