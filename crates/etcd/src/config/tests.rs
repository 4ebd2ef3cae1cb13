//! The configuration parser's tests: etcd's defaults, flags, `ETCD_*` variables, config files
//! and every error text, each checked against what etcd 3.5 prints.

use std::time::Duration;

use url::Url;

use super::flags::Group;
use super::model::MODELED;
use super::validate::ERR_UNSET_ADVERTISE_CLIENT_URLS;
use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn env(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(list: &[&str], vars: &[(&str, &str)]) -> (EtcdConfig, Parsed) {
    let parsed = match parse(&args(list), &env(vars)) {
        Ok(parsed) => parsed,
        Err(err) => panic!("parse {list:?} failed: {}", err.message),
    };
    match &parsed.command {
        Command::Run(config) => ((**config).clone(), parsed),
        other => panic!("expected Run, got {other:?}"),
    }
}

fn fail(list: &[&str], vars: &[(&str, &str)]) -> ConfigError {
    match parse(&args(list), &env(vars)) {
        Ok(parsed) => panic!("parse {list:?} succeeded: {parsed:?}"),
        Err(err) => err,
    }
}

fn strings(urls: &[Url]) -> Vec<String> {
    urls.iter().map(etcdrs_server::url_string).collect()
}

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

#[test]
fn both_dash_styles_and_value_forms_are_accepted() {
    for form in [
        &["--name", "n1"][..],
        &["-name", "n1"],
        &["--name=n1"],
        &["-name=n1"],
    ] {
        let (cfg, _) = run(form, &[]);
        assert_eq!(cfg.name, "n1", "form {form:?}");
        assert_eq!(cfg.data_dir, "n1.etcd");
        assert_eq!(cfg.initial_cluster, "n1=http://localhost:2380");
    }
    let (cfg, _) = run(&["--name", "a", "--"], &[]);
    assert_eq!(cfg.name, "a");
    // `--` ends the flags; anything after it is a stray argument.
    assert_eq!(
        fail(&["--", "--name=a"], &[]).error,
        "'--name=a' is not a valid flag"
    );
    let (cfg, _) = run(&["--name=x", "--name=y"], &[]);
    assert_eq!(cfg.name, "y");
}

#[test]
fn bool_flags_follow_go_rules() {
    let (cfg, _) = run(&["--enable-pprof"], &[]);
    assert!(cfg.enable_pprof);
    let (cfg, _) = run(&["--strict-reconfig-check=false", "-pre-vote=0"], &[]);
    assert!(!cfg.strict_reconfig_check);
    assert!(!cfg.pre_vote);
    let (cfg, _) = run(&["--force-new-cluster=T"], &[]);
    assert!(cfg.force_new_cluster);

    // A bool flag never takes the next argument: "false" is then a stray argument.
    let err = fail(&["--enable-pprof", "false"], &[]);
    assert_eq!(err.exit_code, 1);
    assert_eq!(err.error, "'false' is not a valid flag");
    assert_eq!(
        err.message,
        "{\"level\":\"warn\",\"msg\":\"failed to verify flags\",\"error\":\"'false' is not a valid flag\"}\n"
    );

    let err = fail(&["--enable-pprof=maybe"], &[]);
    assert_eq!(err.exit_code, 2);
    assert_eq!(
        err.error,
        "invalid boolean value \"maybe\" for -enable-pprof: parse error"
    );
    assert!(err.message.starts_with(
        "invalid boolean value \"maybe\" for -enable-pprof: parse error\nUsage:\n\n  etcd [flags]\n"
    ));
    assert!(err.message.ends_with("proxy for the v3 API.\n\n"));
}

#[test]
fn bad_values_give_etcds_messages() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--quota-backend-bytes=abc"],
            "invalid value \"abc\" for flag -quota-backend-bytes: parse error",
        ),
        (
            &["--heartbeat-interval=-1"],
            "invalid value \"-1\" for flag -heartbeat-interval: parse error",
        ),
        (
            &["--snapshot-count", "1e3"],
            "invalid value \"1e3\" for flag -snapshot-count: parse error",
        ),
        (
            &["--grpc-keepalive-interval=5"],
            "invalid value \"5\" for flag -grpc-keepalive-interval: parse error",
        ),
        (
            &["--max-concurrent-streams=99999999999"],
            "invalid value \"99999999999\" for flag -max-concurrent-streams: strconv.ParseUint: parsing \"99999999999\": value out of range",
        ),
        (
            &["--max-txn-ops=99999999999999999999"],
            "invalid value \"99999999999999999999\" for flag -max-txn-ops: value out of range",
        ),
        (
            &["--initial-cluster-state=foo"],
            "invalid value \"foo\" for flag -initial-cluster-state: invalid value",
        ),
        (
            &["--v2-deprecation=soon"],
            "invalid value \"soon\" for flag -v2-deprecation: invalid value \"soon\"",
        ),
        (
            &["--listen-client-urls=http://127.0.0.1:2379/foo"],
            "invalid value \"http://127.0.0.1:2379/foo\" for flag -listen-client-urls: URL must not contain a path: http://127.0.0.1:2379/foo",
        ),
        (
            &["--listen-client-urls=ftp://127.0.0.1:2379"],
            "invalid value \"ftp://127.0.0.1:2379\" for flag -listen-client-urls: URL scheme must be http, https, unix, or unixs: ftp://127.0.0.1:2379",
        ),
        (
            &["--listen-peer-urls=http://127.0.0.1"],
            "invalid value \"http://127.0.0.1\" for flag -listen-peer-urls: URL address does not have the form \"host:port\": http://127.0.0.1",
        ),
        (
            &["--cors=foo"],
            "invalid value \"foo\" for flag -cors: URL scheme must be http, https, unix, or unixs: foo",
        ),
        (&["--name"], "flag needs an argument: -name"),
        (&["---name=x"], "bad flag syntax: ---name=x"),
        (&["--="], "bad flag syntax: --="),
    ];
    for (list, want) in cases {
        let err = fail(list, &[]);
        assert_eq!(err.exit_code, 2, "{list:?}");
        assert_eq!(err.error, *want, "{list:?}");
        assert!(err.message.starts_with(&format!("{want}\nUsage:\n")));
    }
}

#[test]
fn unknown_flags_and_stray_arguments() {
    let err = fail(&["--bogus"], &[]);
    assert_eq!(err.exit_code, 2);
    assert_eq!(err.error, "flag provided but not defined: -bogus");
    assert_eq!(
        err.message,
        format!("flag provided but not defined: -bogus\n{}\n", usage_text())
    );
    assert_eq!(
        fail(&["-bogus=1"], &[]).error,
        "flag provided but not defined: -bogus"
    );
    let err = fail(&["foo"], &[]);
    assert_eq!(
        (err.exit_code, err.error.as_str()),
        (1, "'foo' is not a valid flag")
    );
    assert_eq!(fail(&["-"], &[]).error, "'-' is not a valid flag");
    // Flag errors come before --version.
    assert_eq!(fail(&["--version", "--bogus"], &[]).exit_code, 2);
}

#[test]
fn help_version_and_subcommands() {
    for form in [
        &["-h"][..],
        &["--help"],
        &["-help=false"],
        &["--name", "x", "-h"],
    ] {
        assert_eq!(parse(&args(form), &[]).unwrap().command, Command::Help);
    }
    for form in [&["--version"][..], &["-version"], &["--version=true"]] {
        assert_eq!(parse(&args(form), &[]).unwrap().command, Command::Version);
    }
    assert_eq!(
        parse(&args(&["gateway", "start", "--endpoints=a"]), &[])
            .unwrap()
            .command,
        Command::Gateway(args(&["start", "--endpoints=a"]))
    );
    assert_eq!(
        parse(&args(&["grpc-proxy", "start"]), &[]).unwrap().command,
        Command::GrpcProxy(args(&["start"]))
    );
    assert_eq!(
        parse(&args(&["snapshot", "status", "x.db"]), &[])
            .unwrap()
            .command,
        Command::Snapshot(args(&["status", "x.db"]))
    );
    let version = version_text();
    assert!(version.starts_with("etcd Version: 3.5."));
    assert!(version.contains("\nGit SHA: "));
    assert!(version.contains("\nGo Version: (none: etcd-rs "));
    assert!(version.contains("\nGo OS/Arch: "));
    let help = help_text();
    for def in flags::FLAGS.iter().filter(|def| def.group != Group::Hidden) {
        assert!(
            help.contains(&format!("  --{} '", def.name)),
            "{}",
            def.name
        );
    }
    assert!(help.contains("  --data-dir '${name}.etcd'"));
}

#[test]
fn environment_fills_flags_and_warns_about_strays() {
    let (cfg, parsed) = run(
        &[],
        &[
            ("ETCD_NAME", "envname"),
            ("ETCD_SNAPSHOT_COUNT", "5"),
            ("ETCD_ENABLE_PPROF", "true"),
            ("ETCD_FOO", "1"),
            ("ETCDCTL_API", "3"),
            ("ETCD_DATA_DIR", ""),
            ("PATH", "/bin"),
        ],
    );
    assert_eq!(cfg.name, "envname");
    assert_eq!(cfg.snapshot_count, 5);
    assert!(cfg.enable_pprof);
    assert_eq!(cfg.data_dir, "envname.etcd");
    assert_eq!(
        parsed
            .warnings
            .iter()
            .filter(|w| w.starts_with("unrecognized environment variable"))
            .collect::<Vec<_>>(),
        [
            "unrecognized environment variable ETCD_FOO=1",
            "unrecognized environment variable ETCD_DATA_DIR="
        ]
    );
    assert!(
        parsed
            .infos
            .contains(&"recognized and used environment variable ETCD_NAME=envname".to_string())
    );

    let (_, parsed) = run(&[], &[("ETCD_VERSION", "1")]);
    assert!(
        parsed.warnings.contains(
            &"cannot set special environment variable key=ETCD_VERSION value=1".to_string()
        )
    );
}

#[test]
fn flag_and_env_for_the_same_setting_is_fatal_as_in_etcd() {
    let err = fail(&["--name", "y"], &[("ETCD_NAME", "x")]);
    assert_eq!(err.exit_code, 1);
    assert_eq!(
        err.message,
        "{\"level\":\"fatal\",\"msg\":\"conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))\",\"environment-variable\":\"ETCD_NAME\"}\n"
    );
    // Different settings from flag and env combine.
    let (cfg, _) = run(&["--name", "y"], &[("ETCD_SNAPSHOT_COUNT", "7")]);
    assert_eq!((cfg.name.as_str(), cfg.snapshot_count), ("y", 7));
}

#[test]
fn bad_env_values_use_the_variable_name() {
    let err = fail(&[], &[("ETCD_QUOTA_BACKEND_BYTES", "abc")]);
    assert_eq!(err.exit_code, 1);
    assert_eq!(
        err.error,
        "invalid value \"abc\" for ETCD_QUOTA_BACKEND_BYTES: parse error"
    );
    let err = fail(&[], &[("ETCD_ENABLE_PPROF", "yes")]);
    assert_eq!(
        err.error,
        "invalid value \"yes\" for ETCD_ENABLE_PPROF: parse error"
    );
    // etcd reports the last bad one in flag-name order.
    let err = fail(&[], &[("ETCD_SNAPSHOT_COUNT", "x"), ("ETCD_MAX_WALS", "y")]);
    assert_eq!(
        err.error,
        "invalid value \"x\" for ETCD_SNAPSHOT_COUNT: parse error"
    );
}

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

fn write_config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.yaml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    (dir, path)
}

#[test]
fn flags_without_effect_are_named_when_set() {
    let warnings = |list: &[&str], env: &[(String, String)]| {
        parse(&args(list), env)
            .map(|parsed| parsed.warnings)
            .unwrap_or_else(|e| panic!("{}", e.message))
    };
    let told = warnings(&["--max-wals", "3", "--heartbeat-interval", "50"], &[]);
    assert!(
        told.iter()
            .any(|w| w.starts_with("--max-wals=3 has no effect in etcd-rs: ")),
        "{told:?}"
    );
    assert!(!told.iter().any(|w| w.contains("heartbeat")), "{told:?}");
    // etcd's default, even set explicitly, changes nothing and is not worth a word.
    assert!(
        !warnings(&["--max-wals", "5"], &[])
            .iter()
            .any(|w| w.contains("has no effect"))
    );
    let env = [(
        "ETCD_EXPERIMENTAL_MEMORY_MLOCK".to_owned(),
        "true".to_owned(),
    )];
    assert!(
        warnings(&[], &env)
            .iter()
            .any(|w| w.starts_with("--experimental-memory-mlock=true has no effect")),
    );
    let (_dir, path) = write_config("enable-pprof: true\n");
    let told = warnings(&["--config-file", &path], &[]);
    assert!(
        told.iter()
            .any(|w| w.starts_with("--enable-pprof=true has no effect")),
        "{told:?}"
    );
}

#[test]
fn config_file_overrides_flags_and_env() {
    let (_dir, path) = write_config(
        "name: fromfile\n\
         data-dir: /var/lib/etcd\n\
         listen-client-urls: http://127.0.0.1:23790,http://127.0.0.1:23791\n\
         advertise-client-urls: http://127.0.0.1:23790\n\
         initial-cluster-state: existing\n\
         quota-backend-bytes: 8589934592\n\
         grpc-keepalive-interval: 60000000000\n\
         auto-compaction-mode: revision\n\
         auto-compaction-retention: \"100\"\n\
         log-level: debug\n\
         enable-pprof: yes\n\
         Election-Timeout: 2000\n\
         client-transport-security:\n  cert-file: /c.pem\n  key-file: /k.pem\n  client-cert-auth: true\n  trusted-ca-file: /ca.pem\n\
         peer-transport-security:\n  auto-tls: true\n  allowed-cn: [a, b]\n\
         proxy-dial-timeout: 7\n",
    );
    let (cfg, parsed) = run(
        &["--config-file", &path, "--name=flagname"],
        &[("ETCD_NAME", "envname"), ("ETCD_FOO", "1")],
    );
    assert_eq!(cfg.name, "fromfile");
    assert_eq!(cfg.data_dir, "/var/lib/etcd");
    assert_eq!(
        strings(&cfg.listen_client_urls),
        ["http://127.0.0.1:23790", "http://127.0.0.1:23791"]
    );
    assert_eq!(cfg.initial_cluster_state, ClusterState::Existing);
    assert_eq!(cfg.initial_cluster, "fromfile=http://localhost:2380");
    assert_eq!(cfg.quota_backend_bytes, 8_589_934_592);
    assert_eq!(cfg.grpc_keepalive_interval, Duration::from_secs(60));
    assert_eq!(cfg.auto_compaction, AutoCompaction::Revision(100));
    assert_eq!(cfg.log_level, "debug");
    assert!(cfg.enable_pprof);
    assert_eq!(cfg.election_timeout, 2000);
    assert_eq!(cfg.cert_file, "/c.pem");
    assert_eq!(cfg.key_file, "/k.pem");
    assert!(cfg.client_cert_auth);
    assert_eq!(cfg.trusted_ca_file, "/ca.pem");
    assert!(cfg.peer_auto_tls);
    assert_eq!(cfg.peer_cert_allowed_cn, ["a", "b"]);
    assert_eq!(
        cfg.extra.get("proxy-dial-timeout").map(String::as_str),
        Some("7")
    );
    assert_eq!(cfg.config_file.as_deref(), Some(path.as_str()));
    assert!(parsed.infos.iter().any(|line| line.starts_with(
        "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"
    )));
    assert!(!parsed.warnings.iter().any(|w| w.contains("ETCD_FOO")));

    // ETCD_CONFIG_FILE works too, and flags are still syntax-checked first.
    let (cfg, _) = run(&["--name=x"], &[("ETCD_CONFIG_FILE", &path)]);
    assert_eq!(cfg.name, "fromfile");
    assert_eq!(fail(&["--config-file", &path, "--bogus"], &[]).exit_code, 2);

    // Defaults in file mode are embed.NewConfig's.
    let (_dir2, empty) = write_config("");
    let cfg = from_config_file(&empty).unwrap();
    assert_eq!(cfg.auto_compaction_mode, "");
    assert_eq!(cfg.auto_compaction, AutoCompaction::Off);
    assert_eq!(cfg.self_signed_cert_validity, 1);
    assert_eq!(cfg.name, "default");
}

#[test]
fn config_file_errors_match_etcd() {
    let cases: &[(&str, i32, &str)] = &[
        (
            "quota-backend-bytes: abc\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.quota-backend-bytes of type int64",
        ),
        (
            "client-transport-security:\n  cert-file: 5\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number into Go struct field securityConfig.client-transport-security.cert-file of type string",
        ),
        (
            "max-txn-ops: -1\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number -1 into Go struct field configYAML.max-txn-ops of type uint",
        ),
        (
            "heartbeat-interval: 1.5\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number 1.5 into Go struct field configYAML.heartbeat-interval of type uint",
        ),
        (
            "- a\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal array into Go value of type embed.configYAML",
        ),
        (
            "auto-compaction-retention: 1\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number into Go struct field configYAML.auto-compaction-retention of type string",
        ),
        (
            "listen-client-urls: http://x/y\n",
            1,
            "unexpected error setting up listen-client-urls: URL address does not have the form \"host:port\": http://x/y",
        ),
        (
            "advertise-client-urls: ftp://x:1\n",
            1,
            "unexpected error setting up advertise-peer-urls: URL scheme must be http, https, unix, or unixs: ftp://x:1",
        ),
        (
            "initial-cluster-state: foo\n",
            1,
            "unexpected clusterState \"foo\"",
        ),
        (
            "discovery-fallback: maybe\n",
            1,
            "unexpected error setting up discovery-fallback flag: invalid value",
        ),
        (
            "proxy: 5\n",
            1,
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number into Go struct field configProxy.proxy of type string",
        ),
        ("log-level: nope\n", 2, "unrecognized level: \"nope\""),
    ];
    for (text, code, want) in cases {
        let (_dir, path) = write_config(text);
        let err = match from_config_file(&path) {
            Ok(cfg) => panic!("{text:?} parsed: {cfg:?}"),
            Err(err) => err,
        };
        assert_eq!(
            (err.exit_code, err.error.as_str()),
            (*code, *want),
            "{text:?}"
        );
    }
    let (_dir, path) = write_config("listen-client-urls: http://x/y\n");
    assert_eq!(
        from_config_file(&path).unwrap_err().message,
        "unexpected error setting up listen-client-urls: URL address does not have the form \"host:port\": http://x/y\n"
    );
    let missing = fail(&["--config-file", "/nonexistent/etcd.yaml"], &[]);
    assert_eq!(
        missing.error,
        "open /nonexistent/etcd.yaml: no such file or directory"
    );
    let (_dir, bad) = write_config("name: [a\n");
    let err = from_config_file(&bad).unwrap_err();
    assert!(
        err.error
            .starts_with("error converting YAML to JSON: yaml: line "),
        "{}",
        err.error
    );
}

#[test]
fn ignored_legacy_flags_warn() {
    let (_, parsed) = run(&["-v", "--snapshot=false"], &[]);
    assert!(
        parsed
            .warnings
            .contains(&"flag \"-v\" is no longer supported - ignoring.".to_string())
    );
    assert!(
        parsed
            .warnings
            .contains(&"flag \"-snapshot\" is no longer supported - ignoring.".to_string())
    );
}
