//! A slow, lossy link on loopback: a TCP forwarder between a member and its oracle (or any
//! client and server), since these machines have no netem.
//!
//! [`Link::start`] listens on a loopback port and forwards every connection to a target port.
//! Each direction of each connection is a reader and a writer thread: the reader stamps every
//! chunk it reads with the instant it is due (read time plus the one-way latency) and queues
//! it, the writer writes the chunks in order once they are due. A chunk never waits for the
//! chunks behind it, and the reader never sleeps, so the link delays bytes without limiting
//! how many are on their way (a round trip costs twice the one-way latency, however many are
//! in flight), and it keeps their order. At run time it can be told to:
//!
//! - change its latency ([`Link::set_one_way`]), for chunks read from then on;
//! - drop every connection at once ([`Link::drop_all`]): both sockets of each are shut
//!   down, and what was on its way is lost;
//! - refuse new connections for a while ([`Link::refuse_for`]): each is accepted and closed
//!   at once, before a byte reaches the target;
//! - stall for a while ([`Link::stall_for`]): nothing is written in either direction, on the
//!   connections open and on those made meanwhile (they are held mid-handshake), and then
//!   everything held goes on, in order.
//!
//! Dropping the [`Link`] closes the listener and every connection.

use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The state every thread of a link shares.
#[derive(Default)]
struct Shared {
    one_way_us: AtomicU64,
    stop: AtomicBool,
    stall_until: Mutex<Option<Instant>>,
    refuse_until: Mutex<Option<Instant>>,
    /// The open connections: both sockets of each, by number, to shut them down at once.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `until` at least `d` from now.
fn extend(until: &Mutex<Option<Instant>>, d: Duration) {
    let mut u = lock(until);
    let at = Instant::now() + d;
    *u = Some(u.map_or(at, |was| was.max(at)));
}

impl Shared {
    fn until(m: &Mutex<Option<Instant>>) -> Option<Instant> {
        lock(m).filter(|&at| Instant::now() < at)
    }

    fn close(&self, id: u64) {
        let mut open = lock(&self.open);
        if let Some(i) = open.iter().position(|(n, ..)| *n == id) {
            let (_, a, b) = open.swap_remove(i);
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

/// A forwarder from a loopback port to a target, with a latency each way and faults on
/// demand (the module's documentation).
pub struct Link {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Link {
    /// Listen on a free loopback port; forward to `127.0.0.1:target`, `one_way` each way.
    pub fn start(target: u16, one_way: Duration) -> std::io::Result<Link> {
        Link::start_on(0, target, one_way)
    }

    /// Listen on loopback port `listen` (0: a free one); forward to `127.0.0.1:target`,
    /// `one_way` each way.
    pub fn start_on(listen: u16, target: u16, one_way: Duration) -> std::io::Result<Link> {
        let listener = TcpListener::bind(("127.0.0.1", listen))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        shared.one_way_us.store(one_way.as_micros() as u64, Ordering::SeqCst);
        let target = SocketAddr::from(([127, 0, 0, 1], target));
        let s = shared.clone();
        let acceptor = thread::Builder::new()
            .name(format!("link-{port}"))
            .spawn(move || accept_loop(listener, target, s))?;
        Ok(Link { port, shared, acceptor: Some(acceptor) })
    }

    /// The port to connect to instead of the target's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The latency each way, for the chunks read from now on.
    pub fn set_one_way(&self, one_way: Duration) {
        self.shared.one_way_us.store(one_way.as_micros() as u64, Ordering::SeqCst);
    }

    /// Take a new one-way latency (milliseconds, [`parse_one_way_ms`]) from each line of
    /// `input` until it ends, and answer each line on `out`: `ok MS` once it is set, or
    /// `error: WHY` (blank lines are skipped). What `tso-link` does with its standard input.
    pub fn follow(&self, input: impl BufRead, mut out: impl Write) -> std::io::Result<()> {
        for line in input.lines() {
            let line = line?;
            let ms = line.trim();
            if ms.is_empty() {
                continue;
            }
            match parse_one_way_ms(ms) {
                Ok(d) => {
                    self.set_one_way(d);
                    writeln!(out, "ok {ms}")?;
                }
                Err(e) => writeln!(out, "error: {e}")?,
            }
            out.flush()?;
        }
        Ok(())
    }

    /// Drop every open connection now (both its sockets shut down): how many there were.
    pub fn drop_all(&self) -> usize {
        let open = std::mem::take(&mut *lock(&self.shared.open));
        for (_, a, b) in &open {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        self.shared.dropped.fetch_add(open.len() as u64, Ordering::SeqCst);
        open.len()
    }

    /// Close every new connection as soon as it is accepted, for `d` from now (or longer, if
    /// an earlier call said so).
    pub fn refuse_for(&self, d: Duration) {
        extend(&self.shared.refuse_until, d);
    }

    /// Write nothing either way, on any connection, for `d` from now (or longer, if an
    /// earlier call said so).
    pub fn stall_for(&self, d: Duration) {
        extend(&self.shared.stall_until, d);
    }

    /// Connections accepted and forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once while refusing.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.shared.open).len()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor from its blocking accept.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.drop_all();
    }
}

/// A one-way latency in milliseconds (a fraction allowed: `0.5`), 0 to one minute.
pub fn parse_one_way_ms(ms: &str) -> Result<Duration, String> {
    let v: f64 = ms.trim().parse().map_err(|_| format!("not a number of milliseconds: {ms:?}"))?;
    if !(0.0..=60_000.0).contains(&v) {
        return Err(format!("a one-way delay of {v} ms is outside 0 to 60000"));
    }
    Ok(Duration::from_secs_f64(v / 1000.0))
}

fn accept_loop(listener: TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if Shared::until(&shared.refuse_until).is_some() {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        next_id += 1;
        let (id, shared) = (next_id, shared.clone());
        // Connecting to the target may take a while: not in the acceptor's thread.
        let _ = thread::Builder::new()
            .name(format!("link-conn-{id}"))
            .spawn(move || connect(id, client, target, shared));
    }
}

/// Forward one accepted connection to the target: a direction each way.
fn connect(id: u64, client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = (|| Some((client.try_clone().ok()?, server.try_clone().ok()?)))();
    let Some((client2, server2)) = clones else { return };
    let kept = (|| Some((client.try_clone().ok()?, server.try_clone().ok()?)))();
    let Some((c3, s3)) = kept else { return };
    lock(&shared.open).push((id, c3, s3));
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    let ends = Arc::new(AtomicU64::new(0));
    direction(id, client, server2, shared.clone(), ends.clone());
    direction(id, server, client2, shared, ends);
}

/// What a reader hands its writer.
enum Chunk {
    Bytes { due: Instant, data: Vec<u8> },
    End,
}

/// One direction of connection `id`: `from` read into chunks, written to `to` once due. The
/// connection is forgotten once both its directions ended (`ends`), or closed at once when a
/// write fails.
fn direction(
    id: u64,
    mut from: TcpStream,
    to: TcpStream,
    shared: Arc<Shared>,
    ends: Arc<AtomicU64>,
) {
    let (tx, rx): (Sender<Chunk>, Receiver<Chunk>) = channel();
    let s = shared.clone();
    let _ = thread::Builder::new().name(format!("link-read-{id}")).spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Chunk::End);
                    return;
                }
                Ok(n) => {
                    let delay = Duration::from_micros(s.one_way_us.load(Ordering::SeqCst));
                    let chunk =
                        Chunk::Bytes { due: Instant::now() + delay, data: buf[..n].to_vec() };
                    if tx.send(chunk).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let _ = thread::Builder::new().name(format!("link-write-{id}")).spawn(move || {
        precise_sleeps();
        if !write_due(&rx, to, &shared) || ends.fetch_add(1, Ordering::SeqCst) == 1 {
            shared.close(id);
        }
    });
}

/// Let this thread's sleeps end when they are due: Linux lets a sleep overrun by the thread's
/// timer slack (50 µs by default) to batch wake-ups, which would add a tenth of a millisecond
/// to each direction of a round trip, on top of the latency asked for.
fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's timer slack;
    // no memory is passed.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Write the chunks of `rx` to `to` as they fall due: false when a write failed or the link
/// stopped, true when the other side ended its writing (so does this one).
fn write_due(rx: &Receiver<Chunk>, mut to: TcpStream, shared: &Shared) -> bool {
    loop {
        let chunk = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) if !shared.stop.load(Ordering::SeqCst) => continue,
            Err(_) => return false,
        };
        let Chunk::Bytes { due, data } = chunk else {
            let _ = to.shutdown(Shutdown::Write);
            return true;
        };
        // One sleep until it is due (a stall only ever makes it later: looked at again then).
        loop {
            let now = Instant::now();
            let wake = Shared::until(&shared.stall_until).map_or(due, |s| s.max(due));
            if now >= wake {
                break;
            }
            thread::sleep(wake - now);
        }
        if to.write_all(&data).is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    /// A server that echoes every connection's bytes back: its port.
    fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    let mut r = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut s);
                });
            }
        });
        port
    }

    fn connect(link: &Link) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", link.port())).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// One round trip of `msg`: how long it took.
    fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Duration {
        let t = Instant::now();
        s.write_all(msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
        t.elapsed()
    }

    #[test]
    fn a_round_trip_takes_twice_the_latency_however_many_are_in_flight() {
        let link = Link::start(echo_server(), Duration::from_millis(25)).unwrap();
        let mut s = connect(&link);
        let rtt = round_trip(&mut s, b"ping");
        assert!(rtt >= Duration::from_millis(50), "a round trip took {rtt:?}");
        assert!(rtt < Duration::from_millis(500), "a round trip took {rtt:?}");
        // 40 messages sent 2 ms apart: they are not queued behind each other's delay (which
        // would take 40 × 50 ms), they all arrive within about one round trip of the last.
        let t = Instant::now();
        let mut w = s.try_clone().unwrap();
        let writer = thread::spawn(move || {
            for i in 0..40u8 {
                w.write_all(&[i; 8]).unwrap();
                thread::sleep(Duration::from_millis(2));
            }
        });
        let mut back = vec![0u8; 40 * 8];
        s.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(50 + 78), "40 messages took {took:?}");
        assert!(took < Duration::from_millis(1000), "40 messages took {took:?}: serialised");
        for (i, m) in back.chunks(8).enumerate() {
            assert_eq!(m, [i as u8; 8], "message {i} out of order or changed");
        }
        // The latency changed at run time.
        link.set_one_way(Duration::ZERO);
        let rtt = round_trip(&mut s, b"pong");
        assert!(rtt < Duration::from_millis(40), "with no latency a round trip took {rtt:?}");
    }

    #[test]
    fn each_line_of_its_input_sets_the_latency() {
        let link = Link::start(echo_server(), Duration::ZERO).unwrap();
        let mut answers = Vec::new();
        link.follow("25\n\n abc\n70000\n-1\n".as_bytes(), &mut answers).unwrap();
        let answers = String::from_utf8(answers).unwrap();
        assert_eq!(
            answers.lines().collect::<Vec<_>>(),
            [
                "ok 25",
                "error: not a number of milliseconds: \"abc\"",
                "error: a one-way delay of 70000 ms is outside 0 to 60000",
                "error: a one-way delay of -1 ms is outside 0 to 60000",
            ],
        );
        // 25 ms each way was kept (the refused lines changed nothing).
        let mut s = connect(&link);
        let rtt = round_trip(&mut s, b"slow");
        assert!(rtt >= Duration::from_millis(50), "a round trip at 25 ms each way took {rtt:?}");
        let mut answers = Vec::new();
        link.follow("0.5\n".as_bytes(), &mut answers).unwrap();
        assert_eq!(String::from_utf8(answers).unwrap(), "ok 0.5\n");
        let rtt = round_trip(&mut s, b"fast");
        assert!(rtt >= Duration::from_millis(1), "a round trip at 0.5 ms each way took {rtt:?}");
        assert!(rtt < Duration::from_millis(40), "a round trip at 0.5 ms each way took {rtt:?}");
    }

    #[test]
    fn bytes_arrive_intact_and_in_order() {
        let link = Link::start(echo_server(), Duration::from_millis(2)).unwrap();
        let mut s = connect(&link);
        let mut rng = SplitMix64::new(68);
        let data: Vec<u8> = (0..4 << 20).map(|_| rng.next_u64() as u8).collect();
        let mut w = s.try_clone().unwrap();
        let sent = data.clone();
        let writer = thread::spawn(move || {
            for part in sent.chunks(7919) {
                w.write_all(part).unwrap();
            }
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        writer.join().unwrap();
        assert_eq!(back.len(), data.len());
        assert!(back == data, "the bytes changed on the way");
    }

    #[test]
    fn dropped_connections_close_and_new_ones_are_refused_then_served() {
        let link = Link::start(echo_server(), Duration::from_millis(1)).unwrap();
        let mut a = connect(&link);
        let mut b = connect(&link);
        round_trip(&mut a, b"a");
        round_trip(&mut b, b"b");
        assert_eq!(link.open(), 2);
        assert_eq!(link.drop_all(), 2);
        for s in [&mut a, &mut b] {
            // Closed: the next read ends (EOF or reset), it does not time out.
            let _ = s.write_all(b"x");
            let mut buf = [0u8; 1];
            let t = Instant::now();
            match s.read(&mut buf) {
                Ok(0) | Err(_) => {}
                Ok(n) => panic!("read {n} bytes from a dropped connection"),
            }
            assert!(t.elapsed() < Duration::from_secs(5), "a dropped connection stayed open");
        }
        link.refuse_for(Duration::from_millis(300));
        let mut c = connect(&link);
        let mut buf = [0u8; 1];
        let _ = c.write_all(b"x");
        assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "a refused connection was served");
        assert_eq!(link.refused(), 1);
        thread::sleep(Duration::from_millis(350));
        let mut d = connect(&link);
        round_trip(&mut d, b"served again");
        assert_eq!(link.accepted(), 3);
    }

    #[test]
    fn a_stall_holds_every_byte_then_lets_it_through_in_order() {
        let link = Link::start(echo_server(), Duration::from_millis(1)).unwrap();
        let mut s = connect(&link);
        round_trip(&mut s, b"before");
        link.stall_for(Duration::from_millis(400));
        let rtt = round_trip(&mut s, b"during the stall");
        assert!(rtt >= Duration::from_millis(350), "a round trip during a stall took {rtt:?}");
        let rtt = round_trip(&mut s, b"after");
        assert!(rtt < Duration::from_millis(200), "after the stall a round trip took {rtt:?}");
    }
}
