//! `ETCD_*` variables: what they fill, their conflicts with flags, their error texts.

use super::*;

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
