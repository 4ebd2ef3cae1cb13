//! The DNS resolver the binary hands to SRV bootstrap, the gateway and the gRPC proxy: the
//! system's, or, when `ETCDRS_DNS_SERVER=<ip>:<port>` is set, that one name server (so that tests
//! can point a real binary at a DNS server on a loopback port; it is not an etcd setting). The
//! libraries take the resolver as a parameter and read no environment.

use std::net::SocketAddr;

use anyhow::Context as _;
use etcdrs_discovery::srv::SrvResolver;

/// The environment variable naming a DNS server to use instead of the system's.
pub const DNS_SERVER_ENV: &str = "ETCDRS_DNS_SERVER";

/// The resolver this process uses.
pub fn resolver() -> anyhow::Result<SrvResolver> {
    match std::env::var(DNS_SERVER_ENV) {
        Ok(value) if !value.is_empty() => {
            let addr: SocketAddr = value.parse().with_context(|| {
                format!("invalid {DNS_SERVER_ENV} {value:?}: expected <ip>:<port>")
            })?;
            Ok(SrvResolver::with_server(addr)?)
        }
        _ => Ok(SrvResolver::system()?),
    }
}
