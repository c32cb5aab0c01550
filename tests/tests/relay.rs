//! `tsoracle-relay` as users run it (docs/operations/relay.md):
//!
//! - through TLS, configured by the page's own configuration file (relay.md, "The service": the
//!   block marked `<!-- runbook: relay step=1 -->`, which is also the variables of
//!   contrib/systemd/relay.conf), as written but for the hosts, ports, CA and database: an
//!   oracle and a member serve TLS with the suite's throw-away CA and admit the relay's role
//!   over TLS only; the member is the page's `orders`, a standby of it first among its hosts,
//!   the oracle its `billing`; the relay emits every committed row of both exactly once, in
//!   timestamp order, and none that rolled back, over connections the servers list as TLS
//!   ones. The page's file without `target_session_attrs=read-write` reaches the standby and is
//!   refused at the start (exit code 3); so is it with another CA. A CA that did not sign the
//!   server's certificate, a host name the certificate does not name, and no TLS at all are each
//!   refused at the start with exit code 3 and one line saying why;
//! - its metrics, read during that run: the rows emitted per cluster never exceed the output
//!   file's and match it once the relay is idle; the cursor; the lag of `R_f` behind the
//!   oracle's newest value, which grows past a second while an idle transaction on the member
//!   holds `R_f` back, and the cursor stays below that transaction's row meanwhile;
//! - configured only through `TSORACLE_RELAY_*` variables (two clusters in one variable, a
//!   table in a schema, a column of another name, a cursor file of its own path, the second
//!   cluster through a libpq service file), it emits every row once per cluster and exits 0 at
//!   `TSORACLE_RELAY_UNTIL`; a cluster's connection string that reaches a standby is refused
//!   at the start (exit code 3): the relay reads primaries only;
//! - each bad argument gets its documented exit code (2 arguments, 3 cannot connect, 4 a cursor
//!   file that does not match the output, 5 a metrics address in use, 1 an output it cannot
//!   write) and a one-line message on standard error; `--help` and `--version` exit 0.
//!
//! Run with: `cargo test -p tsoracle-tests --test relay -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use postgres::Client;
use tsoracle_tests::exporter::Metrics;
use tsoracle_tests::fleet::{
    admit_members, member, oracle_conninfo, relay_binary, relay_output, MEMBER_ROLE,
};
use tsoracle_tests::patroni::http;
use tsoracle_tests::runbook::{environment, Block, Runbook, RELAY_STEPS};
use tsoracle_tests::tls::TestCa;
use tsoracle_tests::{poll_until, serving_node, Node, NodeOpts};

/// The relay's role on every cluster (the page's): it reads the outbox, over TLS only where TLS
/// is served.
const RELAY_ROLE: &str = "relay";
const OUTBOX: &str =
    "CREATE TABLE outbox (id bigint PRIMARY KEY, ts bigint NOT NULL DEFAULT tso_next(), note text)";

const RELAY_MD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations/relay.md");
const EXAMPLE_CONF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/systemd/relay.conf");
/// A row: (cluster, id).
type RowId = (String, i64);

/// A directory of the test's own, empty.
fn work_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tsoracle-relay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a work directory");
    dir
}

/// The relay, with no `TSORACLE_RELAY_*` variable of the test's own environment.
fn relay_command() -> Command {
    let mut cmd = Command::new(relay_binary());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TSORACLE_RELAY_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A running relay; what it says on standard error is kept. Killed when dropped.
struct Relay {
    child: Child,
    said: Arc<Mutex<Vec<String>>>,
}

impl Relay {
    fn start(mut cmd: Command) -> Relay {
        let mut child =
            cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start the relay");
        let said = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().expect("the relay's standard error");
        let keep = said.clone();
        thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if !line.contains("rows/s") {
                    eprintln!("{line}");
                }
                keep.lock().unwrap().push(line);
            }
        });
        Relay { child, said }
    }

    /// The metrics port it logged.
    fn metrics_port(&self) -> u16 {
        poll_until("the relay logs its metrics address", Duration::from_secs(30), || {
            self.said.lock().unwrap().iter().find_map(|l| {
                let rest = l.split("metrics at http://127.0.0.1:").nth(1)?;
                rest.split('/').next()?.parse().ok()
            })
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scrape(port: u16) -> Metrics {
    match http(port, "GET", "/metrics", Duration::from_secs(10)) {
        Ok((200, body)) => Metrics::parse(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        other => panic!("GET /metrics: {other:?}"),
    }
}

/// The value of `name` with label `key="value"`.
fn labelled(m: &Metrics, name: &str, key: &str, value: &str) -> f64 {
    m.samples_of(name)
        .into_iter()
        .find(|s| s.labels.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no {name}{{{key}=\"{value}\"}}"))
        .value
}

fn cursor_of(file: &Path) -> i64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// `emitted` holds every row of `truth` exactly once, nothing else, in timestamp order.
#[track_caller]
fn assert_exactly_once_in_order(emitted: &[(RowId, i64)], truth: &BTreeMap<RowId, i64>) {
    let mut seen = BTreeSet::new();
    for (row, ts) in emitted {
        assert!(seen.insert(row.clone()), "{row:?} emitted twice");
        assert_eq!(truth.get(row), Some(ts), "{row:?} emitted, but not committed with ts {ts}");
    }
    let missing: Vec<_> = truth.keys().filter(|r| !seen.contains(*r)).take(5).collect();
    assert!(missing.is_empty(), "committed rows missed, e.g. {missing:?}");
    for w in emitted.windows(2) {
        assert!(w[0].1 <= w[1].1, "{:?} emitted before {:?}", w[0], w[1]);
    }
}

/// One writer per cluster: transactions of 1 to 3 rows, every 7th rolled back; the
/// committed ones recorded.
fn writer(
    cluster: String,
    mut c: Client,
    stop: Arc<AtomicBool>,
    committed: Arc<Mutex<BTreeMap<RowId, i64>>>,
) {
    let mut id = 0i64;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let mut tx = c.transaction().expect("BEGIN");
        let mut rows = Vec::new();
        for _ in 0..(n % 3 + 1) {
            id += 1;
            let r = tx
                .query_one("INSERT INTO outbox (id, note) VALUES ($1, 'x') RETURNING ts", &[&id])
                .expect("INSERT");
            rows.push(((cluster.clone(), id), r.get::<_, i64>(0)));
        }
        if n.is_multiple_of(7) {
            tx.rollback().expect("ROLLBACK");
        } else {
            tx.commit().expect("COMMIT");
            committed.lock().unwrap().extend(rows);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The relay's role on `node`, with what it reads.
fn relay_role(node: &Node) {
    node.connect()
        .batch_execute(&format!(
            "CREATE ROLE {RELAY_ROLE} LOGIN; GRANT SELECT ON outbox TO {RELAY_ROLE};"
        ))
        .expect("the relay's role");
}

/// The relay's connection string to `node`, verified against `ca`.
fn verified(node: &Node, ca: &TestCa, host: &str) -> String {
    format!(
        "host={host} hostaddr=127.0.0.1 port={} user={RELAY_ROLE} dbname=postgres sslmode=verify-full sslrootcert={} connect_timeout=5",
        node.port(),
        ca.root_cert().display()
    )
}

/// The page's configuration file with the test's hosts, ports, CA and database for the page's
/// (each must be on the page): `oracle-a` a port nothing listens on and `oracle-b` the oracle,
/// `orders-a` the member's standby and `orders-b` the member, `billing` the oracle; the metrics
/// on any free port.
fn local_conf(page: &Block, oracle: u16, member: u16, standby: u16, ca: &TestCa) -> Block {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    page.mutated(
        "host=oracle-a,oracle-b ",
        &format!("host=127.0.0.1,127.0.0.1 port={closed},{oracle} "),
    )
    .mutated(
        "host=orders-a,orders-b ",
        &format!("host=127.0.0.1,127.0.0.1 port={standby},{member} "),
    )
    .mutated("host=billing ", &format!("host=127.0.0.1 port={oracle} "))
    .mutated(
        "sslrootcert=/etc/tsoracle/relay/ca.crt",
        &format!("sslrootcert={}", ca.root_cert().display()),
    )
    .mutated("dbname=app ", "dbname=postgres connect_timeout=5 ")
    .mutated("METRICS_ADDR=127.0.0.1:9310", "METRICS_ADDR=127.0.0.1:0")
}

/// The relay with `conf`'s variables as its only `TSORACLE_RELAY_*` ones (as the unit's
/// `EnvironmentFile=`).
fn relay_with(conf: &Block) -> Command {
    let mut cmd = relay_command();
    cmd.envs(environment(conf).unwrap_or_else(|e| panic!("relay.md: {e}")));
    cmd
}

/// The relay started with `args` and `--connect-wait-ms 0`: exit code and standard error.
fn refused(args: &[String]) -> (Option<i32>, String) {
    let out = relay_command()
        .args(args)
        .args(["--connect-wait-ms", "0"])
        .stdout(Stdio::null())
        .output()
        .expect("run the relay");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_relay_through_verify_full_exactly_once_with_metrics() {
    let oracle = serving_node("relay-t-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m1 = member("relay-t-m1", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let (mut oracle, mut m1) = (oracle, m1);
    for n in [&oracle, &m1] {
        n.connect().batch_execute(OUTBOX).expect("the outbox");
        relay_role(n);
    }
    let ca = TestCa::new("relay-t-ca").expect("a test CA");
    let other = TestCa::new("relay-t-other").expect("a second CA");
    ca.serve_tls(&mut oracle, &[RELAY_ROLE]).expect("TLS on the oracle");
    ca.serve_tls(&mut m1, &[RELAY_ROLE]).expect("TLS on the member");

    // The page's configuration file: the variables of the example the package ships.
    let book = Runbook::load("relay.md", "relay");
    book.expect_steps(RELAY_STEPS);
    let page = book.step(1);
    let example = std::fs::read_to_string(EXAMPLE_CONF).expect("contrib/systemd/relay.conf");
    let example = Block { text: example, ..page.clone() };
    assert_eq!(
        environment(&example).unwrap(),
        environment(page).unwrap(),
        "{RELAY_MD}'s configuration file is not the variables of {EXAMPLE_CONF}"
    );
    // The page's orders-a: a standby of the member (TLS as the member's, copied).
    let mut standby = Node::base_backup_from(&m1, "relay-t-m1-standby").expect("pg_basebackup");
    standby.start().expect("start the member's standby");
    let conf = local_conf(page, oracle.port(), m1.port(), standby.port(), &ca);
    // Mutants of the page's file, refused at the start with exit code 3 and one line: without
    // target_session_attrs=read-write, orders-a (the standby) is the cluster's connection;
    // with another CA, the oracle's certificate fails verification.
    let mutants = [
        (
            conf.mutated("target_session_attrs=read-write", ""),
            "cannot connect to orders: it is a standby",
        ),
        (
            local_conf(page, oracle.port(), m1.port(), standby.port(), &other),
            "certificate verify failed",
        ),
    ];
    for (mutant, why) in mutants {
        let out = relay_with(&mutant)
            .args(["--connect-wait-ms", "0"])
            .stdout(Stdio::null())
            .output()
            .expect("run the relay");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "a mutant of relay.md's file: {err}");
        let said: Vec<&str> = err.lines().filter(|l| !l.contains(": metrics at http")).collect();
        assert_eq!(said.len(), 1, "one line (and the metrics address): {err}");
        assert!(err.contains(why), "{why:?} in {err}");
    }

    // Refused at the start, each with exit code 3 and one line that says why.
    let cluster = |conninfo: String| vec!["--cluster".to_string(), format!("m1={conninfo}")];
    let cases = [
        (verified(&oracle, &other, "127.0.0.1"), "certificate verify failed"),
        (verified(&oracle, &ca, "localhost"), "does not match host name \"localhost\""),
        (
            format!(
                "host=127.0.0.1 port={} user={RELAY_ROLE} dbname=postgres sslmode=disable",
                oracle.port()
            ),
            "no encryption",
        ),
    ];
    for (oracle_conninfo, why) in cases {
        let mut args = vec!["--oracle".to_string(), oracle_conninfo.clone()];
        args.extend(cluster(verified(&m1, &ca, "127.0.0.1")));
        let (code, err) = refused(&args);
        assert_eq!(code, Some(3), "{oracle_conninfo}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("tsoracle-relay: cannot connect to oracle: "), "{err}");
        assert!(err.contains(why), "{oracle_conninfo}: {why:?} in {err}");
    }

    // Writers on both clusters; the relay through verify-full, with its metrics.
    let dir = work_dir("tls");
    let out = dir.join("out.jsonl");
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(Mutex::new(BTreeMap::new()));
    let writers: Vec<JoinHandle<()>> = [(&oracle, "billing"), (&m1, "orders")]
        .into_iter()
        .map(|(n, name)| {
            let (c, stop, committed) = (n.connect(), stop.clone(), committed.clone());
            let name = name.to_string();
            thread::spawn(move || writer(name, c, stop, committed))
        })
        .collect();
    // The page's file as the unit runs it (TSORACLE_RELAY_OUTPUT is the unit's); the command
    // line wins over the file.
    let mut cmd = relay_with(&conf);
    cmd.env("TSORACLE_RELAY_OUTPUT", &out).args(["--interval-ms", "100"]);
    let relay = Relay::start(cmd);
    let port = relay.metrics_port();

    // During the run: rows emitted, never more than the file holds.
    let during =
        poll_until("the relay emits rows of both clusters", Duration::from_secs(60), || {
            let m = scrape(port);
            let rows = |c| labelled(&m, "tsoracle_relay_rows_total", "cluster", c);
            (rows("billing") > 0.0 && rows("orders") > 0.0).then_some(m)
        });
    let in_file = relay_output(&out, "ts");
    for c in ["billing", "orders"] {
        let file = in_file.iter().filter(|((n, _), _)| n == c).count() as f64;
        let scraped = labelled(&during, "tsoracle_relay_rows_total", "cluster", c);
        assert!(scraped <= file, "{c}: {scraped} rows emitted, but {file} in the file");
        assert!(labelled(&during, "tsoracle_relay_rounds_total", "cluster", c) >= 1.0);
    }
    assert!(during.value("tsoracle_relay_cursor").unwrap() > 0.0);
    let lag = during.value("tsoracle_relay_resolved_lag_seconds").expect("the lag");
    assert!(lag >= 0.0, "lag {lag}");
    // The relay's sessions are TLS ones (and its role may not connect without).
    for n in [&oracle, &m1] {
        let (all, tls): (i64, i64) = {
            let r = n
                .connect()
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
                     JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'tsoracle-relay'",
                    &[],
                )
                .expect("pg_stat_ssl");
            (r.get(0), r.get(1))
        };
        assert!(all >= 1 && tls == all, "{}: {tls} of {all} relay sessions use TLS", n.name());
    }

    // An idle transaction on the member holds R_f back: the cursor stays below its row, and
    // the lag behind the oracle's newest value (the oracle's writer goes on) passes a second.
    let mut holder = m1.connect();
    let mut held = holder.transaction().expect("BEGIN");
    let held_ts: i64 = held
        .query_one("INSERT INTO outbox (id, note) VALUES (-1, 'held') RETURNING ts", &[])
        .expect("the held row")
        .get(0);
    let lagging = poll_until("the lag passes a second", Duration::from_secs(60), || {
        let m = scrape(port);
        let lag = m.value("tsoracle_relay_resolved_lag_seconds").ok()?;
        (lag >= 1.0).then_some(m)
    });
    // (The metric is a float: exact only to 64 units at this size; the file is exact, and
    // saved before the metric is set.)
    let scraped = lagging.value("tsoracle_relay_cursor").unwrap();
    assert!(scraped <= held_ts as f64, "the cursor {scraped} passed the held row {held_ts}");
    let cursor_file = dir.join("out.jsonl.cursor");
    let cursor = cursor_of(&cursor_file);
    assert!(cursor > 0 && cursor < held_ts, "the cursor {cursor} passed the held row {held_ts}");
    held.commit().expect("COMMIT the held row");
    committed.lock().unwrap().insert(("orders".into(), -1), held_ts);

    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().expect("a writer panicked");
    }
    let truth = committed.lock().unwrap().clone();
    let newest = truth.values().copied().max().expect("rows");
    poll_until("the relay passes the newest row", Duration::from_secs(60), || {
        (cursor_of(&cursor_file) >= newest).then_some(())
    });
    // Idle now: the metrics match the file.
    let emitted = relay_output(&out, "ts");
    let m = scrape(port);
    for c in ["billing", "orders"] {
        let file = emitted.iter().filter(|((n, _), _)| n == c).count() as f64;
        assert_eq!(labelled(&m, "tsoracle_relay_rows_total", "cluster", c), file, "{c}");
    }
    assert!(m.value("tsoracle_relay_cursor").unwrap() >= newest as f64);
    assert_eq!(m.kind("tsoracle_relay_rows"), Some("counter"));
    // Every metric it serves is in docs/operations/relay.md, and every documented one is
    // served (but those of errors, which wait for the first).
    let doc = std::fs::read_to_string(RELAY_MD).expect("docs/operations/relay.md");
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `tsoracle_relay_"))
        .filter_map(|l| l.split(['`', '{']).next())
        .map(|n| format!("tsoracle_relay_{n}"))
        .collect();
    let served = m.names_with_prefix("tsoracle_relay_");
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(undocumented.is_empty(), "served, not in {RELAY_MD}: {undocumented:?}");
    let errors = ["tsoracle_relay_errors_total", "tsoracle_relay_last_error_info"];
    let missing: Vec<_> = documented
        .iter()
        .filter(|d| !served.contains(*d) && !errors.contains(&d.as_str()))
        .collect();
    assert!(missing.is_empty() && documented.len() >= 9, "documented, not served: {missing:?}");
    drop(relay);
    assert_exactly_once_in_order(&emitted, &truth);
    assert!(emitted.len() > 20, "{} rows", emitted.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_relay_configured_only_through_the_environment() {
    let node = serving_node("relay-env", NodeOpts::new());
    let mut c = node.connect();
    c.batch_execute(
        "CREATE SCHEMA app; CREATE TABLE app.events (id bigint PRIMARY KEY, stamp bigint NOT NULL DEFAULT tso_next())",
    )
    .expect("the outbox");
    let mut truth = BTreeMap::new();
    for batch in 0..10i64 {
        let mut tx = c.transaction().unwrap();
        let mut rows = Vec::new();
        for i in 0..5 {
            let id = batch * 10 + i;
            let r = tx
                .query_one("INSERT INTO app.events (id) VALUES ($1) RETURNING stamp", &[&id])
                .unwrap();
            rows.push((id, r.get::<_, i64>(0)));
        }
        if batch % 4 == 3 {
            tx.rollback().unwrap();
            continue;
        }
        tx.commit().unwrap();
        for (id, ts) in rows {
            // The same server as two clusters: every row once under each name.
            truth.insert(("a".to_string(), id), ts);
            truth.insert(("b".to_string(), id), ts);
        }
    }
    let newest = truth.values().copied().max().unwrap();
    let dir = work_dir("env");
    let services = dir.join("pg_service.conf");
    std::fs::write(
        &services,
        format!(
            "[relaytest]\nhost=127.0.0.1\nport={}\nuser=postgres\ndbname=postgres\n",
            node.port()
        ),
    )
    .unwrap();
    let out = dir.join("events.jsonl");
    let cursor = dir.join("where.cursor");
    let status = relay_command()
        .env("TSORACLE_RELAY_ORACLE", node.conninfo())
        .env("TSORACLE_RELAY_CLUSTERS", format!("a={};b=service=relaytest", node.conninfo()))
        .env("TSORACLE_RELAY_TABLE", "app.events")
        .env("TSORACLE_RELAY_COLUMN", "stamp")
        .env("TSORACLE_RELAY_OUTPUT", &out)
        .env("TSORACLE_RELAY_CURSOR", &cursor)
        .env("TSORACLE_RELAY_INTERVAL_MS", "50")
        .env("TSORACLE_RELAY_UNTIL", newest.to_string())
        .env("TSORACLE_RELAY_CONNECT_WAIT_MS", "10000")
        .env("PGSERVICEFILE", &services)
        .stdout(Stdio::null())
        .status()
        .expect("run the relay");
    assert_eq!(status.code(), Some(0), "the relay stops at TSORACLE_RELAY_UNTIL");
    assert_exactly_once_in_order(&relay_output(&out, "stamp"), &truth);
    assert!(cursor_of(&cursor) >= newest, "the cursor file of TSORACLE_RELAY_CURSOR");
    assert!(!dir.join("events.jsonl.cursor").exists(), "no cursor at the default path");

    // A cluster's connection string that reaches a standby is refused: exit 3, one line.
    let mut standby = Node::base_backup_from(&node, "relay-env-standby").expect("pg_basebackup");
    standby.start().expect("start the standby");
    let (code, err) = refused(&[
        "--oracle".into(),
        node.conninfo(),
        "--cluster".into(),
        format!("a={}", standby.conninfo()),
    ]);
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("cannot connect to a: it is a standby"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Arguments, a variable, the exit code, and what the one line says.
type Case<'a> = (Vec<String>, Option<(&'a str, &'a str)>, i32, &'a str);

#[test]
fn each_bad_argument_gets_its_exit_code_and_one_line() {
    let dir = work_dir("args");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // A loopback port nothing listens on, and one that is taken.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("host=127.0.0.1 port={closed} connect_timeout=2");
    let ok = |more: &[&str]| {
        let mut v = s(&["--oracle", &nowhere, "--cluster", &format!("a={nowhere}")]);
        v.extend(s(more));
        v
    };
    let short = dir.join("short.jsonl");
    std::fs::write(&short, "{}\n").unwrap();
    std::fs::write(dir.join("short.jsonl.cursor"), "7 100\n").unwrap();
    let garbled = dir.join("garbled.jsonl");
    std::fs::write(dir.join("garbled.jsonl.cursor"), "not a cursor").unwrap();
    let (short, garbled) = (short.display().to_string(), garbled.display().to_string());
    let busy_addr = busy.local_addr().unwrap().to_string();
    let cases: Vec<Case> = vec![
        (s(&[]), None, 2, "--oracle (or TSORACLE_RELAY_ORACLE) is required"),
        (s(&["--oracle", &nowhere]), None, 2, "at least one --cluster"),
        (s(&["--oracle", &nowhere, "--cluster", "orders"]), None, 2, "NAME=CONNINFO"),
        (ok(&["--cluster", "a=port=2"]), None, 2, "two clusters are named \"a\""),
        (ok(&["--interval-ms", "soon"]), None, 2, "--interval-ms"),
        (ok(&[]), Some(("TSORACLE_RELAY_INTERVAL_MS", "soon")), 2, "--interval-ms"),
        (ok(&["--until", "tomorrow"]), None, 2, "--until"),
        (ok(&["--nope"]), None, 2, "--nope"),
        (ok(&["--metrics-addr", "no-port"]), None, 2, "--metrics-addr"),
        (s(&["--oracle", "host=x sslmod=require", "--cluster", "a=port=1"]), None, 2, "sslmod"),
        (ok(&[]), None, 3, "cannot connect to oracle: "),
        (ok(&["--output", &short]), None, 4, "fewer than the 100 its cursor says"),
        (ok(&["--output", &garbled]), None, 4, "is not a cursor"),
        (ok(&["--metrics-addr", &busy_addr]), None, 5, "--metrics-addr"),
        (ok(&["--output", "/nonexistent/out.jsonl"]), None, 1, "No such file"),
    ];
    for (args, env, code, says) in cases {
        let mut cmd = relay_command();
        cmd.args(&args).args(["--connect-wait-ms", "0"]).stdout(Stdio::null());
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run the relay");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?} {env:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line, got {err:?}");
        assert!(
            err.starts_with("tsoracle-relay: ") && err.contains(says),
            "{args:?}: {says:?} in {err:?}"
        );
    }
    drop(busy);

    for (flag, says) in [("--help", "TSORACLE_RELAY_CLUSTERS"), ("--version", "tsoracle-relay ")] {
        let out = relay_command().arg(flag).output().expect("run the relay");
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(says), "{flag}: {text}");
        assert!(out.stderr.is_empty(), "{flag}: nothing on standard error");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
