//! A cluster that has been a member of a fleet, started without `tsoracle.oracle` (docs/fleet.md,
//! "A cluster that has been a member"): a member's standby promoted where only the primary was
//! configured, or a member whose setting was cleared without the runbook. Its own tables
//! (`tsoracle.high_water`, `tsoracle.seq`) lack what the fleet handed out through it, so it
//! serves nothing on its own — no timestamp, block or lease, in place neither — while
//! `tsoracle.member_oracle` holds a row: the durable mark of a member, which its standbys
//! inherit by replay, and which the runbook to leave a fleet deletes once the oracle's
//! high-water and counters are copied in (docs/operations/fleet/leave.md).

use crate::pg::xact::sql_transaction;
use crate::shmem::oracle::FORMER_MEMBER;
use crate::shmem::{Phase, Signals, ORACLE};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::time::Duration;

/// Whether `tsoracle.member_oracle` holds a row: this cluster has been served by an oracle.
pub(crate) fn marked() -> Result<bool, String> {
    sql_transaction("cannot read tsoracle.member_oracle", || {
        Spi::get_one::<bool>("SELECT EXISTS (SELECT FROM ONLY tsoracle.member_oracle)")
            .map(|v| v.unwrap_or(true))
    })
}

/// Before a standalone worker's fence: wait, refusing (`Phase::Refused`, `FORMER_MEMBER`), while
/// this cluster is marked as a member; looked at again every second, so that it serves as soon
/// as the runbook's last step deletes the mark. A table it cannot read refuses too. `false`:
/// the server shuts down meanwhile; `true` also after `tso_handover()`, which the caller
/// handles.
pub(crate) fn wait_until_alone(signals: &'static Signals) -> bool {
    let mut refused = false;
    loop {
        if signals.handover_requested() {
            return true;
        }
        let why = match marked() {
            Ok(false) => {
                signals.set_may_serve_alone(true);
                if refused {
                    {
                        let mut st = ORACLE.exclusive();
                        st.set_refusal("");
                        st.phase = Phase::Starting;
                    }
                    signals.broadcast();
                    pgrx::log!(
                        "tsoracle: tsoracle.member_oracle is empty: this cluster has left its fleet, and serves on its own"
                    );
                }
                return true;
            }
            Ok(true) => FORMER_MEMBER.to_string(),
            Err(e) => format!("{FORMER_MEMBER} ({e})"),
        };
        signals.set_may_serve_alone(false);
        if !refused {
            refused = true;
            {
                let mut st = ORACLE.exclusive();
                st.allocator.step_down();
                st.set_refusal(&why);
                st.phase = Phase::Refused;
            }
            signals.window.close();
            signals.broadcast();
            pgrx::warning!(
                "tsoracle: {why}; set tsoracle.oracle to its oracle, or leave the fleet by the runbook (docs/operations/fleet/leave.md, \"Leaving a fleet\")"
            );
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return false;
        }
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file from the worker's main loop, outside
            // any transaction, with no LWLock held.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
}
