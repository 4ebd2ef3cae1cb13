//! Endpoints from DNS SRV (`--discovery-srv`), with etcd's rules (etcd `etcdmain.discoverEndpoints`):
//! `_etcd-client-ssl._tcp.<domain>` and `_etcd-client._tcp.<domain>` (with the
//! `-<--discovery-srv-name>` suffix) are both looked up; without `--insecure-discovery` a target is
//! kept only if it is a TLS target whose handshake verifies against `--trusted-ca-file` with the
//! domain as server name. Unlike etcd, the lookup is repeated every refresh interval.

use std::time::Duration;

use etcdrs_discovery::srv::{self, SrvResolver, SrvTarget};

use crate::pool::{EndpointSpec, ProbeKind};
use crate::probe::Prober;

/// etcd's timeout for validating a discovered TLS endpoint.
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(5);

/// SRV discovery settings.
pub(crate) struct Discovery {
    pub(crate) resolver: SrvResolver,
    pub(crate) domain: String,
    pub(crate) srv_name: String,
    pub(crate) insecure: bool,
}

fn url(scheme: &str, target: &SrvTarget) -> String {
    format!("{scheme}://{}", target.host_port())
}

fn spec(target: &SrvTarget, probe: ProbeKind) -> EndpointSpec {
    EndpointSpec {
        key: target.host_port(),
        addrs: target.socket_addrs(),
        priority: target.priority,
        weight: target.weight,
        probe,
    }
}

impl Discovery {
    /// Looks the endpoints up and validates them. `Err` when both SRV lookups fail; `Ok` with
    /// the usable endpoints otherwise (possibly none), and why others were dropped.
    pub(crate) async fn discover(
        &self,
        prober: &Prober,
        quiet: bool,
    ) -> Result<(Vec<EndpointSpec>, Option<String>), String> {
        let targets = srv::client_targets(&self.resolver, &self.domain, &self.srv_name).await?;
        let found: Vec<String> = targets
            .secure
            .iter()
            .map(|t| url("https", t))
            .chain(targets.insecure.iter().map(|t| url("http", t)))
            .collect();
        if !quiet {
            tracing::info!(srv_server = %self.domain, endpoints = ?found, "discovered cluster from SRV");
        }
        if self.insecure {
            let specs = targets
                .secure
                .iter()
                .map(|t| spec(t, ProbeKind::Plain))
                .chain(targets.insecure.iter().map(|t| spec(t, ProbeKind::Plain)))
                .collect();
            return Ok((specs, None));
        }
        if !quiet {
            tracing::info!(srv_server = %self.domain, endpoints = ?found, "validating discovered SRV endpoints");
        }
        let mut errors: Vec<String> = Vec::new();
        let mut specs = Vec::new();
        for target in &targets.secure {
            let checker = Prober {
                answer_timeout: VALIDATE_TIMEOUT,
                dial_timeout: VALIDATE_TIMEOUT,
                ..prober.clone()
            };
            match checker.probe(&target.socket_addrs(), true).await {
                Ok(()) => specs.push(spec(target, ProbeKind::Tls)),
                Err(e) => errors.push(format!("{:?} failed to dial ({e})", url("https", target))),
            }
        }
        for target in &targets.insecure {
            errors.push(format!("{:?} is insecure", url("http", target)));
        }
        let kept: Vec<String> = specs.iter().map(|s| format!("https://{}", s.key)).collect();
        let why = (!errors.is_empty()).then(|| errors.join(","));
        if !quiet {
            match &why {
                Some(e) => tracing::warn!(
                    srv_server = %self.domain,
                    endpoints = ?kept,
                    error = %e,
                    "failed to validate discovered endpoints"
                ),
                None => tracing::info!(
                    srv_server = %self.domain,
                    endpoints = ?kept,
                    "using validated discovered SRV endpoints"
                ),
            }
        }
        Ok((specs, why))
    }
}
