//! etcd's defaults, and every flag's default parsing as its flag's type.

use std::time::Duration;

use super::*;
use crate::config::model::MODELED;

#[test]
fn defaults_match_etcd() {
    let (cfg, parsed) = run(&[], &[]);
    assert_eq!(cfg.name, "default");
    assert_eq!(cfg.data_dir, "default.etcd");
    assert_eq!(cfg.wal_dir, "");
    assert_eq!(cfg.snapshot_count, 100_000);
    assert_eq!(cfg.heartbeat_interval, 100);
    assert_eq!(cfg.election_timeout, 1000);
    assert_eq!(strings(&cfg.listen_peer_urls), ["http://localhost:2380"]);
    assert_eq!(strings(&cfg.listen_client_urls), ["http://localhost:2379"]);
    assert_eq!(
        strings(&cfg.advertise_client_urls),
        ["http://localhost:2379"]
    );
    assert_eq!(
        strings(&cfg.initial_advertise_peer_urls),
        ["http://localhost:2380"]
    );
    assert_eq!(cfg.initial_cluster, "default=http://localhost:2380");
    assert_eq!(cfg.initial_cluster_state, ClusterState::New);
    assert_eq!(cfg.initial_cluster_token, "etcd-cluster");
    assert_eq!(cfg.quota_backend_bytes, 0);
    assert_eq!(cfg.backend_quota(), Some(2 * 1024 * 1024 * 1024));
    assert_eq!(cfg.max_request_bytes, 1_572_864);
    assert_eq!(cfg.max_txn_ops, 128);
    assert_eq!(cfg.max_concurrent_streams, u32::MAX);
    assert_eq!(cfg.grpc_keepalive_min_time, Duration::from_secs(5));
    assert_eq!(cfg.grpc_keepalive_interval, Duration::from_secs(7200));
    assert_eq!(cfg.grpc_keepalive_timeout, Duration::from_secs(20));
    assert_eq!(cfg.auto_compaction_mode, "periodic");
    assert_eq!(cfg.auto_compaction_retention, "0");
    assert_eq!(cfg.auto_compaction, AutoCompaction::Off);
    assert_eq!(cfg.log_level, "info");
    assert_eq!(cfg.logger, "zap");
    assert_eq!(cfg.log_outputs, ["default"]);
    assert_eq!(cfg.metrics, "basic");
    assert!(cfg.strict_reconfig_check);
    assert!(cfg.pre_vote);
    assert!(!cfg.enable_v2);
    assert!(!cfg.enable_pprof);
    assert!(cfg.enable_grpc_gateway);
    assert_eq!(cfg.cors, ["*"]);
    assert_eq!(cfg.host_whitelist, ["*"]);
    assert_eq!(cfg.self_signed_cert_validity, 1);
    assert_eq!(cfg.discovery_fallback, "proxy");
    assert_eq!(cfg.proxy, "off");
    assert_eq!(cfg.tls_min_version, "TLS1.2");
    assert_eq!(
        cfg.experimental_compact_hash_check_time,
        Duration::from_secs(60)
    );
    assert_eq!(
        cfg.experimental_warning_apply_duration,
        Duration::from_millis(100)
    );
    assert_eq!(cfg.experimental_snapshot_catchup_entries, 5000);
    assert_eq!(cfg.raft_read_timeout, Duration::from_secs(5));
    assert_eq!(cfg.extra.get("auth-token").map(String::as_str), None);
    assert_eq!(
        cfg.extra.get("enable-log-rotation").map(String::as_str),
        Some("false")
    );
    assert_eq!(
        cfg.extra
            .get("experimental-downgrade-check-time")
            .map(String::as_str),
        Some("5s")
    );
    assert_eq!(cfg.config_file, None);
    assert!(
        parsed
            .warnings
            .contains(&"'data-dir' was empty; using default data-dir=default.etcd".to_string())
    );
    assert_eq!(cfg.initial_cluster_members().unwrap().len(), 1);
}

#[test]
fn every_flag_default_parses_and_modeled_names_exist() {
    for def in flags::FLAGS {
        let mut probe = FlagSet::new();
        if !def.default.is_empty() && !matches!(def.kind, flags::Kind::Ignored) {
            let as_arg = format!("--{}={}", def.name, def.default);
            assert!(
                probe.parse_args(&[as_arg]).is_ok(),
                "default of {}",
                def.name
            );
        }
    }
    for name in MODELED {
        assert!(
            flags::FLAGS.iter().any(|def| def.name == *name),
            "{name} is not a flag"
        );
    }
}
