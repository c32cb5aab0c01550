//! The lock-free window grants exactly what the allocator grants, for any sequence of
//! grants, extensions, re-fences and clock values.

use proptest::prelude::*;
use tsoracle_core::allocator::Allocator;
use tsoracle_core::window::AtomicWindow;

#[derive(Clone, Debug)]
enum Op {
    Grant { clock_step: i64, count: u32 },
    Extend { ahead: u64 },
    Refence { advance: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (-5i64..20, prop_oneof![1..=8u32, 100_000..=262_144u32, Just(0u32), Just(262_145u32)])
            .prop_map(|(clock_step, count)| Op::Grant { clock_step, count }),
        2 => (0..30u64).prop_map(|ahead| Op::Extend { ahead }),
        1 => (0..10u64).prop_map(|advance| Op::Refence { advance }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn window_agrees_with_the_allocator(ops in prop::collection::vec(op(), 1..150)) {
        let mut now: u64 = 1_000_000;
        let mut durable: u64 = now + 5;
        let mut epoch = 1;
        let mut alloc = Allocator::new();
        let window = AtomicWindow::new();
        alloc.become_leader(now, durable, epoch).unwrap();
        window.open(now, durable).unwrap();
        for op in ops {
            match op {
                Op::Grant { clock_step, count } => {
                    now = now.saturating_add_signed(clock_step);
                    let expected = alloc.try_grant(now, count);
                    let got = window.try_grant(now, count);
                    prop_assert_eq!(&got, &expected);
                    if expected.is_ok() {
                        prop_assert_eq!(window.last_issued(), alloc.last_issued());
                    }
                }
                Op::Extend { ahead } => {
                    let ext = alloc.prepare_window_extension(now, ahead).unwrap();
                    durable = durable.max(ext.requested_ms);
                    alloc.commit_window_extension(durable, ext.epoch).unwrap();
                    window.extend(durable);
                }
                Op::Refence { advance } => {
                    // The fence: floor above everything durable, at a new epoch.
                    let last = alloc.last_issued();
                    window.close();
                    prop_assert!(window.try_grant(now, 1).is_err());
                    let floor = (durable + 1).max(now);
                    durable = floor + advance;
                    epoch += 1;
                    alloc.become_leader(floor, durable, epoch).unwrap();
                    window.open(floor, durable).unwrap();
                    // The allocator forgets its last value at a new epoch; the window keeps
                    // it, but the floor is above it, so the next grants agree again.
                    prop_assert!(last.is_none_or(|l| l < tsoracle_core::timestamp::pack(floor, 0).unwrap()));
                }
            }
        }
    }
}
