//! Careless operators: no sequence of DROP / CREATE EXTENSION, restarts and crashes makes
//! `tso_next()` return a value at or below one it returned before, unless a superuser said
//! they accept it (`tsoracle.allow_drop`). Every way to drop what holds the durable
//! high-water — the extension (plainly, by CASCADE, with the schema that holds it), its table,
//! its database — is refused with 55006, by a superuser and by the database's owner alike.
//!
//! The uninstall of docs/operations/uninstalling.md is run from the page's own block
//! (`<!-- runbook: uninstall step=1 -->`): it drops the extension as written, and the same
//! block without its `SET tsoracle.allow_drop = on` is refused.
//!
//! Run with: `cargo test -p tsoracle-tests --test drops -- --test-threads=2`

use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use tsoracle_tests::runbook::{run_sql, Block, Runbook, UNINSTALL_STEPS};
use tsoracle_tests::tso::{self, tso_next, tso_seed};
use tsoracle_tests::{
    expect_sqlstate, now_ms, pg_error_string, physical, serving_node, Node, NodeOpts, StopMode,
};

fn ok<T>(r: Result<T, postgres::Error>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", pg_error_string(&e)))
}

fn connect(node: &Node, user: &str, db: &str) -> Client {
    Client::connect(&node.conninfo_for(user, db), NoTls)
        .unwrap_or_else(|e| panic!("connect as {user} to {db}: {}", pg_error_string(&e)))
}

/// Reconnect to `app` and wait until it serves (after a restart or a recreate).
fn serving(node: &Node) -> Client {
    let mut c = tsoracle_tests::poll_until("connect to app", Duration::from_secs(30), || {
        Client::connect(&node.conninfo_for("postgres", "app"), NoTls).ok()
    });
    tso::wait_serving(&mut c).unwrap_or_else(|e| panic!("not serving: {e}"));
    c
}

/// `sql` fails with 55006, names what it would drop and how to drop it anyway.
#[track_caller]
fn refused(c: &mut Client, sql: &str) {
    let e = expect_sqlstate(c.batch_execute(sql), &SqlState::OBJECT_IN_USE, sql);
    let db = e.as_db_error().expect("a server error");
    assert!(db.message().starts_with("cannot drop "), "{sql}: {}", db.message());
    assert!(
        db.hint().is_some_and(|h| h.contains("tsoracle.allow_drop") && h.contains("tso_seed(")),
        "{sql}: the HINT says how: {:?}",
        db.hint()
    );
    // A statement inside an explicit transaction leaves it aborted.
    ok(c.batch_execute("ROLLBACK"), "ROLLBACK");
}

/// Every later value is above `floor`.
#[track_caller]
fn above(c: &mut Client, floor: i64, after: &str) -> i64 {
    let v = ok(tso_next(c), after);
    assert!(v > floor, "after {after}: tso_next() = {v} is not above {floor}, returned before");
    v
}

fn run(name: &str, seed_ahead_ms: Option<i64>) {
    let mut node = Node::start_new(name, NodeOpts::new().setting("tsoracle.database", "app"))
        .unwrap_or_else(|e| panic!("start node: {e}"));
    let mut su = node.connect();
    ok(su.batch_execute("CREATE ROLE app_owner LOGIN"), "CREATE ROLE");
    ok(su.batch_execute("CREATE DATABASE app OWNER app_owner"), "CREATE DATABASE");
    let mut app = connect(&node, "postgres", "app");
    ok(app.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION");
    let mut app = {
        drop(app);
        serving(&node)
    };
    if let Some(ahead) = seed_ahead_ms {
        ok(tso_seed(&mut app, now_ms() + ahead), "tso_seed");
    }
    let mut last = 0;
    for _ in 0..100 {
        last = above(&mut app, last, "a tso_next() before the drops");
    }
    if let Some(ahead) = seed_ahead_ms {
        assert!(physical(last) >= now_ms() + ahead - 60_000, "seeded ahead: {last}");
    }

    // A superuser, in the worker's database.
    for sql in [
        "DROP EXTENSION tsoracle",
        "DROP EXTENSION tsoracle CASCADE",
        "DROP EXTENSION IF EXISTS tsoracle RESTRICT",
        "DROP SCHEMA public CASCADE",
        "BEGIN; ALTER EXTENSION tsoracle DROP TABLE tsoracle.high_water; DROP TABLE tsoracle.high_water",
        "BEGIN; SET LOCAL tsoracle.allow_drop = off; DROP EXTENSION tsoracle",
    ] {
        refused(&mut app, sql);
    }
    // The schema of the tables is a member of the extension: PostgreSQL itself refuses.
    expect_sqlstate(
        app.batch_execute("DROP SCHEMA tsoracle CASCADE"),
        &SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
        "DROP SCHEMA tsoracle CASCADE",
    );
    // The worker's database itself, from another one.
    refused(&mut su, "DROP DATABASE app WITH (FORCE)");
    refused(&mut su, "DROP DATABASE app");
    // Its owner, no superuser: it owns schema public, which holds the extension, and DROP
    // SCHEMA ... CASCADE drops what it holds, whoever owns it.
    let mut owner = connect(&node, "app_owner", "app");
    refused(&mut owner, "DROP SCHEMA public CASCADE");
    expect_sqlstate(
        owner.batch_execute("SET tsoracle.allow_drop = on"),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "the database owner sets tsoracle.allow_drop",
    );
    let present: i64 =
        ok(app.query_one("SELECT count(*) FROM pg_extension WHERE extname = 'tsoracle'", &[]), "")
            .get(0);
    assert_eq!(present, 1, "the extension is still there");
    last = above(&mut app, last, "the refused drops");

    // Restarts and a crash after the refused drops.
    for how in ["fast restart", "kill -9"] {
        drop(app);
        drop(owner);
        if how == "kill -9" {
            node.kill9_postmaster().expect("kill -9");
            node.start().expect("start");
        } else {
            node.restart(StopMode::Fast).expect("restart");
        }
        app = serving(&node);
        owner = connect(&node, "app_owner", "app");
        last = above(&mut app, last, how);
    }

    // Said explicitly: the drop goes through, with a WARNING that says what to do. Recreated
    // before a restart, the oracle still starts above everything (the server remembers).
    ok(
        app.batch_execute(
            "SET tsoracle.allow_drop = on; DROP EXTENSION tsoracle; RESET tsoracle.allow_drop",
        ),
        "DROP EXTENSION with tsoracle.allow_drop",
    );
    let seed: i64 = tsoracle_tests::poll_until(
        "the WARNING of the permitted drop in the log",
        Duration::from_secs(10),
        || {
            let log = node.log_contents();
            let at = log.rfind("run SELECT tso_seed(")? + "run SELECT tso_seed(".len();
            log[at..].split(')').next()?.parse().ok()
        },
    );
    assert!(seed >= physical(last), "the WARNING names the high-water {seed} (last {last})");
    ok(app.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION again");
    drop(app);
    app = serving(&node);
    last = above(&mut app, last, "DROP and CREATE EXTENSION without a restart");
    // Following the WARNING, the order survives the restart too.
    ok(tso_seed(&mut app, seed), "tso_seed as the WARNING says");
    last = above(&mut app, last, "tso_seed");
    drop(app);
    node.restart(StopMode::Immediate).expect("restart");
    app = serving(&node);
    above(&mut app, last, "the permitted drop, the seed and an immediate restart");
    drop(owner);
}

#[test]
fn drops_of_a_seeded_oracle_are_refused_and_never_go_back() {
    run("drops-seeded", Some(3_600_000));
}

#[test]
fn drops_are_refused_and_never_go_back() {
    run("drops-plain", None);
}

/// How many tsoracle extensions `node`'s database `postgres` has (0 or 1).
fn installed(node: &Node) -> i64 {
    let mut c = node.connect();
    ok(c.query_one("SELECT count(*) FROM pg_extension WHERE extname = 'tsoracle'", &[]), "").get(0)
}

/// Uninstalling a standalone cluster by the page (docs/operations/uninstalling.md, step 2),
/// its block run as written with `psql -f`; the block without its `SET` (the step's
/// dangerous half skipped) is refused by the drop guard and leaves the extension serving.
#[test]
fn uninstalling_by_the_page_drops_only_with_its_set() {
    let book = Runbook::load("uninstalling.md", "uninstall");
    book.expect_steps(UNINSTALL_STEPS);
    let step = book.step(1);
    let node = serving_node("drops-uninstall", NodeOpts::new());
    let mut c = node.connect();
    let before = ok(tso_next(&mut c), "tso_next before the uninstall");
    drop(c);
    let without_set = Block {
        text: step
            .text
            .lines()
            .filter(|l| !l.contains("allow_drop"))
            .map(|l| format!("{l}\n"))
            .collect(),
        ..step.clone()
    };
    assert_ne!(without_set.text, step.text, "the page's block sets tsoracle.allow_drop");
    let e = run_sql(&without_set, node.bin_dir(), &node.conninfo(), "")
        .expect_err("DROP EXTENSION without tsoracle.allow_drop is refused");
    assert!(e.to_string().contains("cannot drop"), "the drop guard refuses: {e}");
    assert_eq!(installed(&node), 1, "the refused drop left the extension");
    let mut c = node.connect();
    let after = ok(tso_next(&mut c), "tso_next after the refused drop");
    assert!(after > before, "{after} is not above {before}");
    drop(c);
    run_sql(step, node.bin_dir(), &node.conninfo(), "")
        .unwrap_or_else(|e| panic!("uninstalling.md line {}: {e}\n{}", step.line, step.text));
    assert_eq!(installed(&node), 0, "the page's block dropped the extension");
}
