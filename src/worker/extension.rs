//! Waiting for the extension: the worker serves only once `CREATE EXTENSION tsoracle` (or
//! `ALTER EXTENSION tsoracle UPDATE`) has made the extension in its database the version this
//! library serves, with the tables it reads and writes as members. On a member, what it waits
//! for is also its `tso_member_status().last_error`: its own schema, not the oracle, is why it
//! does not connect.

use super::state::set_phase;
use crate::pg::xact::transaction;
use crate::pg::EXTENSION_VERSION;
use crate::shmem::member::MEMBER;
use crate::shmem::{Phase, Signals, ORACLE};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::time::Duration;

/// The tables this library reads and writes; each must be a member of the extension.
const TABLES: [&str; 11] = [
    "high_water",
    "seq",
    "lease",
    "resolved",
    "epoch_base",
    "fleet_member",
    "fleet_resolved",
    "member_oracle",
    "member_lease",
    "member_identity",
    "member_counter",
];

/// What the worker found of the extension in its database.
enum ExtensionState {
    Missing,
    /// Installed at another version than this library's.
    Version(String),
    /// At our version, but the tables in schema tsoracle are not (all) the extension's.
    Foreign,
    /// Some of its tables are unlogged (made so while the library was not loaded: it refuses
    /// the change, `caller::logged`), so a crash would empty them.
    Unlogged(String),
    Ready,
}

fn extension_state() -> ExtensionState {
    // Read-only SPI: a transaction that got an xid (pgrx's Spi::get_one asks for one) and
    // pruned a catalog page would wait for synchronous standbys at commit. Every name is
    // schema-qualified, and the search_path is pinned anyway.
    let found = transaction(|| {
        Spi::connect(|client| {
            let rows = client.select(
                "SELECT e.extversion::pg_catalog.text, \
                        (SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d \
                           JOIN pg_catalog.pg_class c ON c.oid = d.objid \
                           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                          WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                            AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass \
                            AND d.refobjid = e.oid AND d.deptype = 'e' \
                            AND n.nspname = 'tsoracle' AND c.relname = ANY ($1)), \
                        (SELECT pg_catalog.string_agg(c.relname::pg_catalog.text, ', ' \
                                                      ORDER BY c.relname) \
                           FROM pg_catalog.pg_depend d \
                           JOIN pg_catalog.pg_class c ON c.oid = d.objid \
                          WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                            AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass \
                            AND d.refobjid = e.oid AND d.deptype = 'e' \
                            AND c.relkind = 'r' AND c.relpersistence <> 'p') \
                   FROM pg_catalog.pg_extension e WHERE e.extname = 'tsoracle'",
                None,
                &[TABLES.map(String::from).to_vec().into()],
            )?;
            if rows.is_empty() {
                return Ok(None);
            }
            let (version, members, unlogged) = rows.first().get_three::<String, i64, String>()?;
            Ok::<_, pgrx::spi::Error>(Some((
                version.unwrap_or_default(),
                members.unwrap_or(0),
                unlogged,
            )))
        })
    });
    // A catalog read that failed (a lock held on a catalog past the worker's lock_timeout) is
    // read again a second later, as if the extension were not there yet.
    let found = match found {
        Ok(found) => found,
        Err(e) => {
            pgrx::warning!("tsoracle worker could not read pg_extension: {e}");
            return ExtensionState::Missing;
        }
    };
    match found {
        Ok(None) => ExtensionState::Missing,
        Ok(Some((version, ..))) if version != EXTENSION_VERSION => ExtensionState::Version(version),
        Ok(Some((_, members, _))) if members != TABLES.len() as i64 => ExtensionState::Foreign,
        Ok(Some((.., Some(unlogged)))) => ExtensionState::Unlogged(unlogged),
        Ok(Some(_)) => ExtensionState::Ready,
        Err(e) => {
            pgrx::warning!("tsoracle worker could not read pg_extension: {e}");
            ExtensionState::Missing
        }
    }
}

/// Sleep until `CREATE EXTENSION tsoracle` (or `ALTER EXTENSION tsoracle UPDATE`) has made
/// the extension in our database the version this library serves, with every table of it
/// logged. False on shutdown.
pub(super) fn wait_for_extension(signals: &Signals, database: &str) -> bool {
    let mut announced = None;
    loop {
        let (phase, message) = match extension_state() {
            ExtensionState::Ready => return true,
            ExtensionState::Missing => (
                Phase::WaitingForExtension,
                format!("tsoracle worker waiting for CREATE EXTENSION tsoracle in database \"{database}\""),
            ),
            ExtensionState::Version(v) => (
                Phase::OutdatedSchema,
                format!(
                    "tsoracle: the extension in database \"{database}\" is at version {v}, this library serves {EXTENSION_VERSION}; run ALTER EXTENSION tsoracle UPDATE"
                ),
            ),
            ExtensionState::Unlogged(tables) => (
                Phase::Refused,
                format!(
                    "the extension's tables {tables} in database \"{database}\" are unlogged, so a crash would empty them; the worker does not serve from them: run ALTER TABLE tsoracle.<table> SET LOGGED for each"
                ),
            ),
            ExtensionState::Foreign => (
                Phase::Refused,
                format!(
                    "the tables in schema tsoracle of database \"{database}\" are not the extension's own; the worker does not touch them"
                ),
            ),
        };
        if phase == Phase::Refused {
            ORACLE.exclusive().set_refusal(&message);
        }
        if crate::pg::guc::is_member() {
            // What the member waits for is its own schema, not the oracle: said where
            // tso_member_status().last_error (and its alert) look. Its hello clears it.
            let mut member = MEMBER.exclusive();
            if member.last_error.get().as_deref() != Some(message.as_str()) {
                member.note_error(&message, crate::pg::clock::now_ms());
            }
        }
        set_phase(signals, phase);
        if announced.as_deref() != Some(message.as_str()) {
            if phase == Phase::WaitingForExtension {
                pgrx::log!("{message}");
            } else {
                pgrx::warning!("{message}");
            }
            announced = Some(message);
        }
        // Callers poke the latch, so a fresh CREATE EXTENSION is noticed at once.
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return false;
        }
        pg_sys::check_for_interrupts!();
    }
}
