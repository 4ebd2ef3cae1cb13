//! Free loopback ports for test members.
//!
//! Ports come from `20000..32000`: below Linux's ephemeral range (32768-60999), whose ports
//! outgoing connections take and could steal from a later listener. A candidate is taken only if
//!
//! 1. an exclusive, non-blocking lock on `$TMPDIR/etcdrs-testkit-ports/<port>.lock` succeeds. The
//!    lock is held by the returned [`PortLease`] for the lifetime of the member, so concurrent test
//!    *processes* (nextest runs one per test) never hand out the same port; the OS drops the lock
//!    if the process dies, so there is nothing stale to clean up; and
//! 2. `<host>:<port>` can be bound right now (something outside the testkit may own it). The host
//!    is `127.0.0.1` for [`reserve`] and any loopback address for [`reserve_on`] (cluster members
//!    live on `127.0.0.2`, `127.0.0.3`, …). The lock is per port number whatever the host, so a
//!    port is never handed out twice even on different addresses.
//!
//! A server may still lose a port to an outside program between the check and its own bind;
//! [`crate::Member::start`] retries with fresh ports when the log says "address already in use".

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

use anyhow::{Context, bail};

/// First port handed out.
pub const LOW: u16 = 20000;
/// One past the last port handed out.
pub const HIGH: u16 = 32000;

/// A reserved port. The reservation (a file lock) lasts until this is dropped.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    /// The port number.
    pub fn port(&self) -> u16 {
        self.port
    }
}

fn lock_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join("etcdrs-testkit-ports");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Reserves one free port in `LOW..HIGH`, bindable on `127.0.0.1`.
pub fn reserve() -> anyhow::Result<PortLease> {
    reserve_on(Ipv4Addr::LOCALHOST)
}

/// Reserves one free port in `LOW..HIGH`, bindable on `host` (e.g. `127.0.0.3`).
pub fn reserve_on(host: Ipv4Addr) -> anyhow::Result<PortLease> {
    let dir = lock_dir()?;
    let seed = RandomState::new();
    let span = u64::from(HIGH - LOW);
    for attempt in 0u64..2000 {
        let offset = u16::try_from(seed.hash_one(attempt) % span).expect("span fits in u16");
        let port = LOW + offset;
        let path = dir.join(format!("{port}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if file.try_lock().is_err() {
            continue;
        }
        if TcpListener::bind((host, port)).is_err() {
            continue;
        }
        return Ok(PortLease { port, _lock: file });
    }
    bail!("no free port found in {LOW}..{HIGH} on {host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_bindable_and_in_range() {
        let leases: Vec<PortLease> = (0..20).map(|_| reserve().unwrap()).collect();
        let mut ports: Vec<u16> = leases.iter().map(PortLease::port).collect();
        assert!(ports.iter().all(|p| (LOW..HIGH).contains(p)));
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 20, "a held port was handed out twice");
        for p in ports {
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
    }

    #[test]
    fn leases_on_other_loopback_addresses() {
        let host = Ipv4Addr::new(127, 0, 0, 7);
        let a = reserve_on(host).unwrap();
        let b = reserve().unwrap();
        assert_ne!(a.port(), b.port());
        TcpListener::bind((host, a.port())).unwrap();
    }
}
