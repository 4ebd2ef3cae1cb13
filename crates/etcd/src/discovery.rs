//! Bootstrap through a discovery service: before the server starts on an empty data
//! directory, turn `--discovery` (v2) or `--discovery-token`/`--discovery-endpoints` (v3)
//! into the `--initial-cluster` the member then bootstraps with (etcd's
//! `bootstrapNewClusterNoWAL` with `ShouldDiscover`).
//!
//! Nothing is written to the data directory until discovery has succeeded, so a failed
//! attempt leaves nothing a restart could misread. Failures are logged with etcd's texts:
//! any error of the protocol is a "discovery error" (etcd's `DiscoveryError`, "failed to join
//! discovery cluster (...)") with the advice not to reuse the token; both that and other
//! failures exit with status 1, as etcd's do.

use std::time::Duration;

use anyhow::{anyhow, bail};
use etcdrs_discovery::error::Error as DiscoveryError;
use etcdrs_discovery::tls::TlsFiles;
use etcdrs_discovery::{srv_cluster, v2, v3};

use crate::config::EtcdConfig;

/// Whether this member bootstraps through a discovery service or DNS SRV records.
pub fn wanted(cfg: &EtcdConfig) -> bool {
    !cfg.discovery.is_empty()
        || !cfg.discovery_endpoints.is_empty()
        || !cfg.discovery_srv.is_empty()
}

/// `cfg` with `initial_cluster` set from the discovery service or the SRV records.
pub fn bootstrap(cfg: &EtcdConfig) -> anyhow::Result<EtcdConfig> {
    if cfg.discovery.is_empty() && cfg.discovery_endpoints.is_empty() {
        return bootstrap_srv(cfg);
    }
    let peer_urls: Vec<String> = cfg
        .initial_advertise_peer_urls
        .iter()
        .map(etcdrs_server::url_string)
        .collect();
    // As etcd (`PeerURLsMapAndToken`), member and cluster ids are derived with the discovery
    // URL (v2) or token (v3) as the cluster token, so every member using the same discovery
    // setting agrees on them, whatever its --initial-cluster-token.
    let token = if cfg.discovery.is_empty() {
        cfg.discovery_token.clone()
    } else {
        cfg.discovery.clone()
    };
    let id = etcdrs_schema::membership::member_id(&peer_urls, &token);
    // etcd's `InitialPeerURLsMap.String()`: sorted `name=url` pairs.
    let mut pairs: Vec<String> = peer_urls
        .iter()
        .map(|u| format!("{}={u}", cfg.name))
        .collect();
    pairs.sort();
    let entry = pairs.join(",");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = if cfg.discovery.is_empty() {
        let config = v3_config(cfg);
        runtime.block_on(v3::join_cluster(&config, id, &entry))
    } else {
        tracing::warn!("V2 discovery is deprecated!");
        let config = v2::Config {
            url: cfg.discovery.clone(),
            proxy: cfg.discovery_proxy.clone(),
        };
        runtime.block_on(v2::join_cluster(&config, id, &entry))
    };
    drop(runtime);
    let cluster = match outcome {
        Ok(cluster) => cluster,
        Err(e) => {
            log_failure(cfg, &e);
            bail!("failed to join discovery cluster ({e})");
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    for pair in cluster.split(',') {
        let url = pair.split_once('=').map_or("", |(_, u)| u);
        if !seen.insert(url) {
            return Err(anyhow!("discovery cluster {cluster} has duplicate url"));
        }
    }
    let mut out = cfg.clone();
    out.initial_cluster = cluster;
    out.initial_cluster_token = token;
    Ok(out)
}

/// DNS SRV bootstrap (`--discovery-srv`, `--discovery-srv-name`): the cluster from the
/// `_etcd-server-ssl` and `_etcd-server` records; ids use `--initial-cluster-token`, as etcd.
fn bootstrap_srv(cfg: &EtcdConfig) -> anyhow::Result<EtcdConfig> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let found = runtime.block_on(async {
        let resolver = crate::dns::resolver().map_err(|e| format!("{e:#}"))?;
        srv_cluster::get_cluster(
            &resolver,
            &cfg.discovery_srv,
            &cfg.discovery_srv_name,
            &cfg.name,
            &cfg.initial_advertise_peer_urls,
        )
        .await
    });
    drop(runtime);
    let found = found.map_err(|e| {
        tracing::warn!(error = %e, "failed to resolve during SRV discovery");
        anyhow!(e)
    })?;
    let mut out = cfg.clone();
    if found.tls && cfg.peer_trusted_ca_file.is_empty() {
        // Without a CA of its own, a member checks its https peers' certificates (against the
        // system's roots) for the SRV domain rather than each target's name (etcd PR #6084).
        out.peer_tls_server_name = cfg.discovery_srv.trim_end_matches('.').to_owned();
    }
    out.initial_cluster = found.entries.join(",");
    Ok(out)
}

fn v3_config(cfg: &EtcdConfig) -> v3::Config {
    let text = |flag: &str| cfg.extra.get(flag).cloned().unwrap_or_default();
    let path = |flag: &str| Some(text(flag)).filter(|p| !p.is_empty()).map(Into::into);
    let duration = |flag: &str, default: u64| {
        cfg.extra_duration(flag)
            .unwrap_or(Duration::from_secs(default))
    };
    v3::Config {
        endpoints: cfg.discovery_endpoints.clone(),
        token: cfg.discovery_token.clone(),
        dial_timeout: duration("discovery-dial-timeout", 2),
        request_timeout: duration("discovery-request-timeout", 5),
        keepalive_time: duration("discovery-keepalive-time", 2),
        keepalive_timeout: duration("discovery-keepalive-timeout", 6),
        insecure_transport: cfg
            .extra_bool("discovery-insecure-transport")
            .unwrap_or(true),
        tls: TlsFiles {
            cert: path("discovery-cert"),
            key: path("discovery-key"),
            cacert: path("discovery-cacert"),
            insecure_skip_verify: cfg
                .extra_bool("discovery-insecure-skip-tls-verify")
                .unwrap_or(false),
        },
        user: text("discovery-user"),
        password: text("discovery-password"),
    }
}

/// etcd's warnings for a failed discovery (`etcdmain.startEtcdOrProxyV2`).
fn log_failure(cfg: &EtcdConfig, e: &DiscoveryError) {
    let error = format!("failed to join discovery cluster ({e})");
    if cfg.discovery.is_empty() {
        tracing::warn!(
            discovery_token = %cfg.discovery_token,
            discovery_endpoints = ?cfg.discovery_endpoints,
            error = %error,
            "failed to bootstrap; discovery token was already used"
        );
        tracing::warn!("do not reuse discovery token; generate a new one to bootstrap a cluster");
        return;
    }
    match e {
        DiscoveryError::DuplicateId => {
            tracing::warn!(name = %cfg.name, discovery_token = %cfg.discovery, error = %e, "member has been registered with discovery service");
            tracing::warn!(data_dir = %cfg.data_dir, "but could not find valid cluster configuration");
            tracing::warn!("check data dir if previous bootstrap succeeded");
            tracing::warn!("or use a new discovery token if previous bootstrap failed");
        }
        DiscoveryError::DuplicateName => {
            tracing::warn!(discovery_token = %cfg.discovery, error = %e, "member with duplicated name has already been registered");
            tracing::warn!("cURL the discovery token URL for details");
            tracing::warn!(
                "do not reuse discovery token; generate a new one to bootstrap a cluster"
            );
        }
        _ => {
            if matches!(e, DiscoveryError::FullCluster) && cfg.discovery_fallback == "proxy" {
                // etcd 3.5 would run as a v2 proxy here; etcd 3.6 removed that mode, and so
                // did we: the member exits as with --discovery-fallback=exit.
                tracing::warn!(
                    fallback_proxy = "proxy",
                    error = %error,
                    "discovery cluster is full; falling back to proxy is not supported (the v2 proxy was removed in etcd 3.6), exiting"
                );
            }
            tracing::warn!(discovery_token = %cfg.discovery, error = %error, "failed to bootstrap; discovery token was already used");
            tracing::warn!(
                "do not reuse discovery token; generate a new one to bootstrap a cluster"
            );
        }
    }
}
