//! DNS SRV bootstrap of a member (etcd's `GetDNSClusterNames` over `srv.GetCluster`): the
//! initial cluster is read from `_etcd-server-ssl[-<name>]._tcp.<domain>` (https peers) and
//! `_etcd-server[-<name>]._tcp.<domain>` (http peers), merged; either may be missing (etcd
//! 3.4's #11321 failed without the ssl record). The target whose address and port are one
//! of this member's advertised peer URLs takes this member's name (and must use the same
//! scheme); the others are named `0`, `1`, ... .

use std::net::SocketAddr;

use crate::srv::{SrvResolver, SrvTarget, service_name};

/// What the SRV records say about the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvCluster {
    /// `name=scheme://host:port` entries, ssl targets first.
    pub entries: Vec<String>,
    /// Whether some peer is reached over TLS (etcd then verifies peers against the domain
    /// when no peer CA is given).
    pub tls: bool,
}

/// Looks up the cluster of `domain` for the member `name` advertising `peer_urls`. Errors
/// are etcd's texts; the lookup of one service failing is logged and tolerated while the
/// other one gives targets.
pub async fn get_cluster(
    resolver: &SrvResolver,
    domain: &str,
    srv_name: &str,
    name: &str,
    peer_urls: &[url::Url],
) -> Result<SrvCluster, String> {
    // Where this member is reached, as addresses.
    let mut own: Vec<(SocketAddr, String)> = Vec::new();
    for url in peer_urls {
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(2380);
        let addrs = match host {
            "localhost" => vec![
                std::net::IpAddr::from([127, 0, 0, 1]),
                std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            ],
            _ => resolver
                .lookup_host(host)
                .await
                .map_err(|e| e.to_string())?,
        };
        own.extend(
            addrs
                .into_iter()
                .map(|ip| (SocketAddr::new(ip, port), url.scheme().to_owned())),
        );
    }
    let mut temp_name = 0usize;
    let mut entries = Vec::new();
    let mut tls = false;
    let mut errors = Vec::new();
    for (scheme, secure) in [("https", true), ("http", false)] {
        let service = service_name("etcd-server", secure, srv_name);
        let found = match resolver.lookup(&service, domain).await {
            Ok(targets) => cluster_entries(&targets, scheme, &service, name, &own, &mut temp_name),
            Err(e) => Err(format!("error querying DNS SRV records for _{service} {e}")),
        };
        match found {
            Ok(mut found) => {
                tracing::info!(
                    service_scheme = scheme,
                    service_name = %service,
                    server_name = %name,
                    discovery_srv = %domain,
                    found_cluster = ?found,
                    "get cluster for {} SRV",
                    service_name("etcd-server", secure, "")
                );
                tls |= secure && !found.is_empty();
                entries.append(&mut found);
            }
            Err(e) => {
                tracing::info!(
                    service_scheme = scheme,
                    service_name = %service,
                    server_name = %name,
                    discovery_srv = %domain,
                    error = %e,
                    "get cluster for {} SRV",
                    service_name("etcd-server", secure, "")
                );
                errors.push(e);
            }
        }
    }
    if entries.is_empty() {
        return Err(errors.join("\n"));
    }
    if !errors.is_empty() {
        tracing::warn!(error = %errors.join("; "), "failed to resolve during SRV discovery");
    }
    for entry in &entries {
        tracing::info!(node = %entry, "got bootstrap from DNS for etcd-server");
    }
    if !entries
        .iter()
        .any(|e| e.split_once('=').is_some_and(|(n, _)| n == name))
    {
        return Err(format!(
            "cannot find local etcd member \"{name}\" in SRV records"
        ));
    }
    Ok(SrvCluster { entries, tls })
}

/// The entries of one service's targets (etcd's `updateNodeMap`).
fn cluster_entries(
    targets: &[SrvTarget],
    scheme: &str,
    service: &str,
    name: &str,
    own: &[(SocketAddr, String)],
    temp_name: &mut usize,
) -> Result<Vec<String>, String> {
    let mut entries = Vec::new();
    let mut error = None;
    for target in targets {
        let url = format!("{scheme}://{}", target.host_port());
        let mine = target
            .socket_addrs()
            .iter()
            .find_map(|addr| own.iter().find(|(a, _)| a == addr).map(|(_, s)| s.clone()));
        match mine {
            Some(own_scheme) if own_scheme != scheme => {
                error = Some(format!(
                    "error querying DNS SRV records for _{service} bootstrap at {url} from DNS for {service} has scheme mismatch with expected peer {own_scheme}://{}",
                    target.host_port()
                ));
            }
            Some(_) => entries.push(format!("{name}={url}")),
            None => {
                entries.push(format!("{temp_name}={url}"));
                *temp_name += 1;
            }
        }
    }
    match (entries.is_empty(), error) {
        (true, Some(e)) => Err(e),
        _ => Ok(entries),
    }
}
