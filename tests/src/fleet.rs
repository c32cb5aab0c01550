//! A fleet on loopback (docs/fleet.md): an oracle's role for its members, the connection
//! string a member reaches it with, members started and serving, and the relay binary
//! (`tsoracle-relay`).

use crate::node::{run_cmd, scrub_env};
use crate::{serving_node, Node, NodeOpts};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The login role the members of the test fleets use on their oracle.
pub const MEMBER_ROLE: &str = "fleet_member";

/// The oracle's side: a login role for the members, with `tsoracle_member`.
pub fn admit_members(oracle: &Node) {
    let mut c = oracle.connect();
    c.batch_execute(&format!(
        "CREATE ROLE {MEMBER_ROLE} LOGIN; GRANT tsoracle_member TO {MEMBER_ROLE};"
    ))
    .expect("member role");
}

/// The system identifier of `node`'s cluster (`pg_controldata`): the identity it says hello
/// with as a new member.
pub fn system_identifier(node: &Node) -> crate::Result<i64> {
    let mut cmd = node.pg_command("pg_controldata");
    cmd.arg("-D").arg(node.datadir());
    let out = run_cmd(cmd, Duration::from_secs(30))?;
    out.lines()
        .find_map(|l| l.strip_prefix("Database system identifier:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|v| v as i64)
        .ok_or_else(|| crate::error::HarnessError::Other(format!("no system identifier in {out}")))
}

/// Admit `node`'s cluster on the oracle that `conninfo` (its `tsoracle.oracle`) names, bound
/// to the role the string logs in as, as the oracle's superuser does in the set-up runbook
/// (`tso_fleet_admit(system_id, role)`). Best effort, for the harness's members: an oracle not
/// running, or of a release without admission (0.5.0, whose update admits every member it
/// registered), is left alone; the member is then refused until a test admits it.
pub fn admit_cluster(node: &Node, conninfo: &str) {
    let Ok(id) = system_identifier(node) else { return };
    let _ = admit_on(conninfo, id);
}

/// `tso_fleet_admit(id, role)` on the oracle `conninfo` names, as `postgres` there.
pub fn admit_on(conninfo: &str, id: i64) -> std::result::Result<bool, String> {
    let mut role = MEMBER_ROLE.to_string();
    let mut kept = Vec::new();
    for kv in conninfo.split_whitespace() {
        let Some((k, v)) = kv.split_once('=') else { continue };
        match k {
            "user" => role = v.to_string(),
            "host" | "port" | "dbname" | "target_session_attrs" | "connect_timeout" => {
                kept.push(kv.to_string())
            }
            _ => {}
        }
    }
    kept.push("user=postgres".into());
    let mut c =
        postgres::Client::connect(&kept.join(" "), postgres::NoTls).map_err(|e| e.to_string())?;
    let row =
        c.query_one("SELECT tso_fleet_admit($1, $2)", &[&id, &role]).map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

/// A member's connection string to the oracle at `ports` (several: the first read-write).
pub fn oracle_conninfo(ports: &[u16], user: &str) -> String {
    let hosts = vec!["127.0.0.1"; ports.len()].join(",");
    let ports = ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
    format!(
        "host={hosts} port={ports} user={user} dbname=postgres target_session_attrs=read-write connect_timeout=2"
    )
}

pub fn member_opts(conninfo: &str) -> NodeOpts {
    NodeOpts::new()
        .setting("tsoracle.oracle", conninfo)
        .setting("tsoracle.extension_timeout_ms", 3000)
}

/// A started member, extension created, serving (connected to its oracle).
pub fn member(name: &str, conninfo: &str) -> Node {
    serving_node(name, member_opts(conninfo))
}

/// A started member admitted on `oracle` for `role` by the test (its string reaches the oracle
/// through something the harness does not read, such as a pooler), extension created, serving.
pub fn admitted_member(name: &str, conninfo: &str, oracle: &Node, role: &str) -> Node {
    let node = Node::start_new(name, member_opts(conninfo).unadmitted())
        .unwrap_or_else(|e| panic!("start member {name}: {e}"));
    admit(oracle, &node, role);
    node.create_extension().unwrap_or_else(|e| panic!("member {name} serving: {e}"));
    node
}

/// `tso_fleet_admit()` of `node`'s cluster on `oracle`, bound to `role`.
pub fn admit(oracle: &Node, node: &Node, role: &str) {
    let id = system_identifier(node).expect("the member's system identifier");
    oracle
        .connect()
        .query_one("SELECT tso_fleet_admit($1, $2)", &[&id, &role])
        .unwrap_or_else(|e| panic!("admit {id}: {}", crate::pg_error_string(&e)));
}

/// End every session of the members' role on `oracle` (their workers connect again): how many.
pub fn end_member_sessions(oracle: &Node) -> i64 {
    oracle
        .connect()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1",
            &[&MEMBER_ROLE],
        )
        .expect("end the members' sessions")
        .get(0)
}

/// What a relay wrote to `file` (none yet: nothing): each row's (cluster, id) and timestamp,
/// in file order, checked against the row's own `column`.
pub fn relay_output(file: &Path, column: &str) -> Vec<((String, i64), i64)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            let ts = v["ts"].as_i64().expect("ts");
            let cluster = v["cluster"].as_str().expect("cluster").to_string();
            assert_eq!(v["row"][column].as_i64(), Some(ts), "the row's own {column}: {line}");
            ((cluster, v["row"]["id"].as_i64().expect("row.id")), ts)
        })
        .collect()
}

/// The relay binary of this workspace, built (debug) if it is not yet.
pub fn relay_binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "tsoracle-relay"])
        .current_dir(&root)
        .status()
        .expect("run cargo build -p tsoracle-relay");
    assert!(status.success(), "cargo build -p tsoracle-relay failed");
    let bin = target.join("debug").join("tsoracle-relay");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// The runbooks' copy from one cluster to another (docs/operations/fleet.md): `psql` on `from`
/// runs `COPY (<query>) TO STDOUT`, piped into `psql` on `to` running `COPY <target> FROM
/// STDIN`, as an operator's shell would. Ok(what the second psql printed).
pub fn copy_between(from: &Node, query: &str, to: &Node, target: &str) -> crate::Result<String> {
    let psql = |n: &Node, sql: &str| {
        format!(
            "'{}' -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d postgres -p {} -c \"{sql}\"",
            n.bin_dir().join("psql").display(),
            n.port()
        )
    };
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!(
        "set -o pipefail; {} | {}",
        psql(from, &format!("COPY ({query}) TO STDOUT")),
        psql(to, &format!("COPY {target} FROM STDIN"))
    ));
    scrub_env(&mut cmd);
    run_cmd(cmd, Duration::from_secs(60))
}
