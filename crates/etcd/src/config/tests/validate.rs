//! etcd's checks after parsing: validation errors, listen URLs, auto-compaction, the initial
//! cluster.

use std::time::Duration;

use super::*;
use crate::config::validate::ERR_UNSET_ADVERTISE_CLIENT_URLS;

#[test]
fn validation_errors_match_etcd() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--heartbeat-interval=0"],
            "--heartbeat-interval must be >0 (set to 0ms)",
        ),
        (
            &["--election-timeout=400"],
            "--election-timeout[400ms] should be at least as 5 times as --heartbeat-interval[100ms]",
        ),
        (
            &["--election-timeout=60000"],
            "--election-timeout[60000ms] is too long, and should be set less than 50000ms",
        ),
        (
            &["--auto-compaction-mode=foo"],
            "unknown auto-compaction-mode \"foo\"",
        ),
        (&["--logger=foo"], "unknown logger option \"foo\""),
        (
            &["--logger=capnslog"],
            "--logger=capnslog is removed in v3.5",
        ),
        (
            &["--log-outputs=default,stderr"],
            "multi logoutput for \"default\" is not supported yet",
        ),
        (
            &[
                "--discovery-srv=example.com",
                "--initial-cluster=default=http://localhost:2380",
            ],
            "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\"",
        ),
        (
            &[
                "--listen-client-urls=http://example.com:2379",
                "--advertise-client-urls=http://a:1",
            ],
            "expected IP in URL for binding (http://example.com:2379)",
        ),
        (
            &["--advertise-client-urls=http://:2379"],
            "--advertise-client-urls \"http://:2379\" must be \"host:port\" (unexpected empty host (http://:2379))",
        ),
        (
            &["--experimental-enable-lease-checkpoint-persist"],
            "setting experimental-enable-lease-checkpoint-persist requires experimental-enable-lease-checkpoint",
        ),
        (
            &["--tls-min-version=TLS1.1"],
            "unexpected TLS version \"TLS1.1\" (must be one of: TLS1.2, TLS1.3)",
        ),
        (
            &["--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"],
            "min version (TLS1.3) is greater than max version (TLS1.2)",
        ),
        (
            &["--experimental-compact-hash-check-time=0s"],
            "--experimental-compact-hash-check-time must be >0 (set to 0s)",
        ),
        (
            &["--discovery-token=t"],
            "both --discovery-token and --discovery-endpoints must be set",
        ),
    ];
    for (list, want) in cases {
        let err = fail(list, &[]);
        assert_eq!((err.exit_code, err.error.as_str()), (1, *want), "{list:?}");
    }
    let err = fail(&["--listen-client-urls=http://127.0.0.1:2379"], &[]);
    assert_eq!(err.error, ERR_UNSET_ADVERTISE_CLIENT_URLS);
    assert_eq!(err.message.lines().count(), 2);
    assert!(err.message.contains("advertise client URLs are not set"));

    let err = fail(&["--log-level=foo"], &[]);
    assert_eq!(err.exit_code, 2);
    assert_eq!(err.message, "panic: unrecognized level: \"foo\"\n");
    let (cfg, _) = run(&["--log-level=WARN"], &[]);
    assert_eq!(cfg.log_level, "warn");
}

#[test]
fn listen_urls_and_proxy_exemption() {
    let (cfg, _) = run(
        &[
            "--listen-client-urls=http://127.0.0.2:1,http://127.0.0.1:1",
            "--advertise-client-urls",
            "http://10.0.0.1:2379",
        ],
        &[],
    );
    assert_eq!(
        strings(&cfg.listen_client_urls),
        ["http://127.0.0.1:1", "http://127.0.0.2:1"]
    );
    assert_eq!(
        strings(&cfg.advertise_client_urls),
        ["http://10.0.0.1:2379"]
    );
    // The v2 proxy exemption keeps the default advertise URL.
    let (cfg, _) = run(
        &["--listen-client-urls=http://127.0.0.1:1", "--proxy=on"],
        &[],
    );
    assert_eq!(
        strings(&cfg.advertise_client_urls),
        ["http://localhost:2379"]
    );
    // An empty value keeps the URLs (etcd's allowed exception).
    let (cfg, _) = run(&["--listen-peer-urls="], &[]);
    assert_eq!(strings(&cfg.listen_peer_urls), ["http://localhost:2380"]);
    let (cfg, _) = run(
        &[
            "--listen-peer-urls=unix://etcd.sock:1",
            "--initial-cluster=default=unix://etcd.sock:1",
            "--initial-advertise-peer-urls=unix://etcd.sock:1",
        ],
        &[],
    );
    assert_eq!(strings(&cfg.listen_peer_urls), ["unix://etcd.sock:1"]);
    let (cfg, _) = run(
        &[
            "--listen-client-urls=http://127.0.0.1:80",
            "--advertise-client-urls=http://127.0.0.1:80",
        ],
        &[],
    );
    assert_eq!(strings(&cfg.listen_client_urls), ["http://127.0.0.1:80"]);
}

#[test]
fn auto_compaction_follows_etcds_rules() {
    let hour = Duration::from_secs(3600);
    let cases: &[(&str, &str, AutoCompaction)] = &[
        ("periodic", "0", AutoCompaction::Off),
        ("periodic", "", AutoCompaction::Off),
        ("periodic", "1", AutoCompaction::Periodic(hour)),
        ("periodic", "72", AutoCompaction::Periodic(hour * 72)),
        (
            "periodic",
            "30m",
            AutoCompaction::Periodic(Duration::from_secs(1800)),
        ),
        (
            "periodic",
            "1h30m",
            AutoCompaction::Periodic(Duration::from_secs(5400)),
        ),
        ("periodic", "+2", AutoCompaction::Periodic(hour * 2)),
        ("revision", "1000", AutoCompaction::Revision(1000)),
        ("revision", "0", AutoCompaction::Off),
        (
            "revision",
            "1h",
            AutoCompaction::Revision(3_600_000_000_000),
        ),
        ("", "5", AutoCompaction::Off),
    ];
    for (mode, retention, want) in cases {
        assert_eq!(
            AutoCompaction::parse(mode, retention),
            Ok(*want),
            "{mode} {retention}"
        );
    }
    assert_eq!(
        AutoCompaction::parse("periodic", "abc").unwrap_err(),
        "error parsing CompactionRetention: time: invalid duration \"abc\""
    );
    assert_eq!(
        AutoCompaction::parse("periodic", "-1").unwrap_err(),
        "error parsing CompactionRetention: time: missing unit in duration \"-1\""
    );
    assert_eq!(
        AutoCompaction::parse("", "5m").unwrap_err(),
        "unsupported compaction mode "
    );
    let (cfg, _) = run(&["--auto-compaction-retention=2"], &[]);
    assert_eq!(cfg.auto_compaction, AutoCompaction::Periodic(hour * 2));
    let (cfg, _) = run(
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "500",
        ],
        &[],
    );
    assert_eq!(cfg.auto_compaction, AutoCompaction::Revision(500));
    let err = fail(&["--auto-compaction-retention=abc"], &[]);
    assert_eq!(err.exit_code, 1);
    assert!(err.message.contains("\"msg\":\"discovery failed\""));
}

#[test]
fn initial_cluster_parsing() {
    let (cfg, _) = run(
        &[
            "--name=b",
            "--initial-advertise-peer-urls=http://10.0.0.2:2380",
            "--initial-cluster=b=http://10.0.0.2:2380,a=http://10.0.0.1:2380,a=http://10.0.0.1:2381",
        ],
        &[],
    );
    let members: Vec<(String, String)> = cfg
        .initial_cluster_members()
        .unwrap()
        .iter()
        .map(|(name, url)| (name.clone(), etcdrs_server::url_string(url)))
        .collect();
    assert_eq!(
        members,
        [
            ("a".to_string(), "http://10.0.0.1:2380".to_string()),
            ("a".to_string(), "http://10.0.0.1:2381".to_string()),
            ("b".to_string(), "http://10.0.0.2:2380".to_string()),
        ]
    );
    assert!(
        cfg.check_local_member(&cfg.initial_cluster_members().unwrap())
            .is_ok()
    );

    // The default initial cluster follows --name and the advertised peer URLs.
    let (cfg, _) = run(
        &[
            "--name=n",
            "--initial-advertise-peer-urls=http://10.0.0.9:2380,http://10.0.0.8:2380",
        ],
        &[],
    );
    assert_eq!(
        cfg.initial_cluster,
        "n=http://10.0.0.8:2380,n=http://10.0.0.9:2380"
    );
    // A discovery method clears the default.
    let (cfg, _) = run(&["--discovery-srv=example.com"], &[]);
    assert_eq!(cfg.initial_cluster, "");

    let (cfg, _) = run(&["--initial-cluster=foo"], &[]);
    assert_eq!(
        cfg.initial_cluster_members().unwrap_err(),
        "error setting up initial cluster: URL scheme must be http, https, unix, or unixs: "
    );
    let (cfg, _) = run(&["--initial-cluster=other=http://127.0.0.1:2380"], &[]);
    assert_eq!(
        cfg.check_local_member(&cfg.initial_cluster_members().unwrap())
            .unwrap_err(),
        "couldn't find local name \"default\" in the initial cluster configuration"
    );
}
