//! DNS SRV lookups with etcd's naming rules, for every user of SRV discovery: the L4 gateway
//! (`_etcd-client[-ssl]._tcp`), the gRPC proxy and member bootstrap
//! (`_etcd-server[-ssl]._tcp`). Port of the lookup half of etcd's `pkg/srv`.
//!
//! A lookup returns every target of one SRV name with its priority, weight, port and the
//! A/AAAA addresses its host name resolves to, sorted the way Go's `net.LookupSRV` sorts them
//! (priority ascending, then weight descending). What to do with the targets (TLS validation,
//! weighted picking) is the caller's business.
//!
//! # Resolver
//!
//! A resolver is passed in by whoever runs a lookup: [`SrvResolver::system`] reads the system
//! configuration (`/etc/resolv.conf`), [`SrvResolver::with_server`] asks one name server over
//! UDP and TCP (the `etcd` binary uses it when `ETCDRS_DNS_SERVER=<ip>:<port>` is set, so that
//! tests can point a real binary at a DNS server on a loopback port; it is not an etcd
//! setting). Answers are cached for at most one second, so that periodic re-resolution sees
//! record changes.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};

/// The longest an answer is cached: re-resolution must see changes quickly.
const MAX_CACHE_TTL: Duration = Duration::from_secs(1);

pub use crate::error::Error;

pub use crate::error::Result;

/// One SRV target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvTarget {
    /// The target host name, without the trailing dot (as etcd prints it in URLs).
    pub host: String,
    /// The port the service listens on.
    pub port: u16,
    /// Lower is preferred.
    pub priority: u16,
    /// Relative share among targets of the same priority.
    pub weight: u16,
    /// The host's A and AAAA addresses, in the order the resolver gave them.
    pub addrs: Vec<IpAddr>,
}

impl SrvTarget {
    /// `host:port`, the form etcd uses for endpoints (IPv6 literals bracketed).
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The socket addresses to dial, one per resolved address.
    pub fn socket_addrs(&self) -> Vec<SocketAddr> {
        self.addrs
            .iter()
            .map(|ip| SocketAddr::new(*ip, self.port))
            .collect()
    }
}

/// etcd's `GetSRVService`: `<service>[-ssl][-<srv_name>]`, e.g. `etcd-client-ssl-prod`.
pub fn service_name(service: &str, tls: bool, srv_name: &str) -> String {
    let mut name = service.to_string();
    if tls {
        name.push_str("-ssl");
    }
    if !srv_name.is_empty() {
        name.push('-');
        name.push_str(srv_name);
    }
    name
}

/// The fully qualified SRV name queried for `service` under `domain`:
/// `_<service>._tcp.<domain>.`.
pub fn srv_query_name(service: &str, domain: &str) -> String {
    let domain = domain.trim_end_matches('.');
    format!("_{service}._tcp.{domain}.")
}

/// A DNS resolver for SRV discovery (see the module doc for how it is configured).
#[derive(Clone)]
pub struct SrvResolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for SrvResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrvResolver").finish_non_exhaustive()
    }
}

impl SrvResolver {
    /// The system resolver (`/etc/resolv.conf`).
    pub fn system() -> Result<SrvResolver> {
        let mut builder =
            TokioResolver::builder_tokio().map_err(|e| Error::SystemConfig(e.to_string()))?;
        tune(builder.options_mut());
        let inner = builder
            .build()
            .map_err(|e| Error::SystemConfig(e.to_string()))?;
        Ok(SrvResolver { inner })
    }

    /// A resolver asking only the name server at `addr`, over UDP and TCP.
    pub fn with_server(addr: SocketAddr) -> Result<SrvResolver> {
        let mut udp = ConnectionConfig::udp();
        udp.port = addr.port();
        let mut tcp = ConnectionConfig::tcp();
        tcp.port = addr.port();
        let server = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
        let config = ResolverConfig::from_name_servers(vec![server]);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
        tune(builder.options_mut());
        let inner = builder
            .build()
            .map_err(|e| Error::SystemConfig(e.to_string()))?;
        Ok(SrvResolver { inner })
    }

    /// The SRV targets of `_<service>._tcp.<domain>`, each with its addresses resolved, sorted
    /// by priority (ascending) then weight (descending). A target whose host has no address is
    /// left out (and logged); if that leaves nothing, the last host error is returned.
    pub async fn lookup(&self, service: &str, domain: &str) -> Result<Vec<SrvTarget>> {
        let name = srv_query_name(service, domain);
        let lookup = self
            .inner
            .lookup(name.as_str(), RecordType::SRV)
            .await
            .map_err(|e| Error::Srv {
                name: name.clone(),
                reason: e.to_string(),
            })?;
        let mut records: Vec<(u16, u16, u16, String)> = lookup
            .answers()
            .iter()
            .filter_map(|record| match &record.data {
                RData::SRV(srv) => Some((
                    srv.priority,
                    srv.weight,
                    srv.port,
                    srv.target.to_utf8().trim_end_matches('.').to_string(),
                )),
                _ => None,
            })
            // A target of "." means the service is decidedly not available (RFC 2782).
            .filter(|(_, _, _, host)| !host.is_empty())
            .collect();
        if records.is_empty() {
            return Err(Error::Srv {
                name,
                reason: "no SRV records".to_string(),
            });
        }
        records.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut targets = Vec::with_capacity(records.len());
        let mut last_error = None;
        for (priority, weight, port, host) in records {
            match self.lookup_host(&host).await {
                Ok(addrs) => targets.push(SrvTarget {
                    host,
                    port,
                    priority,
                    weight,
                    addrs,
                }),
                Err(e) => {
                    tracing::warn!(srv = %name, target = %host, error = %e, "cannot resolve SRV target");
                    last_error = Some(e);
                }
            }
        }
        match (targets.is_empty(), last_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(targets),
        }
    }

    /// The A and AAAA addresses of `host` (an IP literal resolves to itself).
    pub async fn lookup_host(&self, host: &str) -> Result<Vec<IpAddr>> {
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse() {
            return Ok(vec![ip]);
        }
        // Fully qualified, so that no search domain is tried first.
        let fqdn = format!("{}.", host.trim_end_matches('.'));
        let found = self
            .inner
            .lookup_ip(fqdn.as_str())
            .await
            .map_err(|e| Error::Host {
                host: host.to_string(),
                reason: e.to_string(),
            })?;
        let addrs: Vec<IpAddr> = found.iter().collect();
        if addrs.is_empty() {
            return Err(Error::Host {
                host: host.to_string(),
                reason: "no addresses".to_string(),
            });
        }
        Ok(addrs)
    }
}

/// Resolver options shared by both construction paths: short caching and both address
/// families.
fn tune(opts: &mut ResolverOpts) {
    opts.positive_max_ttl = Some(MAX_CACHE_TTL);
    opts.negative_max_ttl = Some(MAX_CACHE_TTL);
    opts.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
}

/// The client endpoints etcd discovers for `domain`: the targets of `_etcd-client-ssl._tcp`
/// (TLS) and of `_etcd-client._tcp` (plain), each with the optional `-<srv_name>` suffix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTargets {
    /// Targets that speak TLS (`https`).
    pub secure: Vec<SrvTarget>,
    /// Targets that speak plain TCP (`http`).
    pub insecure: Vec<SrvTarget>,
}

/// etcd's `srv.GetClient("etcd-client", domain, srv_name)`: both lookups are made; it is an
/// error only if both fail (`dns lookup errors: <https error> and <http error>`).
pub async fn client_targets(
    resolver: &SrvResolver,
    domain: &str,
    srv_name: &str,
) -> std::result::Result<ClientTargets, String> {
    let secure = resolver
        .lookup(&service_name("etcd-client", true, srv_name), domain)
        .await;
    let insecure = resolver
        .lookup(&service_name("etcd-client", false, srv_name), domain)
        .await;
    match (secure, insecure) {
        (Err(es), Err(ei)) => Err(format!("dns lookup errors: {es} and {ei}")),
        (secure, insecure) => Ok(ClientTargets {
            secure: secure.unwrap_or_default(),
            insecure: insecure.unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_follow_etcd() {
        assert_eq!(service_name("etcd-client", false, ""), "etcd-client");
        assert_eq!(service_name("etcd-client", true, ""), "etcd-client-ssl");
        assert_eq!(
            service_name("etcd-server", true, "prod"),
            "etcd-server-ssl-prod"
        );
        assert_eq!(service_name("etcd-server", false, "a"), "etcd-server-a");
        assert_eq!(
            srv_query_name("etcd-client", "example.com."),
            "_etcd-client._tcp.example.com."
        );
    }

    #[test]
    fn host_port_brackets_ipv6() {
        let mut t = SrvTarget {
            host: "a.example".into(),
            port: 2379,
            priority: 0,
            weight: 0,
            addrs: vec![],
        };
        assert_eq!(t.host_port(), "a.example:2379");
        t.host = "::1".into();
        assert_eq!(t.host_port(), "[::1]:2379");
    }
}
