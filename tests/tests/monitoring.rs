//! The monitoring guide as a DBA types it on Debian (docs/operations/monitoring.md, runbook
//! `monitoring`), and the alert rules on what a real exporter read.
//!
//! The server has Debian's default `pg_hba.conf` (the one `pg_createcluster` wrote for
//! PostgreSQL 15 on this machine, [`DEBIAN_HBA`]), with one line before it for the harness's
//! own superuser connections over loopback; its socket is in a directory of its own, which the
//! page's `host=/run/postgresql port=5432` is pointed at. Debian's
//! `prometheus-postgres-exporter` runs as the OS user `prometheus`, with the page's
//! environment file, as its systemd unit would run it (`ExecStart=... $ARGS`). The page's own
//! check (step 3) must print `pg_up 1` and `tsoracle_serving ... 1`, and no alert fires on the
//! recorded series; the guide's earlier DSN (`host=127.0.0.1`, no password) meets Debian's
//! `scram-sha-256` line: `pg_up 0`, and `TsoracleExporterCannotConnect` is the one alert that
//! fires on what that exporter exports.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tsoracle_tests::alerts::record;
use tsoracle_tests::exporter::Exporter;
use tsoracle_tests::runbook::{environment, run_sh, run_sql, Runbook, MONITORING_STEPS};
use tsoracle_tests::{Node, NodeOpts};

/// Debian's default client authentication, as `pg_createcluster` wrote it for the cluster
/// `postgresql-15` creates on install.
const DEBIAN_HBA: &str = "/etc/postgresql/15/main/pg_hba.conf";
/// Its rules, as Debian bookworm's `pg_createcluster` writes them: for a machine whose
/// packaged cluster was dropped.
const DEBIAN_HBA_RULES: &str =
    "local   all             postgres                                peer
local   all             all                                     peer
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     peer
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
";
/// What the page's DSN and arguments name that is this machine's in the test.
const PAGE_SOCKET: &str = "host=/run/postgresql port=5432";
const PAGE_QUERIES: &str =
    "--extend.query-path=/usr/share/doc/postgresql-15-tsoracle/examples/queries.yaml";
const PAGE_LISTEN: &str = "127.0.0.1:9187";
/// The OS user Debian's exporter package runs it as.
const EXPORTER_OS_USER: &str = "prometheus";

/// A serving node with Debian's `pg_hba.conf` and its socket in `<basedir>/socket` (mode
/// 0755, the base directory 0711: the exporter's OS user reaches the socket and nothing else).
fn debian_node(name: &str) -> (Node, PathBuf) {
    let debian = fs::read_to_string(DEBIAN_HBA).unwrap_or_else(|_| DEBIAN_HBA_RULES.to_string());
    assert!(
        debian
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["local", "all", "all", "peer"]),
        "{DEBIAN_HBA} is not Debian's default (no `local all all peer`):\n{debian}"
    );
    let mut node = Node::init(name, NodeOpts::new()).expect("initdb");
    let socket = node.basedir().join("socket");
    fs::create_dir(&socket).expect("create the socket directory");
    let owner = fs::metadata(node.datadir()).expect("the data directory");
    std::os::unix::fs::chown(&socket, Some(uid(&owner)), Some(gid(&owner))).expect("chown");
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o755)).expect("chmod socket");
    fs::set_permissions(node.basedir(), fs::Permissions::from_mode(0o711)).expect("chmod base");
    let hba = format!(
        "# the tests' superuser over loopback (the harness's own connections)\nhost all postgres 127.0.0.1/32 trust\n{debian}"
    );
    fs::write(node.datadir().join("pg_hba.conf"), hba).expect("write pg_hba.conf");
    node.set_conf("unix_socket_directories", socket.display()).expect("set the socket directory");
    node.start().expect("start");
    node.create_extension().expect("CREATE EXTENSION");
    (node, socket)
}

fn uid(m: &fs::Metadata) -> u32 {
    std::os::unix::fs::MetadataExt::uid(m)
}

fn gid(m: &fs::Metadata) -> u32 {
    std::os::unix::fs::MetadataExt::gid(m)
}

/// The page's `ARGS`, split as systemd splits `$ARGS`, with the queries file and the port the
/// test's exporter uses.
fn page_args(args: &str, queries: &Path, port: u16) -> Vec<String> {
    assert!(args.contains(PAGE_QUERIES), "monitoring.md's ARGS no longer name {PAGE_QUERIES}");
    assert!(args.contains(PAGE_LISTEN), "monitoring.md's ARGS no longer name {PAGE_LISTEN}");
    args.replace(PAGE_QUERIES, &format!("--extend.query-path={}", queries.display()))
        .replace(PAGE_LISTEN, &format!("127.0.0.1:{port}"))
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The line of `out` that starts with `name` followed by a space or a label set.
fn line_of<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    out.lines().find(|l| {
        l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
    })
}

#[test]
fn the_exporter_connects_as_typed_on_debian_and_pages_when_it_cannot() {
    let book = Runbook::load("monitoring.md", "monitoring");
    book.expect_steps(MONITORING_STEPS);
    let (node, socket) = debian_node("monitoring-debian");
    // Step 1: the exporter's role, as a superuser in tsoracle.database.
    run_sql(book.step(1), node.bin_dir(), &node.conninfo(), "").expect("monitoring.md step 1");
    // Step 2: the exporter's environment file.
    let env = environment(book.step(2)).unwrap_or_else(|e| panic!("monitoring.md step 2: {e}"));
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("monitoring.md step 2 sets no {name}: {env:?}"))
    };
    let (dsn, args) = (var("DATA_SOURCE_NAME"), var("ARGS"));
    assert!(dsn.contains(PAGE_SOCKET), "monitoring.md's DSN no longer says {PAGE_SOCKET}: {dsn}");
    let here = format!("host={} port={}", socket.display(), node.port());
    let typed = Exporter::start_as(
        "debian",
        Some(EXPORTER_OS_USER),
        &dsn.replace(PAGE_SOCKET, &here),
        |q, p| page_args(&args, q, p),
    )
    .expect("start the exporter with the page's environment file");

    // Step 3: the page's check, against this exporter.
    let check = book.step(3).mutated(PAGE_LISTEN, &format!("127.0.0.1:{}", typed.port()));
    let out = run_sh(&check, node.bin_dir(), &[]).expect("monitoring.md step 3");
    let up = line_of(&out, "pg_up").unwrap_or_else(|| panic!("step 3 printed no pg_up:\n{out}"));
    assert!(
        up.ends_with(" 1"),
        "the exporter set up as typed cannot connect: {up}\n{}",
        typed.log_tail(20)
    );
    let serving = line_of(&out, "tsoracle_serving").unwrap_or_else(|| {
        panic!("step 3 printed no tsoracle_serving:\n{out}\n{}", typed.log_tail(20))
    });
    assert!(serving.ends_with(" 1"), "{serving}");
    // What it exports of a healthy primary pages nobody.
    let healthy = record(&typed, 2, Duration::from_millis(500), 4).expect("scrape");
    healthy.assert_firing(&[]);
    drop(typed);

    // The DSN the guide gave before (loopback, no password) meets Debian's scram-sha-256 line:
    // the exporter runs, exports pg_up 0 and nothing of tsoracle, and only that pages.
    let loopback = format!(
        "host=127.0.0.1 port={} user=prometheus dbname=postgres sslmode=disable",
        node.port()
    );
    let refused = Exporter::start_as("loopback", Some(EXPORTER_OS_USER), &loopback, |q, p| {
        page_args(&args, q, p)
    })
    .expect("start the exporter with the loopback DSN");
    let m = refused.scrape().expect("scrape");
    assert_eq!(m.value("pg_up").expect("pg_up"), 0.0, "{}", refused.log_tail(20));
    assert!(m.names_with_prefix("tsoracle_").is_empty(), "{:?}", m.names_with_prefix("tsoracle_"));
    let down = record(&refused, 2, Duration::from_millis(500), 4).expect("scrape");
    down.assert_firing(&["TsoracleExporterCannotConnect"]);
}
