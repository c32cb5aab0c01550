//! The hello on every connection (docs/fleet.md, "What is checked, and refused"): the oracle's
//! answer checked against what this member saw before (`tsoracle.member_oracle`) and kept
//! durably before anything of a new epoch is handed out; the member's identity registered
//! (`tsoracle.member_identity`); later answers' epochs checked the same way.

use super::{set_phase, Link, Proxy, Text, MEMBER};
use crate::shmem::Phase;
use tsoracle_core::member::{EpochGate, OracleRefused, OracleSeen};
use tsoracle_core::version::{member_accepts, Version};

impl Proxy {
    pub(super) fn hello(
        &mut self,
        rows: Result<Vec<Vec<Option<String>>>, crate::pg::libpq::RemoteError>,
    ) -> Result<(), String> {
        let rows = rows.map_err(|e| {
            self.hello_refused(&e);
            self.identity.refused(&e)
        })?;
        let row = rows.first().ok_or("the oracle's hello returned no row")?;
        let field = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let version = field(1);
        // The version the oracle speaks to this member: its own minor version, or refused.
        let own = Version::parse(crate::pg::EXTENSION_VERSION).map_err(|e| e.to_string())?;
        member_accepts(own, &version).map_err(|e| {
            format!("{e}: install the same minor version on both, or upgrade the oracle first")
        })?;
        let epoch = field(2).parse::<u64>().map_err(|_| "the oracle's hello has no epoch")?;
        let system_id =
            field(0).parse::<i64>().map_err(|_| "the oracle's hello has no system identifier")?
                as u64;
        // What this member was served by, in memory and durably (after a restart, or on its
        // promoted standby, the table alone): another cluster, or an older epoch, is refused.
        let memory = {
            let st = MEMBER.share();
            OracleSeen { system_id: st.oracle_system_id, epoch: st.oracle_epoch }
        };
        let durable = super::oracle::read()?;
        // After the oracle's pg_upgrade (a new system identifier): the one a superuser named.
        let successor = crate::pg::guc::oracle_successor()?;
        let seen = memory.merge(durable).succeeded_by(successor).admit(system_id, epoch);
        let seen = seen.map_err(|e| match e {
            OracleRefused::Other { .. } => format!(
                "{e}; replaced on purpose: DELETE FROM tsoracle.member_oracle here, restart; after its pg_upgrade: tsoracle.oracle_successor = '{}'",
                system_id as i64
            ),
            OracleRefused::Stale(_) => format!("{e}; looking for the new one"),
            OracleRefused::NotServing => e.to_string(),
        })?;
        self.identity.registered()?;
        if seen != durable {
            // Kept before anything of this epoch is handed out.
            super::oracle::write(seen)?;
        }
        self.durable_epoch = seen.epoch;
        {
            let mut st = MEMBER.exclusive();
            st.oracle_system_id = system_id;
            st.oracle_epoch = seen.epoch;
            st.connected = true;
            st.connects += 1;
            st.last_error = Text::default();
        }
        if let Link::Up { ready, .. } = &mut self.link {
            *ready = true;
        }
        self.backoff_ms = 100;
        set_phase(self.signals, Phase::Serving);
        pgrx::log!("tsoracle member connected to its oracle (epoch {epoch})");
        Ok(())
    }

    /// Refuse an answer from an epoch older than one seen (a deposed primary); raise the one
    /// seen otherwise, durably before the answer is handed out.
    pub(super) fn check_epoch(&mut self, epoch: u64) -> Result<(), String> {
        if epoch == 0 {
            // Not serving since it answered (handed over, fencing again): what it granted on
            // this connection, whose hello it answered at an admitted epoch, came before.
            return Ok(());
        }
        let (seen, system_id) = {
            let mut st = MEMBER.exclusive();
            let mut gate = EpochGate::new(st.oracle_epoch);
            gate.accept(epoch).map_err(|e| format!("{e}; looking for the new one"))?;
            st.oracle_epoch = gate.seen();
            (gate.seen(), st.oracle_system_id)
        };
        if seen > self.durable_epoch {
            // The oracle fenced again at a higher epoch (a restore): kept before its answer
            // is handed out.
            super::oracle::write(OracleSeen { system_id, epoch: seen })?;
            self.durable_epoch = seen;
        }
        Ok(())
    }
}
