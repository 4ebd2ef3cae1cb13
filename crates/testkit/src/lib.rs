//! Black-box test harness for etcd-rs (dev-only; appears only under `[dev-dependencies]`).
//!
//! Everything here drives a real server *process* from the outside, the way `etcdctl` and the
//! `etcd-client` crate see it. The same tests therefore run against our `etcd` binary and against
//! the stock etcd (set `ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd`), which is how the tests themselves are
//! validated before our implementation exists.
//!
//! # Pieces
//!
//! - [`EtcdBin`]: which server binary to run. `ETCDRS_TEST_ETCD_BIN` wins over the path the caller
//!   passes (integration tests pass `env!("CARGO_BIN_EXE_etcd")`).
//! - [`Member`] / [`MemberOpts`]: one single-member cluster in its own temp data dir, on free
//!   loopback ports in `20000..32000` (see [`ports`]). Started with
//!   `--name --data-dir --listen-client-urls --advertise-client-urls --listen-peer-urls
//!   --initial-advertise-peer-urls --initial-cluster` plus extra args/env. Readiness is polled
//!   (HTTP `GET /health`, falling back to gRPC `Status`) with a deadline; on timeout the error
//!   carries the tail of the member's log. stdout+stderr go to a log file ([`Member::log`],
//!   [`Member::log_contains`]). [`Member::kill9`], [`Member::stop`] (SIGTERM) and
//!   [`Member::restart`] (same data dir and ports); dropping a `Member` SIGKILLs it.
//!   [`MemberOpts`] also places a member on another loopback address, sets its
//!   `--initial-cluster` / token / advertised peer URL, or passes the configuration as `ETCD_*`
//!   variables; [`Member::wait_exit`] waits for a server that must fail at start.
//! - [`Cluster`] / [`ClusterOpts`]: `n` members bootstrapped from one static `--initial-cluster`,
//!   member `i` named `m<i>` on `127.0.0.<i + 2>`, a unique `--initial-cluster-token`, fast raft
//!   timers (`--heartbeat-interval 50 --election-timeout 500`), started in parallel and ready
//!   when every `/health` is true. [`Cluster::leader`], [`Cluster::kill9`], [`Cluster::restart`],
//!   [`Cluster::restart_all`], a [`Cluster::client`] and an [`Cluster::etcdctl`] over all
//!   endpoints. Dropping it SIGKILLs every member.
//! - [`Relay`]: a TCP forwarder on a loopback port with faults: [`Relay::block`] drops and
//!   refuses every connection, [`Relay::block_from`] only those a given process dials,
//!   [`Relay::heal`] lifts both. [`RelayedCluster`]: a cluster whose members advertise a relay as
//!   their peer URL (each listens on its own peer port behind it), with
//!   [`RelayedCluster::isolate`] (a real two-way partition of one member) and
//!   [`RelayedCluster::heal`].
//! - [`Etcdctl`]: runs the stock `etcdctl` (`ETCDCTL_API=3`, `--endpoints`), override with
//!   `ETCDRS_TEST_ETCDCTL`. [`Etcdctl::ok`] / [`Etcdctl::fail`] panic with the other stream when
//!   the exit status is not the expected one.
//! - [`poll_until`]: retry an async check until it succeeds or a deadline passes. Tests never sleep
//!   to wait for a state.
//! - [`memory`]: a process's resident set size, and the check that it stayed flat while a
//!   test drove a bound past its limit.
//! - [`http_get`]: a minimal HTTP/1.1 GET over loopback for `/health`, `/version`, `/metrics`.
//! - [`grpc_error`] / [`assert_grpc_error`]: the gRPC code and message of an `etcd_client::Error`;
//!   messages must be byte-identical to etcd's because clients match on them.
//!
//! # Environment
//!
//! | variable | effect |
//! |---|---|
//! | `ETCDRS_TEST_ETCD_BIN` | server binary to run instead of the caller's default |
//! | `ETCDRS_TEST_ETCDCTL` | `etcdctl` binary (default `/usr/bin/etcdctl`, else `etcdctl` on `PATH`) |
//! | `ETCDRS_TEST_KEEP` | if set, members keep their temp dir (data + `etcd.log`) and print its path |
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use etcdrs_testkit::{EtcdBin, Member, MemberOpts};
//! let bin = EtcdBin::resolve("/path/to/our/etcd");
//! let member = Member::start(MemberOpts::new(&bin).arg("--max-txn-ops=4")).await?;
//! let mut client = member.client().await?;
//! client.put("k", "v", None).await?;
//! assert!(member.log_contains("ready to serve client requests"));
//! # Ok(()) }
//! ```

mod bin;
pub mod certs;
mod cluster;
pub mod dns;
mod etcdctl;
mod grpc;
mod http;
#[cfg(test)]
mod layering;
mod member;
pub mod memory;
mod poll;
pub mod ports;
pub mod powerloss;
mod relay;
mod relayed;

pub use bin::EtcdBin;
pub use cluster::{Cluster, ClusterOpts};
pub use etcdctl::{CtlOutput, Etcdctl};
pub use grpc::{Code, assert_grpc_error, grpc_error};
pub use http::{
    HttpResponse, http_get, http_request, https_get, served_certificate, tls_connector,
    tls12_handshake, tls13_handshake,
};
pub use member::{ClientTls, FAST_ELECTION_MS, FAST_HEARTBEAT_MS, Member, MemberOpts, PeerTls};
pub use poll::{poll_until, wait_child};
pub use relay::{Captured, Relay};
pub use relayed::RelayedCluster;
