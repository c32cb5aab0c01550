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
    guc::define();
    // Shared memory and the worker exist only when preloaded; otherwise every function
    // reports how to fix it (TsoError::NotPreloaded).
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
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

REVOKE ALL ON SCHEMA tsoracle FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA tsoracle FROM PUBLIC;
"#,
    name = "tsoracle_schema",
    bootstrap
);

extension_sql!(
    r#"
REVOKE EXECUTE ON FUNCTION tso_seed(bigint) FROM PUBLIC;
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
