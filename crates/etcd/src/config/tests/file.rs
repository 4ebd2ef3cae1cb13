//! `--config-file`: what it overrides and its error texts.

use std::time::Duration;

use super::*;

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
