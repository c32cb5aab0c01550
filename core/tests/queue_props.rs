//! The request queue against a model: many backends submit, give up and exit at random while
//! the worker takes and answers. Every caller gets exactly the answer made for its own call,
//! no call is taken twice, and no entry stays busy once its backend has gone.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use tsoracle_core::queue::{Entry, EntryBody, EntryState, Queue, QueueHeader, Ticket};

const BACKENDS: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Submit { backend: usize, n: usize },
    Take,
    AnswerAll,
    Collect { backend: usize },
    Abandon { backend: usize },
    Exit { backend: usize },
    WorkerRestart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..BACKENDS, 1usize..4).prop_map(|(backend, n)| Op::Submit { backend, n }),
        Just(Op::Take),
        Just(Op::AnswerAll),
        (0..BACKENDS).prop_map(|backend| Op::Collect { backend }),
        (0..BACKENDS).prop_map(|backend| Op::Abandon { backend }),
        (0..BACKENDS).prop_map(|backend| Op::Exit { backend }),
        Just(Op::WorkerRestart),
    ]
}

proptest! {
    #[test]
    fn callers_get_their_own_answers(ops in proptest::collection::vec(op(), 1..200)) {
        let mut header = QueueHeader::new();
        let mut entries = vec![Entry::default(); BACKENDS];
        let mut bodies = vec![EntryBody::<u64, u64>::default(); BACKENDS];
        let mut q = Queue::new(&mut header, &mut entries, &mut bodies);
        // What each backend is waiting for: its ticket and the request values it sent.
        let mut waiting: HashMap<usize, (Ticket, Vec<u64>)> = HashMap::new();
        let mut in_flight: Vec<(Ticket, Vec<u64>)> = Vec::new();
        let mut ever_taken: HashSet<Ticket> = HashSet::new();
        let mut next_value = 1u64;
        const UNKNOWN: u64 = u64::MAX;

        for op in ops {
            match op {
                Op::Submit { backend, n } => {
                    if waiting.contains_key(&backend) {
                        continue; // a backend makes one call at a time
                    }
                    let requests: Vec<u64> = (0..n as u64).map(|i| next_value + i).collect();
                    next_value += n as u64;
                    let t = q.submit(backend, &requests, backend + 100).unwrap();
                    waiting.insert(backend, (t, requests));
                }
                Op::Take => {
                    for (t, reqs) in q.take_pending() {
                        prop_assert!(ever_taken.insert(t), "a call was taken twice: {t:?}");
                        in_flight.push((t, reqs));
                    }
                }
                Op::AnswerAll => {
                    for (t, reqs) in in_flight.drain(..) {
                        // The answer to request v is v * 10: a caller can check it is its own.
                        let replies: Vec<u64> = reqs.iter().map(|v| v * 10).collect();
                        if let Some(w) = q.answer(t, &replies) {
                            prop_assert_eq!(w, t.index + 100, "woke the caller of the entry");
                        }
                    }
                }
                Op::Collect { backend } => {
                    if let Some((t, reqs)) = waiting.get(&backend).cloned() {
                        if let Some(replies) = q.take_replies(t) {
                            let mine: Vec<u64> = reqs.iter().map(|v| v * 10).collect();
                            prop_assert!(
                                replies == mine || replies.iter().all(|&r| r == UNKNOWN),
                                "backend {} got {:?}, expected {:?}", backend, replies, mine
                            );
                            waiting.remove(&backend);
                        }
                    }
                }
                Op::Abandon { backend } => {
                    if let Some((t, _)) = waiting.remove(&backend) {
                        q.abandon(t, |&r| r == UNKNOWN);
                    }
                }
                Op::Exit { backend } => {
                    waiting.remove(&backend);
                    q.release_entry(backend);
                }
                Op::WorkerRestart => {
                    in_flight.clear();
                    q.fail_taken(UNKNOWN);
                }
            }
        }
        // Everyone leaves, the worker finishes what it holds: nothing stays busy.
        for backend in 0..BACKENDS {
            q.release_entry(backend);
        }
        for (t, reqs) in in_flight.drain(..) {
            q.answer(t, &reqs);
        }
        q.fail_taken(UNKNOWN);
        prop_assert_eq!(q.busy_entries(), 0);
        for e in q.entries.iter() {
            prop_assert_eq!(e.state, EntryState::Free);
        }
    }
}
