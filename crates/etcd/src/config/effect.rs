//! The flags etcd-rs accepts (so that etcd's command lines, environments and config files
//! start it) but does not act on, each with the reason. A member given one of them with a
//! value other than etcd's default says so at start, in one warning per flag: an operator who
//! sets a flag learns whether it did anything. A flag leaves this table when it is implemented.

/// `(flag, what etcd-rs does instead)`.
#[rustfmt::skip]
pub(crate) const NO_EFFECT: &[(&str, &str)] = &[
    ("initial-election-tick-advance", "raft-rs waits a whole election timeout before the first campaign"),
    ("max-snapshots", "one raft snapshot is kept; older ones are removed"),
    ("max-wals", "WAL segments are released once the backend holds their entries"),
    ("backend-bbolt-freelist-type", "the backend is redb, not bbolt"),
    ("raft-read-timeout", "peer links use their own fixed timeouts"),
    ("raft-write-timeout", "peer links use their own fixed timeouts"),
    ("enable-pprof", "there is no /debug/pprof"),
    ("client-cert-file", "outgoing client connections present --cert-file"),
    ("client-key-file", "outgoing client connections present --key-file"),
    ("experimental-peer-skip-client-san-verification", "peer client certificates are verified as --peer-client-cert-auth says"),
    ("experimental-compact-hash-check-enabled", "compacted revisions' hashes are not compared"),
    ("experimental-compact-hash-check-time", "compacted revisions' hashes are not compared"),
    ("experimental-bootstrap-defrag-threshold-megabytes", "the backend is not defragmented at start"),
    ("experimental-memory-mlock", "memory is not locked"),
    ("experimental-txn-mode-write-with-shared-buffer", "the backend has no shared read buffer"),
    ("experimental-stop-grpc-service-on-defrag", "the gRPC health service is not stopped during a defragmentation"),
    ("experimental-downgrade-check-time", "cluster downgrades are not supported"),
    ("experimental-enable-v2v3", "there is no v2 store to emulate"),
    ("v2-deprecation", "there is no v2 store"),
    ("proxy", "a full member runs; the v2 proxy is not served"),
    ("proxy-failure-wait", "the v2 proxy is not served"),
    ("proxy-refresh-interval", "the v2 proxy is not served"),
    ("proxy-dial-timeout", "the v2 proxy is not served"),
    ("proxy-write-timeout", "the v2 proxy is not served"),
    ("proxy-read-timeout", "the v2 proxy is not served"),
    ("enable-log-rotation", "log files are not rotated"),
    ("log-rotation-config-json", "log files are not rotated"),
    ("experimental-enable-distributed-tracing", "there is no OpenTelemetry tracing"),
    ("experimental-distributed-tracing-address", "there is no OpenTelemetry tracing"),
    ("experimental-distributed-tracing-service-name", "there is no OpenTelemetry tracing"),
    ("experimental-distributed-tracing-instance-id", "there is no OpenTelemetry tracing"),
    ("experimental-distributed-tracing-sampling-rate", "there is no OpenTelemetry tracing"),
    ("experimental-warning-unary-request-duration", "slow unary requests are not logged"),
    // etcd 3.6's names for the flags above.
    ("peer-skip-client-san-verification", "peer client certificates are verified as --peer-client-cert-auth says"),
    ("compact-hash-check-time", "compacted revisions' hashes are not compared"),
    ("bootstrap-defrag-threshold-megabytes", "the backend is not defragmented at start"),
    ("memory-mlock", "memory is not locked"),
    ("downgrade-check-time", "cluster downgrades are not supported"),
    ("enable-distributed-tracing", "there is no OpenTelemetry tracing"),
    ("distributed-tracing-address", "there is no OpenTelemetry tracing"),
    ("distributed-tracing-service-name", "there is no OpenTelemetry tracing"),
    ("distributed-tracing-instance-id", "there is no OpenTelemetry tracing"),
    ("distributed-tracing-sampling-rate", "there is no OpenTelemetry tracing"),
    ("warning-unary-request-duration", "slow unary requests are not logged"),
];

/// Flags that are implemented but that no integration test sets yet, so nothing shows that
/// they change what they should (issue 19's open list). The flag walk below fails for a flag
/// that is neither tested, nor here, nor in [`NO_EFFECT`]; a flag leaves this list with the
/// test that sets it.
#[cfg(test)]
pub(crate) const UNTESTED: &[&str] = &[];

/// The sources of the integration tests (`crates/etcd/tests/it`) and of the testkit that
/// starts their members: a flag is tested when they set it (`--<flag>` or `"<flag>"`).
#[cfg(test)]
pub(crate) fn integration_test_sources() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = String::new();
    for dir in [root.join("tests/it"), root.join("../testkit/src")] {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        for file in files {
            text.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
        }
    }
    text
}

/// Whether `sources` set `flag`.
#[cfg(test)]
pub(crate) fn sets_flag(sources: &str, flag: &str) -> bool {
    sources.contains(&format!("--{flag}")) || sources.contains(&format!("\"{flag}\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::{FLAGS, Kind};

    /// issue 19: no flag is parsed and forgotten. Each one of the member's flags is tested
    /// (an integration test sets it and checks what it does), declared without effect (and
    /// warned about at start), on the open [`UNTESTED`] list, or one of etcd's own ignored
    /// legacy flags (which etcd itself warns about and ignores).
    #[test]
    fn every_flag_is_tested_or_declared() {
        let sources = integration_test_sources();
        let mut unaccounted = Vec::new();
        for def in FLAGS {
            let declared = NO_EFFECT.iter().any(|(n, _)| *n == def.name);
            let untested = UNTESTED.contains(&def.name);
            let tested = sets_flag(&sources, def.name);
            let ignored_by_etcd = matches!(def.kind, Kind::Ignored);
            assert!(
                !(tested && untested),
                "--{} is tested now: take it off UNTESTED",
                def.name
            );
            assert!(
                !(declared && untested),
                "--{} is declared without effect and listed untested",
                def.name
            );
            if !(declared || untested || tested || ignored_by_etcd) {
                unaccounted.push(def.name);
            }
        }
        assert!(
            unaccounted.is_empty(),
            "flags neither tested, declared without effect, nor listed untested: {unaccounted:?}"
        );
    }

    #[test]
    fn help_marks_the_flags_without_effect() {
        let help = super::super::help::flags_text();
        assert!(help.contains(
            "Accepted for compatibility; no effect in etcd-rs: one raft snapshot is kept"
        ));
        let marks = help
            .matches("Accepted for compatibility; no effect")
            .count();
        let listed = NO_EFFECT
            .iter()
            .filter(|(name, _)| {
                super::super::flags::FLAGS
                    .iter()
                    .any(|d| d.name == *name && d.group != super::super::flags::Group::Hidden)
            })
            .count();
        assert_eq!(marks, listed);
    }

    #[test]
    fn every_flag_without_effect_is_a_flag() {
        for (name, _) in NO_EFFECT {
            assert!(
                super::super::flags::FLAGS
                    .iter()
                    .any(|def| def.name == *name),
                "{name} is not in the flag table"
            );
        }
    }
}
