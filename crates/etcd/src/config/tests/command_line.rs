//! The command line: dash styles and value forms, Go's bool rules, bad values, unknown flags
//! and stray arguments, `--help`/`--version`/subcommands, legacy flags, and flags accepted
//! without effect.

use super::*;
use crate::config::flags::Group;

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
