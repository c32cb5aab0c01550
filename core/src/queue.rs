//! The request queue between callers and the worker, as a pure state machine.
//!
//! Vocabulary:
//! - an **entry** belongs to one backend: the extension indexes entries by the backend's
//!   PGPROC number, so there is exactly one entry per possible backend and no backend can
//!   take another's. The queue can therefore never be exhausted, whatever other roles do.
//! - a **call** fills its backend's entry with 1 to [`MAX_REQUESTS`] requests (one
//!   `tso_seq_batch()` is one call: all its requests commit or fail together).
//! - a **ticket** names one call: the entry index and the entry's **generation**, which changes
//!   every time the entry is filled. The worker answers by ticket, so a late answer for a
//!   caller that left can never land in the call of the entry's next user.
//!
//! States of an entry: `Free` → `Pending` (filled by its caller) → `Taken` (the worker took it
//! into a transaction) → `Done` (answered; the caller reads the replies) → `Free`. A caller
//! that leaves early (cancel, timeout, terminate, disconnect) turns `Pending` into `Free`
//! (nothing happened) and `Taken` into `Abandoned`: whatever the worker commits for it is
//! burnt (a gap), never given to anyone else; the worker's answer then frees the entry.
//!
//! The entries live in PostgreSQL shared memory, so they are plain `Copy` data; the waiter
//! is an opaque token (the extension stores the caller's latch address in it).

/// Most requests one call may carry (the entry's capacity).
pub const MAX_REQUESTS: usize = 64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryState {
    #[default]
    Free,
    Pending,
    Taken,
    Done,
    Abandoned,
}

/// A caller's handle on its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub index: usize,
    pub generation: u64,
}

/// What the worker scans of an entry: its state, small and kept apart from the requests and
/// replies (an [`EntryBody`] is kilobytes), so that looking for pending calls reads one
/// contiguous array and not one page per backend.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Entry {
    pub state: EntryState,
    pub generation: u64,
    len: usize,
    waiter: usize,
}

/// The requests and replies of an entry's call.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct EntryBody<R: Copy, P: Copy> {
    requests: [R; MAX_REQUESTS],
    replies: [P; MAX_REQUESTS],
}

impl<R: Copy + Default, P: Copy + Default> Default for EntryBody<R, P> {
    fn default() -> Self {
        EntryBody { requests: [R::default(); MAX_REQUESTS], replies: [P::default(); MAX_REQUESTS] }
    }
}

/// Counters kept beside the entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct QueueHeader {
    /// The next generation handed out; starts at 1 so that 0 never names a call.
    pub next_generation: u64,
    /// Group commits the worker made for calls, and the requests they carried.
    pub group_commits: u64,
    pub grouped_requests: u64,
    /// The worker will take the pending calls without being woken: a member's proxy with a
    /// round trip in flight takes them as it lands. A caller that queues a call meanwhile
    /// need not set the worker's latch (each wake-up costs both processes a system call).
    pub worker_will_look: bool,
}

impl QueueHeader {
    pub const fn new() -> Self {
        QueueHeader {
            next_generation: 1,
            group_commits: 0,
            grouped_requests: 0,
            worker_will_look: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("no request queue entry {index} (the queue has {len})")]
    NoSuchEntry { index: usize, len: usize },
    #[error("a call must carry 1 to {max} requests, got {got}")]
    BadLength { got: usize, max: usize },
}

/// The queue: a header and one entry per backend (its state in `entries`, its call in
/// `bodies`, at the same index), borrowed from wherever they live.
pub struct Queue<'a, R: Copy, P: Copy> {
    pub header: &'a mut QueueHeader,
    pub entries: &'a mut [Entry],
    bodies: &'a mut [EntryBody<R, P>],
}

impl<'a, R: Copy, P: Copy> Queue<'a, R, P> {
    /// `entries` and `bodies` are one per backend: the shorter length counts.
    pub fn new(
        header: &'a mut QueueHeader,
        entries: &'a mut [Entry],
        bodies: &'a mut [EntryBody<R, P>],
    ) -> Self {
        let len = entries.len().min(bodies.len());
        Queue { header, entries: &mut entries[..len], bodies: &mut bodies[..len] }
    }

    fn entry_mut(&mut self, ticket: Ticket) -> Option<&mut Entry> {
        self.entries.get_mut(ticket.index).filter(|e| e.generation == ticket.generation)
    }

    /// A caller fills its own entry. Whatever the entry held before belongs to a call that
    /// has ended (this backend's earlier call, or the previous user of its PGPROC): it is
    /// replaced, and an answer the worker still owes it will find another generation.
    pub fn submit(
        &mut self,
        index: usize,
        requests: &[R],
        waiter: usize,
    ) -> Result<Ticket, QueueError> {
        if requests.is_empty() || requests.len() > MAX_REQUESTS {
            return Err(QueueError::BadLength { got: requests.len(), max: MAX_REQUESTS });
        }
        let len = self.entries.len();
        let generation = self.header.next_generation;
        let entry = self.entries.get_mut(index).ok_or(QueueError::NoSuchEntry { index, len })?;
        self.header.next_generation += 1;
        entry.state = EntryState::Pending;
        entry.generation = generation;
        entry.len = requests.len();
        entry.waiter = waiter;
        self.bodies[index].requests[..requests.len()].copy_from_slice(requests);
        Ok(Ticket { index, generation })
    }

    pub fn state(&self, ticket: Ticket) -> Option<EntryState> {
        self.entries
            .get(ticket.index)
            .filter(|e| e.generation == ticket.generation)
            .map(|e| e.state)
    }

    /// The replies, once the worker answered; frees the entry.
    pub fn take_replies(&mut self, ticket: Ticket) -> Option<Vec<P>> {
        let entry = self.entry_mut(ticket)?;
        if entry.state != EntryState::Done {
            return None;
        }
        entry.state = EntryState::Free;
        let len = entry.len;
        Some(self.bodies[ticket.index].replies[..len].to_vec())
    }

    /// The caller gives up on its call. True if the worker had already taken it, i.e. its
    /// effect may be durable: taken, or answered with anything but replies that say it was
    /// not carried out (`never_done`). A reply "unknown" (a worker restarted mid-commit) is
    /// such an effect: it must never reach the caller as "never granted".
    pub fn abandon(&mut self, ticket: Ticket, never_done: impl Fn(&P) -> bool) -> bool {
        let Some(entry) = self.entry_mut(ticket) else { return false };
        match entry.state {
            EntryState::Pending => {
                entry.state = EntryState::Free;
                false
            }
            EntryState::Taken => {
                entry.state = EntryState::Abandoned;
                true
            }
            EntryState::Done => {
                entry.state = EntryState::Free;
                let len = entry.len;
                !self.bodies[ticket.index].replies[..len].iter().all(&never_done)
            }
            EntryState::Free | EntryState::Abandoned => false,
        }
    }

    /// The backend that owns entry `index` is exiting (by any path): give up whatever call
    /// it left there.
    pub fn release_entry(&mut self, index: usize) {
        if let Some(entry) = self.entries.get_mut(index) {
            entry.state = match entry.state {
                EntryState::Taken | EntryState::Abandoned => EntryState::Abandoned,
                EntryState::Free | EntryState::Pending | EntryState::Done => EntryState::Free,
            };
        }
    }

    /// Worker: take every pending call, oldest first.
    pub fn take_pending(&mut self) -> Vec<(Ticket, Vec<R>)> {
        let bodies = &*self.bodies;
        let mut taken: Vec<(Ticket, Vec<R>)> = self
            .entries
            .iter_mut()
            .enumerate()
            .filter(|(_, e)| e.state == EntryState::Pending)
            .map(|(index, e)| {
                e.state = EntryState::Taken;
                (
                    Ticket { index, generation: e.generation },
                    bodies[index].requests[..e.len].to_vec(),
                )
            })
            .collect();
        taken.sort_by_key(|(t, _)| t.generation);
        taken
    }

    /// Worker: answer a call it took. Returns the waiter to wake, or None when the caller
    /// left (the entry is freed: its effect is a gap) or the ticket is stale.
    pub fn answer(&mut self, ticket: Ticket, replies: &[P]) -> Option<usize> {
        let entry = self.entry_mut(ticket)?;
        match entry.state {
            EntryState::Taken => {
                let n = replies.len().min(entry.len);
                entry.state = EntryState::Done;
                let waiter = entry.waiter;
                self.bodies[ticket.index].replies[..n].copy_from_slice(&replies[..n]);
                Some(waiter)
            }
            EntryState::Abandoned => {
                entry.state = EntryState::Free;
                None
            }
            _ => None,
        }
    }

    /// Worker start: calls a previous worker took may or may not be committed; answer each
    /// with `unknown`. Returns the waiters to wake. The new worker has nothing in flight:
    /// callers wake it again.
    pub fn fail_taken(&mut self, unknown: P) -> Vec<usize> {
        self.header.worker_will_look = false;
        let mut waiters = Vec::new();
        for (entry, body) in self.entries.iter_mut().zip(self.bodies.iter_mut()) {
            match entry.state {
                EntryState::Taken => {
                    let len = entry.len;
                    body.replies[..len].fill(unknown);
                    entry.state = EntryState::Done;
                    waiters.push(entry.waiter);
                }
                EntryState::Abandoned => entry.state = EntryState::Free,
                _ => {}
            }
        }
        waiters
    }

    /// Entries not free (for monitoring).
    pub fn busy_entries(&self) -> usize {
        self.entries.iter().filter(|e| e.state != EntryState::Free).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type B = EntryBody<u32, i64>;

    fn queue(n: usize) -> (QueueHeader, Vec<Entry>, Vec<B>) {
        (QueueHeader::new(), vec![Entry::default(); n], vec![B::default(); n])
    }

    #[test]
    fn a_call_goes_round() {
        let (mut h, mut e, mut b) = queue(4);
        let mut q = Queue::new(&mut h, &mut e, &mut b);
        let t = q.submit(2, &[7, 8], 99).unwrap();
        assert_eq!(q.state(t), Some(EntryState::Pending));
        let taken = q.take_pending();
        assert_eq!(taken, vec![(t, vec![7, 8])]);
        assert_eq!(q.take_replies(t), None, "not answered yet");
        assert_eq!(q.answer(t, &[70, 80]), Some(99));
        assert_eq!(q.take_replies(t), Some(vec![70, 80]));
        assert_eq!(q.state(t), Some(EntryState::Free));
        assert_eq!(q.busy_entries(), 0);
    }

    #[test]
    fn bad_calls_are_refused() {
        let (mut h, mut e, mut b) = queue(2);
        let mut q = Queue::new(&mut h, &mut e, &mut b);
        assert_eq!(q.submit(2, &[1], 0), Err(QueueError::NoSuchEntry { index: 2, len: 2 }));
        assert_eq!(q.submit(0, &[], 0), Err(QueueError::BadLength { got: 0, max: MAX_REQUESTS }));
        assert_eq!(
            q.submit(0, &[1; MAX_REQUESTS + 1], 0),
            Err(QueueError::BadLength { got: MAX_REQUESTS + 1, max: MAX_REQUESTS })
        );
    }

    #[test]
    fn a_late_answer_never_reaches_the_next_user_of_the_entry() {
        let (mut h, mut e, mut b) = queue(1);
        let mut q = Queue::new(&mut h, &mut e, &mut b);
        let old = q.submit(0, &[1], 10).unwrap();
        assert_eq!(q.take_pending().len(), 1);
        // The caller's backend exits; the next backend on the same PGPROC submits.
        q.release_entry(0);
        let new = q.submit(0, &[2], 20).unwrap();
        assert_ne!(old.generation, new.generation);
        assert_eq!(q.answer(old, &[111]), None, "stale ticket");
        assert_eq!(q.take_pending(), vec![(new, vec![2])]);
        assert_eq!(q.answer(new, &[222]), Some(20));
        assert_eq!(q.take_replies(new), Some(vec![222]));
    }

    #[test]
    fn abandoning_says_whether_the_effect_may_be_durable() {
        let (mut h, mut e, mut b) = queue(1);
        let mut q = Queue::new(&mut h, &mut e, &mut b);
        // -2: refused, never carried out; -1: unknown (a worker restarted mid-commit).
        let unknown = |p: &i64| *p == -2;
        let t = q.submit(0, &[1], 0).unwrap();
        assert!(!q.abandon(t, unknown), "pending: nothing happened");
        assert_eq!(q.take_pending(), vec![]);
        let t = q.submit(0, &[1], 0).unwrap();
        q.take_pending();
        assert!(q.abandon(t, unknown), "taken: may be committed");
        assert_eq!(q.answer(t, &[5]), None, "the answer frees an abandoned entry");
        assert_eq!(q.busy_entries(), 0);
        let t = q.submit(0, &[1], 0).unwrap();
        q.take_pending();
        assert_eq!(q.fail_taken(-1), vec![0]);
        assert!(
            q.abandon(t, unknown),
            "answered 'unknown' by a restarted worker: may be committed"
        );
        let t = q.submit(0, &[1], 0).unwrap();
        q.take_pending();
        assert_eq!(q.answer(t, &[-2]), Some(0));
        assert!(!q.abandon(t, unknown), "answered 'refused': never carried out");
    }
}
