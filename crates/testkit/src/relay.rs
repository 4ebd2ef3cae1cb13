//! A fault-injecting TCP relay: the "network" between cluster members in partition tests.
//!
//! A [`Relay`] listens on a loopback port and forwards every connection, byte for byte in both
//! directions, to one target address. It runs on its own OS thread (with its own single-threaded
//! tokio runtime), so it keeps forwarding whatever the test's runtime is doing, and it knows
//! nothing of the protocol it carries.
//!
//! Faults:
//!
//! - [`Relay::block`] drops every open connection and refuses new ones (each is accepted and
//!   closed at once, before anything reaches the target): the target is unreachable through it.
//! - [`Relay::block_from`] does the same only for connections *made by one process*. Loopback
//!   connections all come from `127.0.0.1` whatever address the dialer listens on, so the source
//!   is found the way `ss -p` finds it: the dialer's socket is looked up by its address in
//!   `/proc/net/tcp{,6}` and its inode among `/proc/<pid>/fd`. This is what makes a partition
//!   real for peer protocols where a connection dialed by X also carries traffic *to* X (etcd's
//!   rafthttp stream readers): blocking X's own relay cuts the connections others dial to X,
//!   `block_from(X)` on every other relay cuts the ones X dials.
//! - [`Relay::heal`] lifts both; new connections are forwarded again.
//! - [`Relay::stall`] keeps every connection open but carries no byte in either direction
//!   until [`Relay::resume`] (bytes read meanwhile are held, up to a bound, and then
//!   delivered in order): a network that has gone silent without a reset, which only
//!   timeouts and keep-alives notice. A dialer that closes a stalled connection is counted
//!   ([`Relay::dialer_closes`]).
//!
//! [`Relay::capture`] records what dialers send (with the time each chunk arrived), so a test
//! can read a protocol's frames off the wire, e.g. an HTTP/2 client's PINGs.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::ports::{self, PortLease};

/// A TCP forwarder from a loopback port to a target address, with switchable faults.
///
/// Dropping it stops the listener and closes every connection it carries.
pub struct Relay {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _port: PortLease,
}

/// Bytes a stalled direction holds before it stops reading (TCP's own windows then hold
/// the rest).
const STALL_HOLD: usize = 1 << 20;
/// Bytes [`Relay::capture`] keeps per connection.
const CAPTURE_CAP: usize = 1 << 20;

/// What one dialer sent on one connection, chunk by chunk as read, with the arrival time of
/// each chunk.
pub type Captured = Vec<(Instant, Vec<u8>)>;

struct Shared {
    state: Mutex<State>,
    forwarded: AtomicU64,
    refused: AtomicU64,
    dialer_closes: AtomicU64,
    stalled: watch::Sender<bool>,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            state: Mutex::default(),
            forwarded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dialer_closes: AtomicU64::new(0),
            stalled: watch::Sender::new(false),
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct State {
    /// Every connection is refused.
    blocked: bool,
    /// Connections dialed by these processes are refused.
    blocked_pids: BTreeSet<u32>,
    next_id: u64,
    /// Open connections: dialer address and the switch that closes it (dropping the sender).
    conns: HashMap<u64, (SocketAddr, oneshot::Sender<()>)>,
    /// Whether new connections record what their dialer sends.
    capture: bool,
    /// What dialers sent, one entry per captured connection in accept order.
    captured: Vec<Arc<Mutex<Captured>>>,
}

impl Relay {
    /// Starts a relay on a free port of `host` (from the testkit's port range) forwarding to
    /// `target`.
    pub fn start(host: Ipv4Addr, target: SocketAddr) -> anyhow::Result<Relay> {
        let port = ports::reserve_on(host)?;
        let listener = std::net::TcpListener::bind((host, port.port()))
            .with_context(|| format!("binding relay on {host}:{}", port.port()))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("relay runtime")?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("relay-{}", addr.port()))
            .spawn(move || {
                rt.block_on(accept_loop(listener, addr, target, thread_shared, stopped));
                // Dropping the runtime drops every connection task, closing its sockets.
                drop(rt);
            })
            .context("spawning relay thread")?;
        Ok(Relay {
            addr,
            target,
            shared,
            stop: Some(stop),
            thread: Some(thread),
            _port: port,
        })
    }

    /// The address the relay listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: the relay as a peer URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Drops every open connection and refuses new ones until [`Relay::heal`].
    pub fn block(&self) {
        let mut st = self.shared.state();
        st.blocked = true;
        st.conns.clear();
    }

    /// Drops the open connections dialed by process `pid` and refuses its new ones until
    /// [`Relay::heal`]. Other processes' connections are not touched.
    pub fn block_from(&self, pid: u32) {
        let mut st = self.shared.state();
        st.blocked_pids.insert(pid);
        let theirs = sources_of(&BTreeSet::from([pid]), self.addr);
        st.conns.retain(|_, (src, _)| !theirs.contains(src));
    }

    /// Lifts [`Relay::block`] and every [`Relay::block_from`]: new connections are forwarded.
    pub fn heal(&self) {
        let mut st = self.shared.state();
        st.blocked = false;
        st.blocked_pids.clear();
    }

    /// Whether [`Relay::block`] is in force.
    pub fn is_blocked(&self) -> bool {
        self.shared.state().blocked
    }

    /// Connections forwarded to the target so far.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.state().conns.len()
    }

    /// Stops carrying bytes on every connection, open and new, until [`Relay::resume`]; the
    /// connections stay open.
    pub fn stall(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Lifts [`Relay::stall`]: held bytes are delivered, in order, and forwarding goes on.
    pub fn resume(&self) {
        self.shared.stalled.send_replace(false);
    }

    /// Connections whose dialer closed its side (or reset it) so far.
    pub fn dialer_closes(&self) -> u64 {
        self.shared.dialer_closes.load(Ordering::Relaxed)
    }

    /// Records what dialers send on connections accepted from now on (the first MiB of each);
    /// read it with [`Relay::captured`].
    pub fn capture(&self) {
        self.shared.state().capture = true;
    }

    /// What dialers sent on each captured connection, in accept order.
    pub fn captured(&self) -> Vec<Captured> {
        let conns = self.shared.state().captured.clone();
        conns
            .iter()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((inbound, src)) => {
                    tokio::spawn(relay_one(shared.clone(), addr, target, inbound, src));
                }
                // Out of file descriptors or the like: let the load pass (a pace, not a wait
                // for a state).
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// Removes a connection from the open set when its task ends or is dropped.
struct Deregister {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        self.shared.state().conns.remove(&self.id);
    }
}

async fn relay_one(
    shared: Arc<Shared>,
    addr: SocketAddr,
    target: SocketAddr,
    mut inbound: TcpStream,
    src: SocketAddr,
) {
    // Decide and register atomically with respect to block()/block_from(): the source lookup is
    // I/O done outside the lock, so redo it if the blocked processes changed meanwhile.
    let (id, mut closed, tap) = loop {
        let pids = shared.state().blocked_pids.clone();
        let denied = !pids.is_empty() && sources_of(&pids, addr).contains(&src);
        let mut st = shared.state();
        if st.blocked_pids != pids {
            continue;
        }
        if st.blocked || denied {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let id = st.next_id;
        st.next_id += 1;
        let (close, closed) = oneshot::channel();
        st.conns.insert(id, (src, close));
        let tap = st.capture.then(|| {
            let tap = Arc::new(Mutex::new(Captured::new()));
            st.captured.push(tap.clone());
            tap
        });
        break (id, closed, tap);
    };
    let _registered = Deregister {
        shared: shared.clone(),
        id,
    };
    shared.forwarded.fetch_add(1, Ordering::Relaxed);
    let mut outbound = tokio::select! {
        _ = &mut closed => return,
        connected = TcpStream::connect(target) => match connected {
            Ok(s) => s,
            Err(_) => return,
        },
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (from_dialer, to_dialer) = inbound.split();
    let (from_target, to_target) = outbound.split();
    let up = pump(from_dialer, to_target, shared.stalled.subscribe(), tap);
    let down = pump(from_target, to_dialer, shared.stalled.subscribe(), None);
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut closed => {}
        ended = &mut up => {
            if ended == Ended::ByReader {
                shared.dialer_closes.fetch_add(1, Ordering::Relaxed);
            }
            // A dialer gone from a stalled connection ends it: nothing will flow again.
            if !*shared.stalled.borrow() {
                tokio::select! {
                    _ = &mut closed => {}
                    _ = &mut down => {}
                }
            }
        }
        _ = &mut down => {
            tokio::select! {
                _ = &mut closed => {}
                ended = &mut up => {
                    if ended == Ended::ByReader {
                        shared.dialer_closes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// How one direction of a connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Its reader side reached end of stream or failed.
    ByReader,
    /// Writing to the other side failed, or the stall switch went away.
    ByWriter,
}

/// Carries one direction: reads whenever it holds less than [`STALL_HOLD`] bytes, writes
/// whenever the relay is not stalled. A closed reader while stalled ends the direction at
/// once (its held bytes would never be wanted); otherwise what is held is delivered first.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    mut stalled: watch::Receiver<bool>,
    tap: Option<Arc<Mutex<Captured>>>,
) -> Ended
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: Vec<u8> = Vec::new();
    let mut eof = false;
    loop {
        let stall = *stalled.borrow_and_update();
        if eof && (held.is_empty() || stall) {
            let _ = to.shutdown().await;
            return Ended::ByReader;
        }
        tokio::select! {
            read = from.read(&mut buf), if !eof && held.len() < STALL_HOLD => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => {
                    if let Some(tap) = &tap {
                        let mut tap = tap.lock().unwrap_or_else(|e| e.into_inner());
                        let kept: usize = tap.iter().map(|(_, c)| c.len()).sum();
                        let room = CAPTURE_CAP.saturating_sub(kept).min(n);
                        if room > 0 {
                            tap.push((Instant::now(), buf[..room].to_vec()));
                        }
                    }
                    held.extend_from_slice(&buf[..n]);
                }
            },
            wrote = to.write(&held), if !stall && !held.is_empty() => match wrote {
                Ok(0) | Err(_) => return Ended::ByWriter,
                Ok(n) => {
                    held.drain(..n);
                }
            },
            changed = stalled.changed() => {
                if changed.is_err() {
                    return Ended::ByWriter;
                }
            }
        }
    }
}

/// The local addresses of the TCP sockets owned by any of `pids` and connected to `remote`.
fn sources_of(pids: &BTreeSet<u32>, remote: SocketAddr) -> BTreeSet<SocketAddr> {
    let mut inodes = BTreeSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|l| l.parse::<u64>().ok());
            inodes.extend(inode);
        }
    }
    let mut sources = BTreeSet::new();
    if inodes.is_empty() {
        return sources;
    }
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 {
                continue;
            }
            let (Some(local), Some(rem), Ok(inode)) = (
                parse_proc_addr(fields[1]),
                parse_proc_addr(fields[2]),
                fields[9].parse::<u64>(),
            ) else {
                continue;
            };
            if rem == remote && inodes.contains(&inode) {
                sources.insert(local);
            }
        }
    }
    sources
}

/// An IPv4 (or IPv4-mapped IPv6) `ADDR:PORT` of `/proc/net/tcp{,6}`: the address as the
/// kernel's in-memory words in hex, the port in hex.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => ip,
        32 if ip.starts_with("0000000000000000FFFF0000") => &ip[24..],
        _ => return None,
    };
    let word = u32::from_str_radix(ip, 16).ok()?;
    Some(SocketAddr::from((Ipv4Addr::from(word.to_le_bytes()), port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(5);

    /// An echo server on `127.0.0.1` (a task of the test's runtime).
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Sends `msg` and reads back as many bytes: `Ok(echo)`, or `Err` if the connection is
    /// closed or reset first.
    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Result<Vec<u8>, String> {
        s.write_all(msg).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0; msg.len()];
        match tokio::time::timeout(DEADLINE, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Ok(buf),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => panic!("no answer and no close within {DEADLINE:?}"),
        }
    }

    async fn connect(relay: &Relay) -> TcpStream {
        TcpStream::connect(relay.addr()).await.unwrap()
    }

    #[tokio::test]
    async fn forwards_blocks_and_heals() {
        let relay = Relay::start(Ipv4Addr::LOCALHOST, echo_server().await).unwrap();
        assert_eq!(relay.url(), format!("http://{}", relay.addr()));
        let mut a = connect(&relay).await;
        assert_eq!(round_trip(&mut a, b"ping").await.unwrap(), b"ping");

        relay.block();
        assert!(relay.is_blocked());
        round_trip(&mut a, b"lost")
            .await
            .expect_err("an open connection is dropped by block()");
        let mut b = connect(&relay).await;
        round_trip(&mut b, b"refused")
            .await
            .expect_err("a new connection is refused while blocked");
        assert!(relay.refused() >= 1);

        relay.heal();
        let mut c = connect(&relay).await;
        assert_eq!(round_trip(&mut c, b"again").await.unwrap(), b"again");
        assert_eq!(relay.forwarded(), 2);
    }

    #[tokio::test]
    async fn block_from_cuts_only_that_process() {
        let relay = Relay::start(Ipv4Addr::LOCALHOST, echo_server().await).unwrap();
        let mut open = connect(&relay).await;
        assert_eq!(round_trip(&mut open, b"one").await.unwrap(), b"one");

        // Another process: this test's connections are not its.
        relay.block_from(1);
        assert_eq!(round_trip(&mut open, b"two").await.unwrap(), b"two");
        let mut other = connect(&relay).await;
        assert_eq!(round_trip(&mut other, b"three").await.unwrap(), b"three");

        relay.block_from(std::process::id());
        round_trip(&mut open, b"four")
            .await
            .expect_err("our open connection is dropped");
        let mut refused = connect(&relay).await;
        round_trip(&mut refused, b"five")
            .await
            .expect_err("our new connection is refused");
        assert!(!relay.is_blocked());

        relay.heal();
        let mut healed = connect(&relay).await;
        assert_eq!(round_trip(&mut healed, b"six").await.unwrap(), b"six");
    }

    #[tokio::test]
    async fn stall_holds_bytes_until_resume_and_capture_records_them() {
        let relay = Relay::start(Ipv4Addr::LOCALHOST, echo_server().await).unwrap();
        relay.capture();
        let mut a = connect(&relay).await;
        assert_eq!(round_trip(&mut a, b"one").await.unwrap(), b"one");

        relay.stall();
        a.write_all(b"held").await.unwrap();
        let mut buf = [0u8; 4];
        let silent = tokio::time::timeout(Duration::from_millis(300), a.read(&mut buf)).await;
        assert!(silent.is_err(), "a stalled relay delivered {silent:?}");
        relay.resume();
        tokio::time::timeout(DEADLINE, a.read_exact(&mut buf))
            .await
            .expect("held bytes arrive after resume")
            .unwrap();
        assert_eq!(&buf, b"held");

        let sent: Vec<u8> = relay.captured()[0]
            .iter()
            .flat_map(|(_, chunk)| chunk.clone())
            .collect();
        assert_eq!(sent, b"oneheld");

        // A dialer that gives up on a stalled connection is seen closing it.
        relay.stall();
        drop(a);
        crate::poll_until(DEADLINE, || async {
            match relay.open_connections() {
                0 => Ok(()),
                n => Err(format!("{n} connections open")),
            }
        })
        .await
        .unwrap();
        assert_eq!(relay.dialer_closes(), 1);
    }

    #[test]
    fn parses_proc_net_addresses() {
        assert_eq!(
            parse_proc_addr("0100007F:1F90"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8080)))
        );
        assert_eq!(
            parse_proc_addr("0000000000000000FFFF00000300007F:0050"),
            Some(SocketAddr::from(([127, 0, 0, 3], 80)))
        );
        assert_eq!(
            parse_proc_addr("00000000000000000000000001000000:0050"),
            None
        );
    }
}
