//! Reading the resolved timestamp `R` inside a call: on a primary from shared memory
//! (`shmem::holders::primary_resolved`), on a hot standby from the table the primary's
//! worker publishes to, as far as this standby has replayed it.

use crate::pg::error::TsoError;
use crate::shmem::{self, holders::primary_resolved};
use pgrx::prelude::*;
use std::ffi::CStr;

/// `R` on a hot standby: what the primary published, as far as this standby has replayed it,
/// in `tsoracle.database` (the database whose table the worker writes).
fn standby_resolved() -> Result<u64, TsoError> {
    standby_published("resolved", "0.3.0")
}

/// What the primary's worker last published in table `tsoracle.<table>` (added in `version`),
/// as far as this standby has replayed it.
fn standby_published(table: &str, version: &str) -> Result<u64, TsoError> {
    let database = crate::pg::guc::database();
    // SAFETY: MyDatabaseId is set for every backend that runs SQL; the name is a syscache
    // lookup (NULL if the database is gone), copied at once.
    let here = unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    };
    if here.as_deref() != Some(database.as_str()) {
        return Err(TsoError::NotServing(format!(
            "on a standby the resolved timestamp is read from table tsoracle.{table} in database \"{database}\" (tsoracle.database); connect there"
        )));
    }
    let found = Spi::connect(|client| {
        let present = client
            .select(
                "SELECT pg_catalog.to_regclass('tsoracle.' OPERATOR(pg_catalog.||) $1) IS NOT NULL",
                None,
                &[table.into()],
            )?
            .first()
            .get_one::<bool>()?;
        if present != Some(true) {
            return Ok(None);
        }
        client
            .select(&format!("SELECT ts FROM ONLY tsoracle.{table} WHERE id"), None, &[])?
            .first()
            .get_one::<i64>()
    })
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.{table}: {e}")))?;
    match found {
        Some(r) if r > 0 => Ok(r as u64),
        Some(_) => Err(TsoError::NotServing(
            "this standby has not replayed a resolved timestamp from the primary yet".into(),
        )),
        None => Err(TsoError::NotServing(format!(
            "database \"{database}\" (tsoracle.database) has no table tsoracle.{table} on this standby: the extension is not at version {version} there yet"
        ))),
    }
}

/// `R` here: on a primary from shared memory, on a standby from the replayed table.
pub fn current() -> Result<u64, TsoError> {
    let signals = shmem::signals()?;
    // SAFETY: RecoveryInProgress may be called by any backend at any time.
    if unsafe { pg_sys::RecoveryInProgress() } {
        standby_resolved()
    } else {
        primary_resolved(signals)
    }
}

/// `R_f`, the fleet's resolved timestamp: on the oracle what its worker last made durable, on
/// its standbys the replayed table; not on a member (it is the oracle's).
pub fn fleet_current() -> Result<u64, TsoError> {
    if crate::pg::guc::is_member() {
        return Err(TsoError::NotOnAMember("tso_fleet_resolved()"));
    }
    shmem::signals()?;
    // SAFETY: as in `current`.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return standby_published("fleet_resolved", "0.4.0");
    }
    match crate::shmem::fleet::FLEET.share().published {
        0 => Err(TsoError::NotServing(
            "the oracle has not published a fleet-wide resolved timestamp yet".into(),
        )),
        r => Ok(r),
    }
}
