//! etcd 3.6's flag names and `--feature-gates` (`config::renamed`): each 3.6 name, given as a
//! flag, an `ETCD_*` variable or a config-file key, sets what its 3.5 name sets.

use std::time::Duration;

use super::*;

/// The configured values the renamed flags reach, to compare the two names by.
fn reached(cfg: &EtcdConfig) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {} {} {} {} {} {} {}",
        cfg.experimental_corrupt_check_time,
        cfg.experimental_compact_hash_check_time,
        cfg.experimental_watch_progress_notify_interval,
        cfg.experimental_warning_apply_duration,
        cfg.experimental_compaction_batch_limit,
        cfg.experimental_snapshot_catchup_entries,
        cfg.experimental_max_learners,
        cfg.experimental_peer_skip_client_san_verification,
        cfg.experimental_initial_corrupt_check,
        cfg.experimental_enable_lease_checkpoint,
        cfg.experimental_compact_hash_check_enabled,
    )
}

const VALUES: &[(&str, &str)] = &[
    ("corrupt-check-time", "3s"),
    ("compact-hash-check-time", "7s"),
    ("watch-progress-notify-interval", "500ms"),
    ("warning-apply-duration", "1s"),
    ("compaction-batch-limit", "42"),
    ("snapshot-catchup-entries", "77"),
    ("max-learners", "3"),
    ("peer-skip-client-san-verification", "true"),
];

#[test]
fn the_36_names_set_what_the_35_names_set() {
    let old_args: Vec<String> = VALUES
        .iter()
        .map(|(name, value)| format!("--experimental-{name}={value}"))
        .collect();
    let new_args: Vec<String> = VALUES
        .iter()
        .map(|(name, value)| format!("--{name}={value}"))
        .collect();
    let as_strs = |list: &[String]| -> Vec<String> { list.to_vec() };
    let old = |list: &[String]| match parse(&as_strs(list), &[]) {
        Ok(Parsed {
            command: Command::Run(cfg),
            ..
        }) => reached(&cfg),
        other => panic!("{other:?}"),
    };
    let by_old = old(&old_args);
    assert_eq!(old(&new_args), by_old);
    let (cfg, _) = run(&[], &[]);
    assert_ne!(reached(&cfg), by_old, "the values differ from the defaults");

    // ETCD_<3.6 name>.
    let vars: Vec<(String, String)> = VALUES
        .iter()
        .map(|(name, value)| {
            (
                format!("ETCD_{}", name.replace('-', "_").to_uppercase()),
                value.to_string(),
            )
        })
        .collect();
    match parse(&[], &vars) {
        Ok(Parsed {
            command: Command::Run(cfg),
            ..
        }) => assert_eq!(reached(&cfg), by_old),
        other => panic!("{other:?}"),
    }

    // Config-file keys under the 3.6 names (3.6 has no top-level key for the peer SAN check:
    // it lives under peer-transport-security).
    let in_file: Vec<&(&str, &str)> = VALUES
        .iter()
        .filter(|(name, _)| *name != "peer-skip-client-san-verification")
        .collect();
    let file_old: Vec<String> = in_file
        .iter()
        .map(|(name, value)| format!("--experimental-{name}={value}"))
        .collect();
    let yaml: String = in_file
        .iter()
        .map(|(name, value)| match *value {
            "3s" => format!("{name}: 3000000000\n"),
            "7s" => format!("{name}: 7000000000\n"),
            "500ms" => format!("{name}: 500000000\n"),
            "1s" => format!("{name}: 1000000000\n"),
            other => format!("{name}: {other}\n"),
        })
        .collect();
    let (_dir, path) = write_config(&yaml);
    let (cfg, _) = run(&["--config-file", &path], &[]);
    assert_eq!(reached(&cfg), old(&file_old));
    assert_eq!(
        cfg.experimental_watch_progress_notify_interval,
        Duration::from_millis(500)
    );

    // Both given: the experimental name wins, as in etcd 3.6.
    let (cfg, _) = run(
        &[
            "--experimental-max-learners=2",
            "--max-learners=5",
            "--watch-progress-notify-interval=2s",
        ],
        &[],
    );
    assert_eq!(cfg.experimental_max_learners, 2);
    assert_eq!(
        cfg.experimental_watch_progress_notify_interval,
        Duration::from_secs(2)
    );
}

#[test]
fn feature_gates_set_their_experimental_switches() {
    let (cfg, parsed) = run(
        &["--feature-gates=InitialCorruptCheck=true,LeaseCheckpoint=true"],
        &[],
    );
    assert!(cfg.experimental_initial_corrupt_check);
    assert!(cfg.experimental_enable_lease_checkpoint);
    assert!(!cfg.experimental_enable_lease_checkpoint_persist);
    assert!(!parsed.warnings.iter().any(|w| w.contains("no effect")));
    // Repeated flags add up; AllAlpha turns on every alpha gate not named.
    let (cfg, parsed) = run(
        &[
            "--feature-gates=AllAlpha=true",
            "--feature-gates=LeaseCheckpointPersist=false",
        ],
        &[],
    );
    assert!(cfg.experimental_initial_corrupt_check && cfg.experimental_compact_hash_check_enabled);
    assert!(cfg.experimental_enable_lease_checkpoint);
    assert!(!cfg.experimental_enable_lease_checkpoint_persist);
    for gate in [
        "CompactHashCheck",
        "StopGRPCServiceOnDefrag",
        "SetMemberLocalAddr",
    ] {
        assert!(
            parsed.warnings.iter().any(|w| w.starts_with(&format!(
                "--feature-gates={gate}=true has no effect in etcd-rs: "
            ))),
            "{gate}: {:?}",
            parsed.warnings
        );
    }
    // From the environment and the config file.
    let (cfg, _) = run(&[], &[("ETCD_FEATURE_GATES", "InitialCorruptCheck=true")]);
    assert!(cfg.experimental_initial_corrupt_check);
    let (_dir, path) = write_config("feature-gates: LeaseCheckpoint=true\n");
    let (cfg, _) = run(&["--config-file", &path], &[]);
    assert!(cfg.experimental_enable_lease_checkpoint);

    // etcd's refusals.
    let err = fail(&["--feature-gates=Foo=true"], &[]);
    assert_eq!(err.exit_code, 2);
    assert!(
        err.message.starts_with(
            "invalid value \"Foo=true\" for flag -feature-gates: unrecognized feature gate: Foo"
        ),
        "{}",
        err.message
    );
    let err = fail(
        &[
            "--experimental-initial-corrupt-check=true",
            "--feature-gates=InitialCorruptCheck=false",
        ],
        &[],
    );
    assert!(
        err.message.contains(
            "cannot specify both flags: --experimental-initial-corrupt-check=true and --feature-gates=InitialCorruptCheck=false at the same time, please just use --feature-gates=InitialCorruptCheck=false"
        ),
        "{}",
        err.message
    );
    let (_dir, bad) = write_config("feature-gates: Nope=true\n");
    let err = fail(&["--config-file", &bad], &[]);
    assert!(
        err.message.contains("unrecognized feature gate: Nope"),
        "{}",
        err.message
    );
}
