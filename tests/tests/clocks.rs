//! Clocks: the wall clock of the whole server steps (the tests' build can offset it in every
//! process at one instant: feature `clock-fault`, `tsoracle.test_clock_offset_ms`) while 16
//! sessions take timestamps. No step sends a timestamp back, stops issuing, or lets the lead
//! over the clock grow beyond the documented rule (README "Clock steps"): at most
//! `tsoracle.max_lead_ms` above the reference clock, whose own lead over the wall clock only a
//! step back creates and which then shrinks by half of the elapsed time.
//!
//! Run with: `cargo test -p tsoracle-tests --test clocks -- --test-threads=2`

use std::time::{Duration, Instant};

use tsoracle_tests::tso::{clock, set_clock_offset, TsoClock};
use tsoracle_tests::{
    now_ms, ops, pg_error_string, physical, poll_until, serving_node, History, Load, LoadOptions,
    NodeOpts,
};

/// The longest the callers may go without an answer, in any phase.
const MAX_GAP: Duration = Duration::from_secs(2);

/// One phase of the run: the offset of the server's clock from real time, for how long.
struct Phase {
    name: &'static str,
    offset_ms: i64,
    length: Duration,
}

/// What a phase saw.
struct Seen {
    name: &'static str,
    from: Instant,
    to: Instant,
    samples: Vec<(Instant, TsoClock)>,
}

#[test]
fn clock_steps_never_send_timestamps_back_nor_stall() {
    let max_lead = 2_000i64;
    let node = serving_node(
        "clock-steps",
        NodeOpts::new()
            .setting("tsoracle.max_lead_ms", max_lead)
            .setting("tsoracle.extension_timeout_ms", 5_000),
    );
    let mut c = node.connect();
    let history = History::new();
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(16, Duration::from_secs(240)),
        ops::mixed_with_uuid(1000),
        history.clone(),
    );
    let phases = [
        Phase { name: "steady", offset_ms: 0, length: Duration::from_secs(5) },
        Phase { name: "back 60 s", offset_ms: -60_000, length: Duration::from_secs(5) },
        Phase { name: "forward 1 h", offset_ms: 3_600_000, length: Duration::from_secs(10) },
        Phase { name: "forward step corrected", offset_ms: 0, length: Duration::from_secs(5) },
        Phase {
            name: "back 10 x max_lead_ms",
            offset_ms: -10 * max_lead,
            length: Duration::from_secs(5),
        },
    ];
    history.wait_progress(Instant::now(), 50, "the load before the first phase");
    let mut seen: Vec<Seen> = Vec::new();
    let mut steps = clock(&mut c).expect("tso_clock()").steps();
    let mut offset = 0;
    for phase in &phases {
        if phase.offset_ms != offset {
            offset = phase.offset_ms;
            set_clock_offset(&mut c, phase.offset_ms)
                .unwrap_or_else(|e| panic!("{}: set the clock offset: {e}", phase.name));
            // The worker samples its clocks every tick: wait until it has seen the step and
            // serves again. A forward step closes the serve-until gate (its wall-clock
            // deadline is passed) until the worker's next confirmed commit, which it makes
            // at once; the phase's samples are taken from then on, and the stall check
            // below bounds what that one commit may cost.
            steps = poll_until(
                &format!("{}: the worker sees the step and serves", phase.name),
                Duration::from_secs(5),
                || {
                    let now = clock(&mut c).ok()?;
                    (now.steps() > steps && now.serve_left_ms.is_some_and(|l| l > 0))
                        .then_some(now.steps())
                },
            );
        }
        let from = Instant::now();
        let mut samples = Vec::new();
        while from.elapsed() < phase.length {
            let at = Instant::now();
            let sample =
                clock(&mut c).unwrap_or_else(|e| panic!("tso_clock(): {}", pg_error_string(&e)));
            samples.push((at, sample));
            std::thread::sleep(Duration::from_millis(200));
        }
        seen.push(Seen { name: phase.name, from, to: Instant::now(), samples });
    }
    let stats = load.stop_and_join();
    set_clock_offset(&mut c, 0).expect("reset the clock offset");

    let report = history
        .check()
        .unwrap_or_else(|v| panic!("timestamps went back or repeated: {v}\nload: {stats:?}"));
    assert_eq!(stats.err_calls, 0, "a call failed across the steps: {stats:?}");

    // No stall: in no phase do the callers go MAX_GAP without an answer (a worker that could
    // not serve after a step would stop them within window_ahead_ms). Throughput is printed,
    // not asserted: it measures the machine as much as the oracle.
    let rate =
        |s: &Seen| history.ok_calls_within(s.from, s.to) as f64 / (s.to - s.from).as_secs_f64();
    for s in &seen {
        let gap = history.longest_gap_within(s.from, s.to);
        eprintln!(
            "clock steps: {}: {:.0} calls/s, longest wait for an answer {gap:?}, {} clock samples",
            s.name,
            rate(s),
            s.samples.len()
        );
        assert!(gap <= MAX_GAP, "{}: no call answered for {gap:?}", s.name);
    }

    // The lead rule, at every sample: the last issued timestamp is at most max_lead_ms above
    // the reference clock (50 ms for the reads of one tso_clock() call not being one instant).
    for s in &seen {
        for (_, sample) in &s.samples {
            let (Some(issued), Some(reference)) = (sample.issued_lead_ms, sample.reference_lead_ms)
            else {
                panic!("{}: tso_clock() on a serving primary has NULLs: {sample:?}", s.name);
            };
            assert!(
                reference >= 0,
                "{}: the reference clock is behind the wall clock: {sample:?}",
                s.name
            );
            assert!(
                issued <= reference + max_lead + 50,
                "{}: a timestamp {issued} ms ahead of the clock, the rule allows {reference} + {max_lead}: {sample:?}",
                s.name
            );
            assert!(
                sample.serve_left_ms.is_some_and(|l| l > 0),
                "{}: not serving: {sample:?}",
                s.name
            );
        }
    }
    // Only a step back creates a lead of the reference clock, and then it shrinks by half of
    // the elapsed time (250 ms of slack: the worker samples its clocks every tick).
    let lead = |s: &Seen, i: usize| s.samples[i].1.reference_lead_ms.unwrap_or(0);
    let shrinks = |s: &Seen, expected_first: i64| {
        let first = lead(s, 0);
        assert!(
            (first - expected_first).abs() <= 1_000,
            "{}: the reference clock leads by {first} ms at the start, expected about {expected_first}",
            s.name
        );
        let last = s.samples.len() - 1;
        let elapsed = (s.samples[last].0 - s.samples[0].0).as_millis() as i64;
        let expected = (first - elapsed / 2).max(0);
        assert!(
            (lead(s, last) - expected).abs() <= 250,
            "{}: after {elapsed} ms the lead is {} ms, expected {expected} (from {first})",
            s.name,
            lead(s, last)
        );
    };
    assert!(seen[0].samples.iter().all(|(_, c)| c.reference_lead_ms == Some(0)), "steady: no lead");
    shrinks(&seen[1], 60_000);
    assert!(
        seen[2].samples.iter().all(|(_, c)| c.reference_lead_ms == Some(0)),
        "forward 1 h: a forward step is followed and adds no lead"
    );
    // Corrected, the forward step is a step back of an hour.
    shrinks(&seen[3], 3_600_000);
    shrinks(&seen[4], lead(&seen[3], seen[3].samples.len() - 1) + 10 * max_lead);

    // The values followed the forward step, and after its correction went on above it.
    let (lo, hi) = history.value_range_within(seen[2].from, seen[2].to).expect("forward values");
    let real_at_step = now_ms() - seen[2].from.elapsed().as_millis() as i64;
    assert!(
        physical(lo) >= real_at_step + 3_600_000 - 1_000,
        "forward 1 h: the values did not follow the clock ({lo}, physical {})",
        physical(lo)
    );
    let (after, _) = history.value_range_within(seen[3].from, seen[3].to).expect("values after");
    assert!(after > hi, "after the correction: {after} is not above {hi}");
    let c0 = clock(&mut c).expect("tso_clock() at the end");
    assert!(c0.steps_back >= 3 && c0.steps_forward >= 1, "the steps are counted: {c0:?}");
    assert!(
        node.log_contents().contains("the wall clock stepped back by"),
        "the worker logs the steps"
    );
    eprintln!("clock steps: {report:?}; load {stats:?}; at the end {c0:?}");
}
