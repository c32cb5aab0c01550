//! Backups, restores and extension upgrades keep every guarantee.
//!
//! * **Logical restores** ([`logical_restores_keep_the_high_water_counters_and_leases`]): one
//!   source cluster (the extension in `tsoracle.database` = `postgres`, a 2-million-row table
//!   so that a restore takes seconds, the high-water seeded an hour ahead of the clock so the
//!   clock cannot hide a lost high-water, two `tso_seq` counters, a live lease held by a role
//!   granted `tsoracle_lease_holder`) dumped once in each format, then restored into fresh
//!   clusters with tsoracle preloaded, its worker up during the restore and a prober calling
//!   `tso_next()` throughout: a plain dump through `psql -v ON_ERROR_STOP=1 -f` (with and
//!   without `--single-transaction`), `pg_restore --exit-on-error` of a custom dump into a
//!   new database (`createdb`; `tsoracle.database` names it) and of a directory dump (also
//!   with `-j 4`), and a plain dump into a cluster whose own high-water is already higher.
//!   The lease holder's role is created on each target first, as `pg_dumpall --globals-only`
//!   would: a database's dump does not carry roles.
//! * **A member's dump** ([`a_members_dump_restored_elsewhere_never_hands_out_its_values_again`]):
//!   docs/operations/backups.md's steps, run from the page, into a member of the same oracle
//!   and into a cluster on its own; nothing the dump holds is handed out again.
//! * **Point-in-time recovery** ([`pitr_to_a_target_time_serves_above_everything_before_it`],
//!   [`pitr_to_the_end_of_the_archive_serves_above_everything_issued`]): a primary archiving
//!   its WAL under a timestamp and sequence load, a base backup taken before the load, restored
//!   with `restore_command` to a `recovery_target_time` (promote) or to the end of the archive.
//! * **Extension upgrade** ([`alter_extension_update_from_0_1_0_under_load_keeps_every_guarantee`],
//!   [`alter_extension_update_from_0_5_0_under_load_keeps_every_guarantee`]): `CREATE
//!   EXTENSION tsoracle VERSION '<released version>'` under the current library, state in its
//!   tables, a synchronous standby, 16 sessions calling `tso_next()`/`tso_next_batch()`, then
//!   `ALTER EXTENSION tsoracle UPDATE`, which walks the upgrade chain to the current version.
//!
//! Run with: `cargo test -p tsoracle-tests --test backup -- --test-threads=1`

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::backup::{
    createdb, pg_dump, pg_restore, prepare_archive_recovery, psql_file, switch_and_archive,
    wait_recovery_end, DumpFormat, PgDir, Prober, RecoveryTarget, WalArchive,
};
use tsoracle_tests::cluster::{
    make_sync, wait_replayed, MixedLoad, MixedLoadOptions, PrimaryPointer,
};
use tsoracle_tests::node::CONNECT_TIMEOUT;
use tsoracle_tests::seqlease::{lease_rows, peek, seq, seq_totals, LeaseRow};
use tsoracle_tests::tso::{self, durable_high_water, status, tso_next, tso_seed, TsoStatus};
use tsoracle_tests::{
    expect_sqlstate, now_ms, ops, pg_error_string, physical, serving_node, DenseHistory, Endpoint,
    History, Load, LoadOptions, Node, NodeOpts, StopMode,
};

const HOUR_MS: i64 = 3_600_000;
/// Rows of the source's table: its restore takes seconds (COPY, then the primary key).
const BIG_ROWS: i64 = 2_000_000;
/// The source's lease outlives the whole test (the lease TTL maximum is raised to allow it).
const SOURCE_LEASE_TTL_MS: i32 = 1_800_000;
const SOURCE_KEYS: [(&str, i32, i32); 2] = [("orders", 100, 3), ("invoices", 7, 1)];
const LOAD_KEYS: [&str; 3] = ["k0", "k1", "k2"];

// ============================================================================ helpers

/// The durable state a dump carries: high-water, counters, leases.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DurableState {
    high_water_ms: i64,
    counters: BTreeMap<String, i64>,
    leases: BTreeMap<i64, LeaseRow>,
}

#[track_caller]
fn durable_state(c: &mut Client) -> DurableState {
    DurableState {
        high_water_ms: durable_high_water(c)
            .unwrap_or_else(|e| panic!("durable high-water: {}", pg_error_string(&e)))
            .expect("a high-water row"),
        counters: seq_totals(c).unwrap_or_else(|e| panic!("tsoracle.seq: {}", pg_error_string(&e))),
        leases: lease_rows(c),
    }
}

#[track_caller]
fn status_of(c: &mut Client) -> TsoStatus {
    status(c).unwrap_or_else(|e| panic!("tso_status(): {}", pg_error_string(&e)))
}

#[track_caller]
fn next_of(c: &mut Client, what: &str) -> i64 {
    tso_next(c).unwrap_or_else(|e| panic!("{what}: tso_next(): {}", pg_error_string(&e)))
}

#[track_caller]
fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e))).get(0)
}

#[track_caller]
fn one_text(c: &mut Client, sql: &str) -> String {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e))).get(0)
}

/// What the extension is made of, one line per object, comparable between clusters: every
/// member function (its full definition and privileges), every member table's columns
/// (name, type, nullability, default), constraints, triggers and privileges, and the other
/// members by identity. Names, never OIDs; sorted.
fn extension_schema(c: &mut Client) -> Vec<String> {
    let sql = "\
        WITH m AS (
            SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
              JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
             WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'
               AND e.extname = 'tsoracle')
        SELECT 'function ' || pg_catalog.pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '-')
          FROM m JOIN pg_catalog.pg_proc p ON m.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = m.objid
        UNION ALL
        SELECT 'table ' || r.oid::regclass::text || ' acl ' || coalesce(r.relacl::text, '-')
          FROM m JOIN pg_catalog.pg_class r ON m.classid = 'pg_catalog.pg_class'::regclass AND r.oid = m.objid
        UNION ALL
        SELECT 'column ' || a.attrelid::regclass::text || '.' || a.attname || ' '
               || pg_catalog.format_type(a.atttypid, a.atttypmod) || (CASE WHEN a.attnotnull THEN ' not null' ELSE '' END)
               || coalesce(' default ' || pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), '')
          FROM m JOIN pg_catalog.pg_attribute a ON m.classid = 'pg_catalog.pg_class'::regclass AND a.attrelid = m.objid
          LEFT JOIN pg_catalog.pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT 'constraint ' || co.conrelid::regclass::text || ' ' || co.conname || ' ' || pg_catalog.pg_get_constraintdef(co.oid)
          FROM m JOIN pg_catalog.pg_constraint co ON m.classid = 'pg_catalog.pg_class'::regclass AND co.conrelid = m.objid
        UNION ALL
        SELECT 'trigger ' || pg_catalog.pg_get_triggerdef(t.oid) || ' fires ' || t.tgenabled::text
          FROM m JOIN pg_catalog.pg_trigger t ON m.classid = 'pg_catalog.pg_class'::regclass AND t.tgrelid = m.objid
         WHERE NOT t.tgisinternal
        UNION ALL
        SELECT 'member ' || pg_catalog.pg_describe_object(m.classid, m.objid, 0)
          FROM m WHERE m.classid NOT IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_class'::regclass)
        ORDER BY 1";
    c.query(sql, &[])
        .unwrap_or_else(|e| panic!("the extension's schema: {}", pg_error_string(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `tso_next()` on `c`, recorded in `history` like a load's call.
#[track_caller]
fn recorded_next(c: &mut Client, history: &History, node: &str, what: &str) -> i64 {
    let start = Instant::now();
    let v = next_of(c, what);
    history.record_ok(start, Instant::now(), node, v, 1);
    v
}

/// The lease `expected` must be in `tsoracle.lease` unchanged, live, counted in
/// `live_leases`, and holding `tso_safe_frontier()` at or below its bound (the worker knows
/// it, not only the table).
#[track_caller]
fn assert_lease_kept(c: &mut Client, expected: &LeaseRow, what: &str) {
    let rows = lease_rows(c);
    let row = rows.get(&expected.id).unwrap_or_else(|| {
        panic!("{what}: lease {} is missing from tsoracle.lease: {rows:?}", expected.id)
    });
    assert_eq!(row, expected, "{what}: the lease row changed");
    assert!(
        expected.expires > now_ms() + 5_000,
        "{what}: the test ran too long: lease {expected:?} is about to expire"
    );
    let frontier = one_i64(c, "SELECT tso_safe_frontier()");
    assert!(
        frontier <= expected.bound,
        "{what}: tso_safe_frontier() = {frontier} is above the bound {} of the live lease {}: the oracle does not hold it",
        expected.bound,
        expected.id
    );
    let live = one_i64(c, "SELECT live_leases FROM tso_status()");
    assert!(live >= 1, "{what}: tso_status().live_leases = {live} with lease {} live", expected.id);
}

/// Wait (bounded) until `tso_status().state` is `state`; returns the status.
#[track_caller]
fn wait_state(c: &mut Client, state: &str, what: &str) -> TsoStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status_of(c);
        if st.state == state {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: tso_status().state is not {state:?} after 30 s: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ============================================================================ 1: logical restores

/// The source of every logical restore: its dumps and the state they hold.
struct Dumps {
    _dir: PgDir,
    state: DurableState,
    lease: LeaseRow,
    plain: PathBuf,
    custom: PathBuf,
    directory: PathBuf,
}

/// Build the source cluster (see the module documentation), dump it in each format, check
/// that every dump holds the same state, stop it.
fn make_dumps() -> Dumps {
    let mut node = Node::start_new(
        "dump-source",
        NodeOpts::new().setting("tsoracle.lease_ttl_max_ms", SOURCE_LEASE_TTL_MS),
    )
    .expect("start the source");
    node.create_extension().unwrap_or_else(|e| panic!("source: CREATE EXTENSION: {e}"));
    let mut c = node.connect();
    let t = Instant::now();
    c.batch_execute(&format!(
        "CREATE TABLE big (id bigint NOT NULL, payload text NOT NULL);
         INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, {BIG_ROWS}) g;
         ALTER TABLE big ADD PRIMARY KEY (id);
         CHECKPOINT;"
    ))
    .unwrap_or_else(|e| panic!("source: fill the table: {}", pg_error_string(&e)));
    eprintln!("source: {BIG_ROWS} rows in {:.1} s", t.elapsed().as_secs_f64());

    let seed = now_ms() + HOUR_MS;
    tso_seed(&mut c, seed).unwrap_or_else(|e| panic!("source: tso_seed: {}", pg_error_string(&e)));
    let v = next_of(&mut c, "source");
    assert!(physical(v) >= seed, "source: tso_next() {v} below the seed {seed}");
    for (key, count, calls) in SOURCE_KEYS {
        for _ in 0..calls {
            seq(&mut c, key, count)
                .unwrap_or_else(|e| panic!("source: tso_seq({key}): {}", pg_error_string(&e)));
        }
    }
    c.batch_execute("CREATE ROLE indexer LOGIN; GRANT tsoracle_lease_holder TO indexer;").unwrap();
    let mut holder = node.connect_as("indexer");
    let lease_id: i64 = holder
        .query_one(
            "SELECT lease_id FROM tso_lease_acquire('indexer-7', 1, $1)",
            &[&SOURCE_LEASE_TTL_MS],
        )
        .unwrap_or_else(|e| panic!("source: tso_lease_acquire: {}", pg_error_string(&e)))
        .get(0);
    drop(holder);

    let state = durable_state(&mut c);
    for (key, count, calls) in SOURCE_KEYS {
        assert_eq!(
            state.counters.get(key),
            Some(&((count * calls) as i64)),
            "source counters: {state:?}"
        );
    }
    let lease = state
        .leases
        .get(&lease_id)
        .cloned()
        .unwrap_or_else(|| panic!("source: lease {lease_id} not in {state:?}"));
    assert!(state.high_water_ms >= lease.bound && lease.bound > seed, "source: {state:?}");

    let dir = PgDir::new("dumps").expect("dump directory");
    let t = Instant::now();
    let plain = pg_dump(&node, "postgres", DumpFormat::Plain, &dir)
        .unwrap_or_else(|e| panic!("pg_dump -Fp: {e}"));
    let custom = pg_dump(&node, "postgres", DumpFormat::Custom, &dir)
        .unwrap_or_else(|e| panic!("pg_dump -Fc: {e}"));
    let directory = pg_dump(&node, "postgres", DumpFormat::Directory, &dir)
        .unwrap_or_else(|e| panic!("pg_dump -Fd: {e}"));
    eprintln!("source: three dumps in {:.1} s", t.elapsed().as_secs_f64());
    // The clock is an hour behind the high-water and nothing was called: every dump holds
    // this same state.
    let after = durable_state(&mut c);
    assert_eq!(after, state, "the source's state moved while it was dumped");
    drop(c);
    node.stop(StopMode::Fast).expect("stop the source");
    Dumps { _dir: dir, state, lease, plain, custom, directory }
}

/// The ways a dump is restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `psql -v ON_ERROR_STOP=1 -f dump.sql` into `postgres`.
    Psql,
    /// The same with `--single-transaction`.
    PsqlSingleTransaction,
    /// `createdb restored; pg_restore --exit-on-error -d restored dump.custom`, with
    /// `tsoracle.database = 'restored'`.
    PgRestoreCustom,
    /// `pg_restore --exit-on-error -d postgres dump.dir`.
    PgRestoreDirectory,
    /// The same with `-j 4`.
    PgRestoreParallel,
    /// `psql -v ON_ERROR_STOP=1 -f dump.sql` into a cluster that already serves with its
    /// high-water seeded two hours ahead.
    PsqlOverHigherHighWater,
}

impl Form {
    const ALL: [Form; 6] = [
        Form::Psql,
        Form::PsqlSingleTransaction,
        Form::PgRestoreCustom,
        Form::PgRestoreDirectory,
        Form::PgRestoreParallel,
        Form::PsqlOverHigherHighWater,
    ];

    fn label(self) -> &'static str {
        match self {
            Form::Psql => "psql-f",
            Form::PsqlSingleTransaction => "psql-single-transaction",
            Form::PgRestoreCustom => "pg_restore-Fc",
            Form::PgRestoreDirectory => "pg_restore-Fd",
            Form::PgRestoreParallel => "pg_restore-Fd-j4",
            Form::PsqlOverHigherHighWater => "psql-f-over-higher-target",
        }
    }

    fn database(self) -> &'static str {
        match self {
            Form::PgRestoreCustom => "restored",
            _ => "postgres",
        }
    }
}

/// Restore the dumps one way into a fresh cluster and check every guarantee, then again after
/// a restart of the restored cluster.
fn restore_and_check(dumps: &Dumps, form: Form) {
    let label = form.label();
    let db = form.database();
    let mut opts = NodeOpts::new();
    if db != "postgres" {
        opts = opts.setting("tsoracle.database", db);
    }
    let mut node = Node::start_new(label, opts).expect("start the target");
    // Roles first, as `pg_dumpall --globals-only` would bring them: a database's dump does
    // not carry them (the lease's holder role owns its row).
    node.connect().batch_execute("CREATE ROLE indexer LOGIN").expect("CREATE ROLE indexer");

    // Nothing the target issues after the restore may be at or below `floor`.
    let mut floor = dumps.state.high_water_ms;
    if form == Form::PsqlOverHigherHighWater {
        node.create_extension()
            .unwrap_or_else(|e| panic!("{label}: CREATE EXTENSION on the target: {e}"));
        let mut c = node.connect();
        tso_seed(&mut c, now_ms() + 2 * HOUR_MS)
            .unwrap_or_else(|e| panic!("{label}: tso_seed: {}", pg_error_string(&e)));
        let own = durable_high_water(&mut c).unwrap().expect("a high-water row");
        assert!(
            own > floor,
            "{label}: the target's own high-water {own} is not above the dumped {floor}"
        );
        floor = own;
    }
    if db != "postgres" {
        createdb(&node, db).unwrap_or_else(|e| panic!("{label}: {e}"));
    }

    let history = History::new();
    let prober = Prober::start(
        Endpoint::fixed(label, &node.conninfo_for("postgres", db)),
        history.clone(),
        Duration::from_millis(5),
    );
    let started = Instant::now();
    let result = match form {
        Form::Psql | Form::PsqlOverHigherHighWater => psql_file(&node, db, &dumps.plain, false),
        Form::PsqlSingleTransaction => psql_file(&node, db, &dumps.plain, true),
        Form::PgRestoreCustom => pg_restore(&node, db, &dumps.custom, 1),
        Form::PgRestoreDirectory => pg_restore(&node, db, &dumps.directory, 1),
        Form::PgRestoreParallel => pg_restore(&node, db, &dumps.directory, 4),
    };
    let restored = Instant::now();
    if let Err(e) = result {
        panic!("{label}: the restore failed after {:.1} s: {e}", started.elapsed().as_secs_f64());
    }
    eprintln!("{label}: restored in {:.1} s", (restored - started).as_secs_f64());

    let mut c = node
        .try_connect_as("postgres", db, CONNECT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{label}: connect to {db}: {e}"));
    tso::wait_serving(&mut c)
        .unwrap_or_else(|e| panic!("{label}: not serving after the restore: {e}"));
    let first = recorded_next(&mut c, &history, label, label);
    let stats = prober.stop_and_join();
    assert!(
        physical(first) > floor,
        "{label}: the first tso_next() after the restore, {first} (physical {}), is not above the high-water {floor}",
        physical(first)
    );
    // The worker was up during the restore: the oracle served while the dump was loading,
    // before its own state arrived (not inside one transaction, which hides everything).
    if form != Form::PsqlSingleTransaction {
        assert!(
            history.ok_calls_within(started, restored) > 0,
            "{label}: the prober got no timestamp while the restore ran ({stats:?})"
        );
    }
    for call in history.calls().iter().filter(|c| c.is_ok() && c.start >= restored) {
        assert!(
            physical(call.first().unwrap()) > floor,
            "{label}: {call:?} issued at or below {floor} after the restore"
        );
    }

    let expected: BTreeMap<String, i64> = dumps.state.counters.clone();
    for (key, next) in &expected {
        let got = seq(&mut c, key, 1)
            .unwrap_or_else(|e| panic!("{label}: tso_seq({key}): {}", pg_error_string(&e)));
        assert_eq!(got, *next, "{label}: tso_seq({key:?}, 1) does not continue at the dumped next");
    }
    assert_lease_kept(&mut c, &dumps.lease, &format!("{label}, after the restore"));
    let durable = durable_high_water(&mut c).unwrap().unwrap_or(0);
    assert!(
        durable >= floor,
        "{label}: durable high-water {durable} below {floor} after the restore"
    );
    drop(c);

    node.restart(StopMode::Fast).unwrap_or_else(|e| panic!("{label}: restart: {e}"));
    let mut c = node.try_connect_as("postgres", db, CONNECT_TIMEOUT).unwrap();
    tso::wait_serving(&mut c)
        .unwrap_or_else(|e| panic!("{label}: not serving after the restart: {e}"));
    let issued_before = history.max_value().expect("timestamps issued before the restart");
    let again = recorded_next(&mut c, &history, label, label);
    assert!(
        physical(again) > floor && again > issued_before,
        "{label}: the first tso_next() after the restart, {again}, is not above the high-water {floor} and {issued_before} issued before"
    );
    for (key, next) in &expected {
        let got = seq(&mut c, key, 1)
            .unwrap_or_else(|e| panic!("{label}: tso_seq({key}): {}", pg_error_string(&e)));
        assert_eq!(got, next + 1, "{label}: tso_seq({key:?}, 1) after the restart");
    }
    assert_lease_kept(&mut c, &dumps.lease, &format!("{label}, after a restart"));
    let report = history.check().unwrap_or_else(|v| panic!("{label}: {v}"));
    eprintln!(
        "{label}: ok; first {first} (physical {} > {floor}), {} prober calls ({} ok), after the restart {again}",
        physical(first),
        report.calls,
        report.ok_calls
    );
}

/// Every logical restore form, from one source, each into its own cluster (see the module
/// documentation). Each form must restore without an error (`ON_ERROR_STOP`,
/// `--exit-on-error`) while the target's worker is up; afterwards, and again after a restart
/// of the restored cluster: the first `tso_next()` has physical ms above the dumped
/// high-water (or the target's own, if higher), `tso_seq(key, 1)` continues at the dumped
/// `next`, the lease is in `tsoracle.lease` unchanged and holds `tso_safe_frontier()`, and
/// the prober's history (which spans the restore) is unique and real-time ordered. Every
/// form is run; the test fails at the end with the forms that failed.
#[test]
fn logical_restores_keep_the_high_water_counters_and_leases() {
    let t = Instant::now();
    let dumps = make_dumps();
    let mut failures = Vec::new();
    for form in Form::ALL {
        let t_form = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| restore_and_check(&dumps, form)));
        eprintln!("{}: {:.1} s", form.label(), t_form.elapsed().as_secs_f64());
        if let Err(panic) = outcome {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            // The first line, and the error lines of a failed command's output.
            let mut lines = msg.lines();
            let head = lines.next().unwrap_or_default().chars().take(300).collect::<String>();
            let errors: Vec<&str> =
                lines.filter(|l| l.contains("ERROR") || l.contains("error:")).take(4).collect();
            failures.push(format!("{}: {head} | {}", form.label(), errors.join(" | ")));
        }
    }
    eprintln!("logical restores: {:.1} s in all", t.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{} of {} restore forms failed:\n{}",
        failures.len(),
        Form::ALL.len(),
        failures.join("\n")
    );
}

// ============================================================================ 2: point-in-time recovery

/// A primary archiving its WAL, a base backup taken before any load, a mixed load (timestamps
/// and sequences, 8 sessions), the target noted in the middle of it, then an archive recovery
/// of the base backup to `target` (see the module documentation). Checks shared by both
/// cases: the restored server ends recovery, serves on a new timeline with the epoch equal
/// to it, its first timestamp is above every value issued by a call that ended before the
/// target was noted, and its counters continue at or above every block granted before it.
fn pitr(label: &str, to_target_time: bool) {
    let archive = WalArchive::new(&format!("{label}-archive")).expect("archive directory");
    let mut primary =
        Node::start_new(&format!("{label}-primary"), archive.archiving(NodeOpts::new()))
            .expect("start the primary");
    primary.create_extension().unwrap_or_else(|e| panic!("{label}: CREATE EXTENSION: {e}"));
    let mut c = primary.connect();
    let (ts, dense) = (History::new(), DenseHistory::new());
    for key in LOAD_KEYS {
        let start = Instant::now();
        let first = seq(&mut c, key, 10).unwrap();
        dense.record_ok(start, Instant::now(), primary.name(), key, first, 10);
    }
    let mut restored =
        Node::base_backup_from(&primary, &format!("{label}-restored")).expect("pg_basebackup");

    let load = MixedLoad::start(
        PrimaryPointer::new(&primary),
        MixedLoadOptions {
            threads: 8,
            duration: Duration::from_secs(120),
            seq_keys: LOAD_KEYS.iter().map(|k| k.to_string()).collect(),
            ..Default::default()
        },
        ts.clone(),
        dense.clone(),
    );
    let t0 = Instant::now();
    ts.wait_progress(t0, 2_000, &format!("{label}: load before the target"));
    // At least one window extension (window_ahead_ms = 3000 extends every ~1.5 s) in each half.
    std::thread::sleep(Duration::from_millis(1_600));
    let noted = Instant::now();
    let target_time = one_text(&mut c, "SELECT clock_timestamp()::text");
    std::thread::sleep(Duration::from_millis(1_600));
    ts.wait_progress(noted, 2_000, &format!("{label}: load after the target"));
    // A key created after the target: a recovery that stops at the target must not have it.
    assert_eq!(seq(&mut c, "after-target", 1).unwrap(), 0);
    let stats = load.stop_and_join();
    let finals: BTreeMap<String, i64> = LOAD_KEYS
        .iter()
        .chain(["after-target"].iter())
        .map(|k| (k.to_string(), peek(&mut c, k).unwrap().expect("a counter")))
        .collect();
    let issued_max = ts.max_value().expect("the load issued timestamps");
    let before_max = ts
        .calls()
        .iter()
        .filter(|c| c.is_ok() && c.end < noted)
        .filter_map(|c| c.last())
        .max()
        .expect("timestamps issued before the target");
    let report = ts.check().unwrap_or_else(|v| panic!("{label}: the primary's history: {v}"));
    let loaded: BTreeMap<String, i64> =
        LOAD_KEYS.iter().map(|k| (k.to_string(), finals[*k])).collect();
    dense
        .check(Some(&loaded))
        .unwrap_or_else(|v| panic!("{label}: the primary's sequence history: {v}"));
    let segment = switch_and_archive(&primary).unwrap_or_else(|e| panic!("{label}: {e}"));
    drop(c);
    primary.stop(StopMode::Fast).unwrap();
    eprintln!(
        "{label}: load {} calls ({} ok) {stats:?}; target {target_time}; archived through {segment} ({} files)",
        report.calls,
        report.ok_calls,
        archive.files().len()
    );

    let target = if to_target_time {
        RecoveryTarget::Time(target_time.clone())
    } else {
        RecoveryTarget::EndOfWal
    };
    prepare_archive_recovery(&mut restored, &archive, &target)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    restored.start().unwrap_or_else(|e| panic!("{label}: start the archive recovery: {e}"));
    let took = wait_recovery_end(&restored).unwrap_or_else(|e| panic!("{label}: {e}"));
    restored.wait_serving().unwrap_or_else(|e| panic!("{label}: restored server not serving: {e}"));
    let mut r = restored.connect();
    let st = status_of(&mut r);
    let first = next_of(&mut r, label);
    eprintln!(
        "{label}: recovery ended {:.1} s after start; {st:?}; first {first}",
        took.as_secs_f64()
    );

    assert_eq!((st.role.as_str(), st.state.as_str()), ("primary", "serving"), "{label}: {st:?}");
    let timeline = st.timeline.unwrap_or(0);
    assert!(
        timeline > 1,
        "{label}: the restored server serves on timeline {timeline}, not a new one: {st:?}"
    );
    assert_eq!(st.epoch, Some(timeline), "{label}: the epoch is not the new timeline: {st:?}");
    assert!(
        first > before_max,
        "{label}: first timestamp {first} (physical {}) of the restored server is not above {before_max} (physical {}), issued before the target",
        physical(first),
        physical(before_max)
    );
    let before_blocks: BTreeMap<String, i64> = LOAD_KEYS
        .iter()
        .map(|k| {
            let end = dense
                .calls()
                .iter()
                .filter(|c| c.key == *k && c.end < noted)
                .filter_map(|c| c.result.as_ref().ok().map(|s| s + c.count))
                .max()
                .unwrap_or(10);
            (k.to_string(), end)
        })
        .collect();
    let mut restored_next = BTreeMap::new();
    for key in LOAD_KEYS {
        let got = seq(&mut r, key, 1)
            .unwrap_or_else(|e| panic!("{label}: tso_seq({key}): {}", pg_error_string(&e)));
        assert!(
            got >= before_blocks[key],
            "{label}: tso_seq({key:?}) on the restored server gave {got}, inside blocks granted before the target (up to {})",
            before_blocks[key]
        );
        restored_next.insert(key, got);
    }
    let after_target = peek(&mut r, "after-target").unwrap();
    if to_target_time {
        assert_eq!(after_target, None, "{label}: the recovery replayed past the target");
    } else {
        assert!(
            first > issued_max,
            "{label}: first timestamp {first} (physical {}) of the restored server is not above {issued_max} (physical {}), the last the original issued",
            physical(first),
            physical(issued_max)
        );
        assert_eq!(
            after_target,
            Some(1),
            "{label}: the recovery did not replay to the end of the archive"
        );
        for key in LOAD_KEYS {
            assert_eq!(
                restored_next[key], finals[key],
                "{label}: tso_seq({key:?}) after replaying all of the archive"
            );
        }
    }
    // It goes on like any primary.
    assert!(next_of(&mut r, label) > first);
}

/// PITR to a `recovery_target_time` noted in the middle of the load, promoted there: a new
/// timeline, the epoch equal to it, the first timestamp above everything issued before the
/// target, counters at or above every block granted before it, and nothing after the target
/// replayed.
#[test]
fn pitr_to_a_target_time_serves_above_everything_before_it() {
    pitr("pitr-time", true);
}

/// PITR to the end of the archive (all of the original's WAL, after `pg_switch_wal()`): a new
/// timeline, the epoch equal to it, the first timestamp above everything the original issued,
/// and every counter exactly where the original left it.
#[test]
fn pitr_to_the_end_of_the_archive_serves_above_everything_issued() {
    pitr("pitr-end", false);
}

// ============================================================================ 3: upgrade

/// The version of the installed build (Cargo.toml of the extension).
const CURRENT_VERSION: &str = "0.6.0";

/// `CREATE EXTENSION tsoracle VERSION '<from>'` under the current library (default version
/// [`CURRENT_VERSION`]), which refuses the older schema (`outdated_schema`, 57P03); state put
/// into the old tables by hand (a high-water an hour ahead, two counters, a live lease); a
/// synchronous standby; 16 sessions calling `tso_next()`/`tso_next_batch()`; then
/// `ALTER EXTENSION tsoracle UPDATE`, which walks the upgrade chain from there. Serving
/// resumes without a restart; the history has no duplicate and no real-time-order
/// violation; every timestamp is above the seeded high-water; the counters continue; the
/// lease keeps its id and bound (and holds the frontier); the standby replays the update and
/// shows the high-water; the updated extension has exactly the objects of a fresh one.
#[test]
fn alter_extension_update_from_0_1_0_under_load_keeps_every_guarantee() {
    update_under_load("0.1.0");
}

/// The same from the previous release: the last step of the chain on its own.
#[test]
fn alter_extension_update_from_0_5_0_under_load_keeps_every_guarantee() {
    update_under_load("0.5.0");
}

fn update_under_load(from: &str) {
    let name = |role: &str| format!("upgrade-{}-{role}", from.replace('.', ""));
    let mut primary =
        Node::start_new(&name("primary"), NodeOpts::new()).expect("start the primary");
    let mut c = primary.connect();
    let versions: Vec<String> = c
        .query("SELECT version FROM pg_available_extension_versions WHERE name = 'tsoracle' ORDER BY version", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let default = one_text(&mut c, "SELECT coalesce((SELECT default_version FROM pg_available_extensions WHERE name = 'tsoracle'), 'none')");
    assert!(
        versions.iter().any(|v| v == from) && default == CURRENT_VERSION,
        "the installed build must offer {from} and default to {CURRENT_VERSION}; it offers {versions:?}, default {default}"
    );

    c.batch_execute(&format!("CREATE EXTENSION tsoracle VERSION '{from}'"))
        .unwrap_or_else(|e| panic!("{}", pg_error_string(&e)));
    assert_eq!(
        one_text(&mut c, "SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'"),
        from
    );
    let st = wait_state(&mut c, "outdated_schema", "the current library over the old schema");
    expect_sqlstate(
        tso_next(&mut c),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_next() over the old schema",
    );
    if from == "0.5.0" {
        // Its tso_fleet_status() has the old columns: refused rather than mis-filled.
        expect_sqlstate(
            c.query("SELECT * FROM tso_fleet_status()", &[]),
            &SqlState::CANNOT_CONNECT_NOW,
            "tso_fleet_status() over the old schema",
        );
    }
    eprintln!("{from} schema: {st:?}");

    let seeded = now_ms() + HOUR_MS;
    let lease = LeaseRow {
        id: seeded - 1_000,
        holder: "keeper".into(),
        holder_epoch: 1,
        bound: seeded - 1_000,
        expires: now_ms() + 240_000,
        ttl: 240_000,
        superseded: false,
    };
    c.execute(
        "INSERT INTO tsoracle.high_water (id, physical_ms, epoch) VALUES (true, $1, 1)",
        &[&seeded],
    )
    .unwrap();
    c.batch_execute(
        "INSERT INTO tsoracle.seq (key, next) VALUES ('orders', 1000), ('invoices', 77)",
    )
    .unwrap();
    c.execute(
        "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[&lease.id, &lease.holder, &lease.holder_epoch, &lease.bound, &lease.expires, &lease.ttl],
    )
    .unwrap();

    let mut standby = Node::base_backup_from(&primary, &name("standby")).expect("pg_basebackup");
    standby.start().expect("start the standby");
    make_sync(&mut primary, standby.name()).unwrap_or_else(|e| panic!("synchronous standby: {e}"));
    let started_at = one_text(&mut c, "SELECT pg_postmaster_start_time()::text");

    let history = History::new();
    let load = Load::start(
        vec![primary.endpoint()],
        LoadOptions::new(16, Duration::from_secs(120)),
        ops::mixed(64),
        history.clone(),
    );
    // A call that finds nothing served waits up to tsoracle.extension_timeout_ms (5 s) for
    // the worker before its 57P03.
    let deadline = Instant::now() + Duration::from_secs(30);
    while history.len() < 16 {
        assert!(Instant::now() < deadline, "the load made {} calls in 30 s", history.len());
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = history.calls();
    assert!(
        !before.is_empty()
            && before.iter().all(|c| c.result.as_ref().is_err_and(|e| e.contains("57P03"))),
        "before the update every call must fail with 57P03: {:?}",
        before.iter().find(
            |c| c.result.as_ref().is_ok() || !c.result.as_ref().unwrap_err().contains("57P03")
        )
    );

    let updated = Instant::now();
    c.batch_execute("ALTER EXTENSION tsoracle UPDATE")
        .unwrap_or_else(|e| panic!("ALTER EXTENSION tsoracle UPDATE: {}", pg_error_string(&e)));
    eprintln!("ALTER EXTENSION UPDATE took {:.0} ms", updated.elapsed().as_secs_f64() * 1e3);
    history.wait_progress(updated, 2_000, "serving after ALTER EXTENSION UPDATE");
    let stats = load.stop_and_join();
    let first_ok =
        history.calls().iter().filter(|c| c.is_ok()).map(|c| c.end).min().expect("ok calls");
    eprintln!(
        "first timestamp returned {:.0} ms after the update began; load {stats:?}",
        first_ok.saturating_duration_since(updated).as_secs_f64() * 1e3
    );

    let report = history.assert_valid();
    let lowest = report.min_value.expect("values");
    assert!(
        physical(lowest) > seeded,
        "a timestamp {lowest} (physical {}) at or below the high-water {seeded} kept from {from}",
        physical(lowest)
    );
    assert_eq!(
        one_text(&mut c, "SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'"),
        CURRENT_VERSION
    );
    // The update script and the install script define the same objects twice: what the
    // update leaves must be exactly what a fresh CREATE EXTENSION makes.
    {
        let fresh = serving_node(&name("fresh"), NodeOpts::new());
        let want = extension_schema(&mut fresh.connect());
        let got = extension_schema(&mut c);
        let missing: Vec<&String> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<&String> = got.iter().filter(|l| !want.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty() && want.len() > 20,
            "{from} updated to {CURRENT_VERSION} differs from a fresh {CURRENT_VERSION} ({} objects): missing {missing:#?}, extra {extra:#?}",
            want.len()
        );
    }
    assert_eq!(
        one_text(&mut c, "SELECT pg_postmaster_start_time()::text"),
        started_at,
        "the server was restarted"
    );
    assert_eq!(
        seq(&mut c, "orders", 1).unwrap(),
        1000,
        "tso_seq('orders') continues at the {from} counter"
    );
    assert_eq!(
        seq(&mut c, "invoices", 3).unwrap(),
        77,
        "tso_seq('invoices') continues at the {from} counter"
    );
    assert_lease_kept(&mut c, &lease, "after the update");
    let same: (i64, i64) = c
        .query_one(
            "SELECT lease_id, ts_upper_bound FROM tso_lease_acquire('keeper', 1, 240000)",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap_or_else(|e| panic!("tso_lease_acquire('keeper', 1): {}", pg_error_string(&e)));
    assert_eq!(
        same,
        (lease.id, lease.bound),
        "the same holder and epoch get the {from} lease back"
    );

    let st = status_of(&mut c);
    let high_water = st.high_water_ms.expect("a serving primary has a high-water");
    assert!(high_water > seeded, "{st:?}");
    wait_replayed(&primary, &standby).unwrap_or_else(|e| panic!("{e}"));
    let mut s = standby.connect();
    let sst = status_of(&mut s);
    assert_eq!(sst.role, "standby", "{sst:?}");
    assert_eq!(
        sst.high_water_ms,
        Some(high_water),
        "the standby's tso_status() does not show the primary's high-water"
    );
    assert_eq!(
        one_text(&mut s, "SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'"),
        CURRENT_VERSION
    );
}

// ==================================================================== a member's dump

/// The largest `id` and `ts` of table `t` on `node`.
fn t_maxima(node: &Node) -> (i64, i64) {
    let r = node
        .connect()
        .query_one("SELECT max(id), max(ts) FROM t", &[])
        .expect("the table's maxima");
    (r.get(0), r.get(1))
}

/// One more row of `t` from `node`'s own `tso_seq('inv')` and `tso_next()`: its id and ts.
fn one_more_row(node: &Node) -> Result<(i64, i64), postgres::Error> {
    let r = node.connect().query_one(
        "INSERT INTO t (id, ts) VALUES (tso_seq('inv'), tso_next()) RETURNING id, ts",
        &[],
    )?;
    Ok((r.get(0), r.get(1)))
}

/// A member's dump (docs/operations/backups.md, "A member of a fleet", run from the page):
/// a member hands out `tso_seq('inv')` values 0 to 102 and 103 timestamps into table `t`, and
/// is dumped. Restored into another member of the same oracle, it goes on above them at once;
/// restored into a cluster on its own, it refuses every call (`55000`, a HINT naming the
/// runbook to leave a fleet) until that runbook's steps 2 and 3 run on it, then goes on
/// above them: in both, the next `INSERT` into `t` finds no collision, and no value of
/// `tso_seq` or `tso_next` is at or below one the dump holds.
#[test]
fn a_members_dump_restored_elsewhere_never_hands_out_its_values_again() {
    use tsoracle_tests::fleet::{admit_members, member, member_opts, oracle_conninfo, MEMBER_ROLE};
    use tsoracle_tests::runbook::{run_sh_in, vars, Runbook, LEAVE_STEPS, MEMBER_BACKUP_STEPS};

    let oracle = serving_node("bk-m-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let source = member("bk-m-member", &conninfo);
    source
        .connect()
        .batch_execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, ts bigint NOT NULL UNIQUE); \
             INSERT INTO t SELECT tso_seq('inv'), tso_next() FROM generate_series(0, 102)",
        )
        .expect("a member's rows");
    let (max_id, max_ts) = t_maxima(&source);
    assert_eq!(max_id, 102);

    let page = Runbook::load("backups.md", "member-backup");
    page.expect_steps(MEMBER_BACKUP_STEPS);
    let leave = Runbook::load("fleet/leave.md", "leave");
    leave.expect_steps(LEAVE_STEPS);
    let dir = PgDir::new("member-dump").expect("dump directory");
    let run = |step: u32, v: &[(&str, String)]| {
        let block = page.step(step);
        run_sh_in(block, source.bin_dir(), v, Some(dir.path()))
            .unwrap_or_else(|e| panic!("backups.md member-backup step {step}: {e}\n{}", block.text))
    };
    run(1, &vars(&[("MEMBER", &source)]));

    // Into a member of the same oracle: it serves above the dump.
    let into_member =
        Node::start_new("bk-m-into-member", member_opts(&conninfo)).expect("a new member");
    run(2, &vars(&[("CLUSTER", &into_member)]));
    let (id, ts) =
        tsoracle_tests::poll_until("the restored member serves", Duration::from_secs(30), || {
            one_more_row(&into_member).ok()
        });
    assert!(
        id > max_id && ts > max_ts,
        "a restored member hands out ({id}, {ts}), the dump holds up to ({max_id}, {max_ts})"
    );
    assert_eq!(t_maxima(&into_member), (id, ts));

    // Into a cluster on its own: it has been a member, and serves nothing.
    let alone = Node::start_new("bk-m-alone", NodeOpts::new()).expect("a cluster on its own");
    run(2, &vars(&[("CLUSTER", &alone)]));
    for sql in ["SELECT tso_seq('inv')", "SELECT tso_next()"] {
        let e = tsoracle_tests::poll_until(
            "the restored cluster refuses",
            Duration::from_secs(30),
            || {
                let mut c = alone.connect();
                match c.query_one(sql, &[]) {
                    Ok(r) => {
                        let v: i64 = r.get(0);
                        let above = if sql.contains("seq") { max_id } else { max_ts };
                        assert!(
                            v > above,
                            "{sql} on the restored cluster: {v}, the dump holds up to {above}"
                        );
                        None
                    }
                    Err(e) => e
                        .as_db_error()
                        .is_some_and(|d| d.code() == &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
                        .then_some(e),
                }
            },
        );
        let text = pg_error_string(&e);
        assert!(text.contains("Leaving a fleet"), "{sql}: {text}");
    }
    expect_sqlstate(
        one_more_row(&alone),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "an INSERT on the restored cluster before it left the fleet",
    );
    // Steps 2 and 3 of leaving a fleet, as the page writes them.
    let v = vars(&[("CLUSTER", &alone), ("ORACLE", &oracle)]);
    for step in [2, 3] {
        tsoracle_tests::runbook::run_step(leave.step(step), &alone, &v);
    }
    let (id, ts) = tsoracle_tests::poll_until(
        "the restored cluster serves once it left the fleet",
        Duration::from_secs(30),
        || one_more_row(&alone).ok(),
    );
    assert!(
        id > max_id && ts > max_ts,
        "the restored cluster hands out ({id}, {ts}), the dump holds up to ({max_id}, {max_ts})"
    );
}
