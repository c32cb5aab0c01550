//! A member's durable memory of its oracle (`tsoracle.member_oracle`, docs/fleet.md): the
//! oracle's system identifier and the highest epoch it answered with, read at every hello and
//! written before anything of a new epoch is handed out, so that no restart of the member (or
//! promotion of its standby) lets a deposed primary, or another cluster, serve it.

use crate::pg::xact::sql_transaction;
use pgrx::prelude::*;
use tsoracle_core::member::OracleSeen;

/// What the member's table holds (no row: never served).
pub(super) fn read() -> Result<OracleSeen, String> {
    sql_transaction("cannot read tsoracle.member_oracle", || {
        Spi::connect(|client| {
            let mut seen = OracleSeen::default();
            for row in client.select(
                "SELECT system_id, epoch FROM ONLY tsoracle.member_oracle",
                None,
                &[],
            )? {
                seen = OracleSeen {
                    system_id: row.get::<i64>(1)?.unwrap_or(0) as u64,
                    epoch: u64::try_from(row.get::<i64>(2)?.unwrap_or(0)).unwrap_or(0),
                };
            }
            Ok(seen)
        })
    })
}

/// [`sql_transaction`] of a write that something is handed out on: `Err` also when its commit
/// is not known to be on the synchronous standbys (`pg::replica::commit_acknowledged`).
pub(super) fn durable_transaction<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, pgrx::spi::Error>,
) -> Result<T, String> {
    let value = sql_transaction(what, f)?;
    if !crate::pg::replica::commit_acknowledged() {
        return Err(format!("{what}: {}", crate::pg::replica::NOT_ACKNOWLEDGED));
    }
    Ok(value)
}

/// Keep `seen` durably (the epoch never lowered), committed, and on the synchronous standbys,
/// before this returns.
pub(super) fn write(seen: OracleSeen) -> Result<(), String> {
    durable_transaction("cannot keep the oracle's epoch in tsoracle.member_oracle", || {
        Spi::run_with_args(
            "INSERT INTO tsoracle.member_oracle AS m (id, system_id, epoch) VALUES (true, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET system_id = EXCLUDED.system_id, \
             epoch = GREATEST(m.epoch, EXCLUDED.epoch), updated_at = pg_catalog.now()",
            &[(seen.system_id as i64).into(), (seen.epoch.min(i64::MAX as u64) as i64).into()],
        )
    })
}
