//! Deterministic simulation of an etcd-rs cluster (issue 20, item 3).
//!
//! N members, their clients, the network and the clock run in one thread under one seed: raft-rs
//! `RawNode`s configured as `raftnode` configures them, each over its own real MVCC store
//! (`etcdrs_mvcc::KvStore` on a redb `Backend` in a temporary directory), proposals encoded as
//! etcd's `InternalRaftRequest` (`proto::raft_internal`). The network delays, drops, duplicates
//! and reorders raft messages and partitions members; members crash and restart from their
//! raft log and their backend. No threads, no real time: a failing seed replays exactly.
//!
//! Every step checks the invariants ([`sim`]); at the end the clients' history goes through
//! the linearizability [`checker`]. Clients also watch members, each delivery checked against
//! the watch guarantees ([`watch_check`]) as it comes.

#![deny(missing_docs)]

pub mod checker;
pub mod sim;
pub mod watch_check;

pub use checker::{Checker, Kind, Operation, Violation};
pub use sim::{Config, Failure, Report, WatchFault, run, run_traced};
pub use watch_check::{Guarantee, History, Watch, WatchViolation};
