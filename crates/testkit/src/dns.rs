//! A real DNS server on a loopback port, for SRV discovery tests.
//!
//! [`DnsServer::start`] serves one authoritative zone (hickory-server, in memory) over UDP and
//! TCP on `127.0.0.1` at the same ephemeral port; point a program at it with
//! `ETCDRS_DNS_SERVER=<addr>` (read by the `etcd` binary's `dns` module). Records can be added while it runs
//! ([`DnsServer::add_srv`], [`DnsServer::add_a`]), so tests can check that a program re-resolves.
//! Names not in the zone get NXDOMAIN-style empty answers, as from any authoritative server.
//!
//! Like [`crate::Relay`], the server runs on its own OS thread with its own runtime, so it keeps
//! answering whatever the test's runtime is doing. Dropping it stops the server.

use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record};
use hickory_server::Server;
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use tokio::sync::oneshot;

/// TTL given to every record: short, so that resolvers re-ask soon.
const TTL: u32 = 1;

/// An authoritative DNS server for one zone on `127.0.0.1` (UDP and TCP, same port).
pub struct DnsServer {
    addr: SocketAddr,
    origin: Name,
    zone: Arc<InMemoryZoneHandler>,
    serial: AtomicU32,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Starts a server for `domain` (e.g. `example.test`), with only its SOA record.
    pub fn start(domain: &str) -> anyhow::Result<DnsServer> {
        let origin = Name::from_str(&format!("{}.", domain.trim_end_matches('.')))
            .with_context(|| format!("bad zone name {domain:?}"))?;
        let mut zone =
            InMemoryZoneHandler::empty(origin.clone(), ZoneType::Primary, AxfrPolicy::Deny);
        let soa = SOA::new(
            Name::from_str("ns.")?.append_domain(&origin)?,
            Name::from_str("admin.")?.append_domain(&origin)?,
            1,
            60,
            60,
            600,
            TTL,
        );
        if !zone.upsert_mut(Record::from_rdata(origin.clone(), TTL, RData::SOA(soa)), 1) {
            bail!("cannot add the SOA record");
        }
        let zone = Arc::new(zone);

        // Bind UDP first on an ephemeral port, then TCP on the same port (retrying a few
        // times in the unlikely case that TCP port is taken).
        let (udp, tcp) = {
            let mut bound = None;
            for _ in 0..20 {
                let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
                let port = udp.local_addr()?.port();
                if let Ok(tcp) = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                    bound = Some((udp, tcp));
                    break;
                }
            }
            bound.context("no port free for both UDP and TCP")?
        };
        let addr = udp.local_addr()?;
        udp.set_nonblocking(true)?;
        tcp.set_nonblocking(true)?;

        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        let handler = zone.clone();
        let handler_origin = LowerName::new(&origin);
        // Task: the DNS server, on its own thread and runtime; stopped by `stop_tx` (on drop).
        let thread = std::thread::Builder::new()
            .name(format!("dns-{}", addr.port()))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut catalog = Catalog::new();
                    catalog.upsert(handler_origin, vec![handler as Arc<dyn ZoneHandler>]);
                    let mut server = Server::new(catalog);
                    let registered = (|| -> anyhow::Result<()> {
                        server.register_socket(tokio::net::UdpSocket::from_std(udp)?);
                        server.register_listener(
                            tokio::net::TcpListener::from_std(tcp)?,
                            Duration::from_secs(5),
                            65536,
                        );
                        Ok(())
                    })();
                    let failed = registered.is_err();
                    let _ = ready_tx.send(registered);
                    if failed {
                        return;
                    }
                    tokio::select! {
                        _ = stop_rx => {}
                        _ = server.block_until_done() => {}
                    }
                    let _ = server.shutdown_gracefully().await;
                });
            })?;
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("DNS server thread did not start")??;
        Ok(DnsServer {
            addr,
            origin,
            zone,
            serial: AtomicU32::new(1),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address (UDP and TCP) to query, for `ETCDRS_DNS_SERVER`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The zone's domain, without the trailing dot.
    pub fn domain(&self) -> String {
        self.origin.to_utf8().trim_end_matches('.').to_string()
    }

    /// `name` as a fully qualified name: kept if it ends with `.`, else relative to the zone
    /// (`"m1"` is `m1.<domain>.`).
    pub fn fqdn(&self, name: &str) -> anyhow::Result<Name> {
        if name.ends_with('.') {
            return Ok(Name::from_str(name)?);
        }
        Ok(Name::from_str(name)?.append_domain(&self.origin)?)
    }

    async fn upsert(&self, record: Record) -> anyhow::Result<()> {
        let serial = self.serial.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.zone.upsert(record, serial).await {
            bail!("record not added (already present?)");
        }
        Ok(())
    }

    /// Adds an SRV record `name` (e.g. `_etcd-client._tcp`, relative to the zone) pointing at
    /// `target:port` (target relative to the zone unless it ends with `.`).
    pub async fn add_srv(
        &self,
        name: &str,
        priority: u16,
        weight: u16,
        port: u16,
        target: &str,
    ) -> anyhow::Result<()> {
        let srv = SRV::new(priority, weight, port, self.fqdn(target)?);
        self.upsert(Record::from_rdata(self.fqdn(name)?, TTL, RData::SRV(srv)))
            .await
    }

    /// Adds an A record `host` (relative to the zone unless it ends with `.`) for `ip`.
    pub async fn add_a(&self, host: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        self.upsert(Record::from_rdata(self.fqdn(host)?, TTL, RData::A(A(ip))))
            .await
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queries the server with the same resolver library the binaries use.
    #[tokio::test]
    async fn serves_srv_and_a_records_and_changes() -> anyhow::Result<()> {
        use hickory_proto::rr::RecordType;
        let dns = DnsServer::start("example.test")?;
        dns.add_a("m1", Ipv4Addr::new(127, 0, 0, 5)).await?;
        dns.add_srv("_etcd-client._tcp", 10, 3, 2379, "m1").await?;
        let first = resolver(dns.addr())?;
        let found = first
            .lookup("_etcd-client._tcp.example.test.", RecordType::SRV)
            .await?;
        let srvs: Vec<_> = found
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(s) => Some((s.priority, s.weight, s.port, s.target.to_utf8())),
                _ => None,
            })
            .collect();
        assert_eq!(srvs, vec![(10, 3, 2379, "m1.example.test.".to_string())]);
        let ips: Vec<_> = first.lookup_ip("m1.example.test.").await?.iter().collect();
        assert_eq!(
            ips,
            vec![std::net::IpAddr::from(Ipv4Addr::new(127, 0, 0, 5))]
        );

        dns.add_srv("_etcd-client._tcp", 5, 1, 2380, "m2").await?;
        let again = resolver(dns.addr())?
            .lookup("_etcd-client._tcp.example.test.", RecordType::SRV)
            .await?;
        assert_eq!(again.answers().len(), 2);
        Ok(())
    }

    fn resolver(addr: SocketAddr) -> anyhow::Result<hickory_resolver::TokioResolver> {
        use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
        let mut udp = ConnectionConfig::udp();
        udp.port = addr.port();
        let mut tcp = ConnectionConfig::tcp();
        tcp.port = addr.port();
        let config = ResolverConfig::from_name_servers(vec![NameServerConfig::new(
            addr.ip(),
            true,
            vec![udp, tcp],
        )]);
        Ok(hickory_resolver::TokioResolver::builder_with_config(
            config,
            hickory_server::net::runtime::TokioRuntimeProvider::default(),
        )
        .build()?)
    }
}
