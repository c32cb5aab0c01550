//! The runbooks as their pages write them (docs/operations/*.md, the fleet's under
//! docs/operations/fleet/), for tests/tests/fleet_runbooks.rs (and bluegreen.rs, drops.rs,
//! replication.rs, relay.rs) to run instead of copies of their own: a page and its test cannot
//! drift.
//!
//! A runbook's code block is marked by the HTML comment on the line before its fence
//! (invisible on the rendered page):
//!
//! ```text
//! <!-- runbook: leave step=2 -->
//! ```sh
//! psql "$ORACLE" -Xc "COPY (...) TO STDOUT" | psql "$CLUSTER" -Xc "COPY ... FROM STDIN"
//! ```
//! ```
//!
//! [`parse`] returns every marked block of a page, with its runbook, step, language and text
//! (the fence's indentation removed); [`Runbook::expect_steps`] checks that a runbook has
//! exactly the blocks a test drives, in order, so a block added, dropped, moved to another
//! step or changed to another language on the page fails the test. `sh` blocks run with
//! `bash -euo pipefail` ([`run_sh`]), as root (or, where a page says so, as the servers' OS
//! user), with Debian's `PATH` ([`crate::debian`]: `psql` is postgresql-common's `pg_wrapper`,
//! `pg_ctl` is not on it) and the variables `$CLUSTER`, `$ORACLE`, `$OLD`, `$MEMBER` (and a page's own,
//! such as `$MEMBER_ID`) in their environment, set by the test; `sql` blocks run with `psql -f`
//! ([`run_sql`]); `ini` blocks are `name = 'value'`
//! settings for a cluster's configuration file ([`settings`]); an `sh` block of `NAME="value"`
//! lines may be an environment file instead ([`environment`]).
//!
//! A test shows that a runbook's own checks catch a mistake by running a mutant of a dangerous
//! step ([`Block::mutated`], [`Block::without_lines`]: they panic when the page no longer has
//! what they change, so a rewritten page cannot turn the check into a no-op).

use crate::load::{SeqLoad, SeqLoadOptions};
use crate::node::{run_cmd, scrub_env};
use crate::{DenseHistory, Endpoint, History, Load, LoadOptions, Node};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One marked code block of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub runbook: String,
    pub step: u32,
    /// The fence's info string: `sh`, `sql`, `ini`.
    pub lang: String,
    /// The block's lines, without the fence's indentation, each ending in a newline.
    pub text: String,
    /// 1-based line of the marker on the page.
    pub line: usize,
}

/// A marker's `NAME step=N`, or why the line is not one. `None`: not a marker at all.
fn marker(line: &str) -> Option<Result<(String, u32), String>> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let rest = inner.strip_prefix("runbook:")?.trim();
    let mut words = rest.split_whitespace();
    let Some(name) = words.next().filter(|w| !w.contains('=')) else {
        return Some(Err(format!("no runbook name in {line:?}")));
    };
    let mut step = None;
    for w in words {
        match w.split_once('=') {
            Some(("step", n)) => match n.parse::<u32>() {
                Ok(n) if n > 0 => step = Some(n),
                _ => return Some(Err(format!("bad step {n:?} in {line:?}"))),
            },
            _ => return Some(Err(format!("unknown attribute {w:?} in {line:?}"))),
        }
    }
    Some(step.map(|s| (name.to_string(), s)).ok_or_else(|| format!("no step= in {line:?}")))
}

/// Every marked block of `page`, in page order. A marker must be followed (after blank lines
/// only) by a fence, the fence must close, and a runbook's step appears once.
pub fn parse(page: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = page.lines().collect();
    let mut blocks: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(m) = marker(lines[i]) else {
            i += 1;
            continue;
        };
        let (runbook, step) = m.map_err(|e| format!("line {}: {e}", i + 1))?;
        let at = i + 1;
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim().is_empty() {
            j += 1;
        }
        let open = lines.get(j).copied().unwrap_or("");
        let indent = open.len() - open.trim_start().len();
        let Some(lang) = open.trim_start().strip_prefix("```") else {
            return Err(format!("line {at}: the runbook marker is not followed by a code block"));
        };
        let lang = lang.trim().to_string();
        if lang.is_empty() {
            return Err(format!("line {}: a runbook block names no language", j + 1));
        }
        let mut text = String::new();
        let mut k = j + 1;
        loop {
            let Some(l) = lines.get(k) else {
                return Err(format!("line {}: the code block never closes", j + 1));
            };
            if l.trim_start() == "```" {
                break;
            }
            let strip = l.len() - l.trim_start().len();
            text.push_str(&l[strip.min(indent)..]);
            text.push('\n');
            k += 1;
        }
        if blocks.iter().any(|b| b.runbook == runbook && b.step == step) {
            return Err(format!("line {at}: {runbook} step {step} is marked twice"));
        }
        blocks.push(Block { runbook, step, lang, text, line: at });
        i = k + 1;
    }
    Ok(blocks)
}

/// The directory of the runbook pages: docs/operations (the fleet's are under `fleet/`).
pub fn pages_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations")
}

/// Every page under [`pages_dir`] and its `fleet/` directory.
pub fn pages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [pages_dir(), pages_dir().join("fleet")] {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// One runbook's blocks, read from its page.
#[derive(Clone, Debug)]
pub struct Runbook {
    pub name: String,
    pub page: PathBuf,
    pub blocks: Vec<Block>,
}

impl Runbook {
    /// The runbook `name` of `page` (a path under [`pages_dir`]: `fleet/join.md`).
    #[track_caller]
    pub fn load(page: &str, name: &str) -> Runbook {
        let path = pages_dir().join(page);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        Runbook::from_text(&text, name, path)
    }

    /// The runbook `name` of a page's text.
    #[track_caller]
    pub fn from_text(text: &str, name: &str, page: PathBuf) -> Runbook {
        let blocks = parse(text).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let blocks: Vec<Block> = blocks.into_iter().filter(|b| b.runbook == name).collect();
        Runbook { name: name.to_string(), page, blocks }
    }

    /// The page's blocks are exactly `(step, language)`, in this order.
    pub fn check_steps(&self, want: &[(u32, &str)]) -> Result<(), String> {
        let got: Vec<(u32, &str)> = self.blocks.iter().map(|b| (b.step, b.lang.as_str())).collect();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{}: runbook {} has the blocks {got:?} (step, language); its test drives {want:?}",
                self.page.display(),
                self.name
            ))
        }
    }

    #[track_caller]
    pub fn expect_steps(&self, want: &[(u32, &str)]) {
        self.check_steps(want).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The block of `step`.
    #[track_caller]
    pub fn step(&self, step: u32) -> &Block {
        self.blocks.iter().find(|b| b.step == step).unwrap_or_else(|| {
            panic!("{}: runbook {} has no step {step}", self.page.display(), self.name)
        })
    }
}

/// Run an `sh` block as written, with `bash -euo pipefail`, Debian's PATH for a cluster whose
/// binaries are `bin` ([`crate::debian::client_path`]) and `vars` (`CLUSTER`, `ORACLE`, `OLD`)
/// in its environment; its standard output, or an error with its standard error.
pub fn run_sh(block: &Block, bin: &Path, vars: &[(&str, String)]) -> crate::Result<String> {
    run_sh_in(block, bin, vars, None)
}

/// [`run_sh`] in the working directory `dir` (for a block that writes a file, such as a dump).
pub fn run_sh_in(
    block: &Block,
    bin: &Path,
    vars: &[(&str, String)],
    dir: Option<&Path>,
) -> crate::Result<String> {
    let mut cmd = sh_command(block, bin, vars)?;
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    run_cmd(cmd, Duration::from_secs(120))
}

/// [`run_sh`] as the operating-system user the servers run as (`postgres`), in `node`'s
/// directory (its `HOME` too), as a page says to run a command that writes a data directory
/// (`pg_basebackup`).
pub fn run_sh_as_server(
    block: &Block,
    node: &Node,
    vars: &[(&str, String)],
) -> crate::Result<String> {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = crate::node::pg_user()?;
    let mut cmd = sh_command(block, node.bin_dir(), vars)?;
    cmd.uid(uid).gid(gid).current_dir(node.basedir()).env("HOME", node.basedir());
    run_cmd(cmd, Duration::from_secs(120))
}

fn sh_command(block: &Block, bin: &Path, vars: &[(&str, String)]) -> crate::Result<Command> {
    assert_eq!(block.lang, "sh", "runbook {} step {}: not an sh block", block.runbook, block.step);
    let mut cmd = Command::new("/bin/bash");
    cmd.arg("-euo").arg("pipefail").arg("-c").arg(&block.text);
    scrub_env(&mut cmd);
    cmd.env("PATH", crate::debian::client_path(bin)?);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Ok(cmd)
}

impl Block {
    /// The block with `from` replaced by `to`: a mutation of the page's step, for a test that
    /// shows the runbook's own checks catch it. Panics unless `from` is in the block (a page
    /// rewritten so that the mutation no longer applies fails the test, not silently passes).
    #[track_caller]
    pub fn mutated(&self, from: &str, to: &str) -> Block {
        assert!(
            self.text.contains(from),
            "runbook {} step {}: {from:?} is not in the block:\n{}",
            self.runbook,
            self.step,
            self.text
        );
        Block { text: self.text.replace(from, to), ..self.clone() }
    }

    /// The block without its lines that contain `needle` (at least one, and not all of them).
    #[track_caller]
    pub fn without_lines(&self, needle: &str) -> Block {
        let lines: Vec<&str> = self.text.lines().collect();
        let kept: Vec<&str> = lines.iter().copied().filter(|l| !l.contains(needle)).collect();
        assert!(
            kept.len() < lines.len() && !kept.is_empty(),
            "runbook {} step {}: no line (or every line) has {needle:?}:\n{}",
            self.runbook,
            self.step,
            self.text
        );
        let text = kept.iter().map(|l| format!("{l}\n")).collect();
        Block { text, ..self.clone() }
    }
}

/// The variables of an environment file (systemd's `EnvironmentFile=`): `NAME=value` lines,
/// a value in double quotes unquoted; comments and blank lines skipped.
pub fn environment(block: &Block) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for line in block.text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "runbook {} step {}: not a variable: {line:?}",
                block.runbook, block.step
            ));
        };
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// The settings of an `ini` block: `name = value` lines (a quoted value unquoted), comments
/// and blank lines skipped.
pub fn settings(block: &Block) -> Result<Vec<(String, String)>, String> {
    if block.lang != "ini" {
        return Err(format!("runbook {} step {}: not an ini block", block.runbook, block.step));
    }
    let mut out = Vec::new();
    for line in block.text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "runbook {} step {}: not a setting: {line:?}",
                block.runbook, block.step
            ));
        };
        let v = v.trim();
        let v = v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(v);
        out.push((k.trim().to_string(), v.to_string()));
    }
    Ok(out)
}

/// The blocks (step, language) each runbook page holds, which its test runs
/// (tests/tests/fleet_runbooks.rs, fleet_runbooks_more.rs).
pub const JOIN_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh")];
pub const LEAVE_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh")];
pub const PITR_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "ini"), (3, "sh")];
pub const SETUP_STEPS: &[(u32, &str)] = &[(1, "sql"), (2, "sh"), (3, "ini")];
pub const REMOVE_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh"), (4, "sh"), (5, "sh")];
/// A member's entry taken back from a copy (take-back.md): driven by
/// `tests/tests/fleet_members.rs`.
pub const TAKE_BACK_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh"), (4, "sh")];
/// The blue/green switchover (logical-replication.md): `tso_handover()` on blue, way (a)'s
/// `tso_seed()` on green, way (b)'s dump and restore; driven by `tests/tests/bluegreen.rs`.
pub const SWITCHOVER_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh")];
/// Uninstalling a standalone cluster (uninstalling.md): driven by `tests/tests/drops.rs`.
pub const UNINSTALL_STEPS: &[(u32, &str)] = &[(1, "sql")];
/// `pg_upgrade` of the oracle (pg-upgrade.md): its synchronous standby rebuilt, the wait until
/// it serves, the successor named on each member; driven by `tests/tests/upgrade_fleet.rs`
/// (`make test-upgrade`, which has both majors), checked against drift with the others.
pub const PG_UPGRADE_ORACLE_STEPS: &[(u32, &str)] = &[(2, "sh"), (3, "sh"), (4, "sh")];
/// A minor upgrade of a fleet, one cluster at a time (member-upgrade.md): driven by
/// `tests/tests/upgrade_rolling.rs` (`make test-upgrade`, which builds the previous release).
pub const MINOR_UPGRADE_STEPS: &[(u32, &str)] = &[(3, "sh")];
/// A standby made, made synchronous and promoted (replication.md's worked example): driven by
/// `tests/tests/replication.rs`.
pub const FAILOVER_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh"), (4, "sh")];
/// The relay's configuration file (relay.md, "The service"): its variables run the relay in
/// `tests/tests/relay.rs`.
pub const RELAY_STEPS: &[(u32, &str)] = &[(1, "sh")];
/// monitoring.md's exporter set-up: its role, its environment file, the check
/// (tests/tests/monitoring.rs).
pub const MONITORING_STEPS: &[(u32, &str)] = &[(1, "sql"), (2, "sh"), (3, "sh")];
/// The fleet moved to a new oracle (oracle-failover.md, "Moving the fleet to a new oracle"):
/// the handover and the seed, the counters carried, the member's memory of its oracle
/// deleted, the check; driven by `tests/tests/fleet_runbooks_more.rs`.
pub const MOVE_ORACLE_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh"), (3, "sh"), (4, "sh")];
/// A member's dump and its restore (backups.md, "A member of a fleet"): driven by
/// `tests/tests/backup.rs`, into a member of the same oracle and into a cluster on its own.
pub const MEMBER_BACKUP_STEPS: &[(u32, &str)] = &[(1, "sh"), (2, "sh")];

/// A runbook's blocks: (step, language), in page order.
pub type Steps = &'static [(u32, &'static str)];

/// Every runbook a test runs: (page, runbook, its blocks).
pub const BOOKS: &[(&str, &str, Steps)] = &[
    ("fleet/join.md", "join", JOIN_STEPS),
    ("fleet/leave.md", "leave", LEAVE_STEPS),
    ("fleet/oracle-pitr.md", "oracle-pitr", PITR_STEPS),
    ("fleet/set-up.md", "set-up", SETUP_STEPS),
    ("fleet/remove-a-member.md", "remove-a-member", REMOVE_STEPS),
    ("fleet/take-back.md", "take-back", TAKE_BACK_STEPS),
    ("fleet/pg-upgrade.md", "pg-upgrade-oracle", PG_UPGRADE_ORACLE_STEPS),
    ("fleet/member-upgrade.md", "minor-upgrade", MINOR_UPGRADE_STEPS),
    ("fleet/oracle-failover.md", "move-oracle", MOVE_ORACLE_STEPS),
    ("logical-replication.md", "switchover", SWITCHOVER_STEPS),
    ("uninstalling.md", "uninstall", UNINSTALL_STEPS),
    ("replication.md", "failover", FAILOVER_STEPS),
    ("relay.md", "relay", RELAY_STEPS),
    ("monitoring.md", "monitoring", MONITORING_STEPS),
    ("backups.md", "member-backup", MEMBER_BACKUP_STEPS),
];

/// Run a `sql` block as written with `psql -X -v ON_ERROR_STOP=1 -f` on `conninfo`, from the
/// binaries of `bin`, in a session of its own (no controlling terminal: a prompt such as
/// `\password`'s reads `stdin`); its standard output, or an error with its standard error.
pub fn run_sql(block: &Block, bin: &Path, conninfo: &str, stdin: &str) -> crate::Result<String> {
    run_sql_vars(block, bin, conninfo, stdin, &[])
}

/// [`run_sql`] with `psql -v NAME=VALUE` for each of `psql_vars` (a page's `:name`).
pub fn run_sql_vars(
    block: &Block,
    bin: &Path,
    conninfo: &str,
    stdin: &str,
    psql_vars: &[(&str, String)],
) -> crate::Result<String> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    assert_eq!(block.lang, "sql", "runbook {} step {}: not a sql block", block.runbook, block.step);
    let err = |what: &str, e: std::io::Error| crate::HarnessError::io(what.to_string(), e);
    let file = std::env::temp_dir().join(format!(
        "tsoracle-runbook-{}-{}-{}.sql",
        block.runbook,
        block.step,
        std::process::id()
    ));
    std::fs::write(&file, &block.text).map_err(|e| err("write the block", e))?;
    let mut cmd = Command::new(bin.join("psql"));
    cmd.args(["-X", "-v", "ON_ERROR_STOP=1", "-d", conninfo]);
    for (k, v) in psql_vars {
        cmd.arg("-v").arg(format!("{k}={v}"));
    }
    cmd.arg("-f").arg(&file);
    scrub_env(&mut cmd);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setsid(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| err("run psql", e))?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .map_err(|e| err("write psql's stdin", e))?;
    let out = child.wait_with_output().map_err(|e| err("wait for psql", e))?;
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(crate::HarnessError::Other(format!(
            "psql -f of runbook {} step {}: {}: {}",
            block.runbook,
            block.step,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// `$CLUSTER`, `$ORACLE`, `$OLD`, `$MEMBER` of the runbooks: connection strings, as a
/// superuser.
pub fn vars(pairs: &[(&'static str, &Node)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, n)| (*k, n.conninfo())).collect()
}

/// Run a runbook's `sh` block as the page writes it; panics with its error.
#[track_caller]
pub fn run_step(block: &Block, node: &Node, vars: &[(&str, String)]) -> String {
    run_sh(block, node.bin_dir(), vars).unwrap_or_else(|e| {
        panic!(
            "runbook {} step {} (line {}): {e}\n{}",
            block.runbook, block.step, block.line, block.text
        )
    })
}

/// The one integer psql printed (the value of a one-row, one-column result).
#[track_caller]
pub fn printed_number(out: &str) -> i64 {
    let numbers: Vec<i64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(numbers.len(), 1, "one number in psql's output: {out}");
    numbers[0]
}

/// A high-water a minute ahead of the clock.
pub const AHEAD: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000";

#[track_caller]
pub fn one_i64(c: &mut postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {}", crate::pg_error_string(&e))).get(0)
}

/// Timestamps on `node`'s endpoint, recorded in `history`, until stopped.
pub fn timestamps_on(node: &Node, history: &History) -> Load {
    Load::start(
        vec![node.endpoint()],
        LoadOptions::new(4, Duration::from_secs(300)),
        crate::ops::mixed(20),
        history.clone(),
    )
}

/// Blocks of `keys` on `node`, recorded in `dense`, until stopped.
pub fn blocks_on(node: &Node, keys: &[&str], dense: &DenseHistory) -> SeqLoad {
    SeqLoad::start(
        Endpoint::fixed(node.name(), &node.conninfo()),
        SeqLoadOptions::new(2, Duration::from_secs(300), keys),
        dense.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# A page\n\n1. First:\n\n   <!-- runbook: demo step=1 -->\n   ```sh\n   psql \"$CLUSTER\" -c 'SELECT 1'\n     | cat\n   ```\n\n<!-- runbook: demo step=2 -->\n\n```ini\ntsoracle.database = 'template1'   # a comment\n```\n\n<!-- runbook: other step=1 -->\n```sql\nSELECT 2;\n```\n";

    #[test]
    fn blocks_are_read_with_their_step_language_and_text() {
        let blocks = parse(PAGE).unwrap();
        assert_eq!(blocks.len(), 3);
        assert_eq!(
            (blocks[0].runbook.as_str(), blocks[0].step, blocks[0].lang.as_str()),
            ("demo", 1, "sh")
        );
        assert_eq!(blocks[0].text, "psql \"$CLUSTER\" -c 'SELECT 1'\n  | cat\n");
        assert_eq!(blocks[0].line, 5);
        assert_eq!(
            settings(&blocks[1]).unwrap(),
            vec![("tsoracle.database".into(), "template1".into())]
        );
        let r = Runbook::from_text(PAGE, "demo", "page.md".into());
        r.check_steps(&[(1, "sh"), (2, "ini")]).unwrap();
        assert_eq!(r.step(2).lang, "ini");
    }

    #[test]
    fn a_page_that_drifts_from_its_test_is_refused() {
        let r = |page: &str| Runbook::from_text(page, "demo", "page.md".into());
        let want = [(1, "sh"), (2, "ini")];
        // A step dropped, a step renumbered, the steps swapped, a language changed.
        let dropped = PAGE.replace("<!-- runbook: demo step=2 -->", "");
        assert!(r(&dropped).check_steps(&want).is_err());
        let renumbered = PAGE.replace("demo step=2", "demo step=3");
        assert!(r(&renumbered).check_steps(&want).is_err());
        let swapped = PAGE
            .replace("demo step=1", "demo step=9")
            .replace("demo step=2", "demo step=1")
            .replace("demo step=9", "demo step=2");
        assert!(r(&swapped).check_steps(&want).is_err());
        let relanguaged = PAGE.replace("```ini", "```conf");
        assert!(r(&relanguaged).check_steps(&want).is_err());
    }

    #[test]
    fn every_book_has_on_its_page_the_blocks_its_test_drives() {
        for &(page, name, want) in BOOKS {
            Runbook::load(page, name).check_steps(want).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn mutants_change_what_they_name_or_panic() {
        let blocks = parse(PAGE).unwrap();
        let m = blocks[0].mutated("SELECT 1", "SELECT 0");
        assert_eq!(m.text, "psql \"$CLUSTER\" -c 'SELECT 0'\n  | cat\n");
        assert_eq!((m.runbook.as_str(), m.step, m.line), ("demo", 1, 5));
        assert_eq!(blocks[0].without_lines("| cat").text, "psql \"$CLUSTER\" -c 'SELECT 1'\n");
        let b = blocks[0].clone();
        assert!(std::panic::catch_unwind(|| b.mutated("SELECT 2", "x")).is_err(), "absent");
        let b = blocks[0].clone();
        assert!(std::panic::catch_unwind(|| b.without_lines("nowhere")).is_err(), "no line");
        let b = blocks[0].clone();
        assert!(std::panic::catch_unwind(|| b.without_lines("")).is_err(), "every line");
    }

    #[test]
    fn an_environment_file_is_read_as_systemd_reads_it() {
        let page = "<!-- runbook: env step=1 -->\n```sh\n# a comment\nA=\"x=1 y=2;b=z\"\n\nB=127.0.0.1:9\n```\n";
        let r = Runbook::from_text(page, "env", "page.md".into());
        assert_eq!(
            environment(r.step(1)).unwrap(),
            vec![("A".into(), "x=1 y=2;b=z".into()), ("B".into(), "127.0.0.1:9".into())]
        );
        let bad = r.step(1).mutated("B=127.0.0.1:9", "psql -c x");
        assert!(environment(&bad).is_err());
    }

    #[test]
    fn malformed_markers_are_errors() {
        assert!(parse("<!-- runbook: demo -->\n```sh\nx\n```\n").is_err(), "no step");
        assert!(parse("<!-- runbook: demo step=0 -->\n```sh\nx\n```\n").is_err(), "step 0");
        assert!(
            parse("<!-- runbook: demo step=1 on=x -->\n```sh\nx\n```\n").is_err(),
            "unknown attribute"
        );
        assert!(parse("<!-- runbook: demo step=1 -->\ntext\n```sh\nx\n```\n").is_err(), "no fence");
        assert!(parse("<!-- runbook: demo step=1 -->\n```sh\nx\n").is_err(), "unclosed");
        assert!(parse("<!-- runbook: demo step=1 -->\n```\nx\n```\n").is_err(), "no language");
        let twice = "<!-- runbook: d step=1 -->\n```sh\nx\n```\n<!-- runbook: d step=1 -->\n```sh\ny\n```\n";
        assert!(parse(twice).is_err(), "a step twice");
        assert_eq!(parse("<!-- a comment -->\n```sh\nx\n```\n").unwrap(), vec![]);
    }
}
