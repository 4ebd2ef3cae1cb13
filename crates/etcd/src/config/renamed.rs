//! etcd 3.6's names for 3.5's flags: the `--experimental-*` flags 3.6 renamed (both names
//! accepted, with their `ETCD_*` variables and config-file keys) and `--feature-gates`, which
//! took over the experimental switches (etcd 3.6 `server/etcdmain/config.go`,
//! `server/embed/config.go`, `server/features`).
//!
//! The rest of the configuration reads the 3.5 name: a 3.6 name given alone is copied into
//! it here, and a gate into the flag it replaces. As in etcd 3.6, the experimental name wins
//! when both are given; a gate and its experimental flag together are refused.

use super::error::ConfigError;
use super::flags::{self, FlagSet, Value};
use super::goparse;

/// `(3.5 name, 3.6 name)`: same type, same default, same effect.
pub(crate) const RENAMED: &[(&str, &str)] = &[
    (
        "experimental-compact-hash-check-time",
        "compact-hash-check-time",
    ),
    ("experimental-corrupt-check-time", "corrupt-check-time"),
    (
        "experimental-compaction-batch-limit",
        "compaction-batch-limit",
    ),
    (
        "experimental-compaction-sleep-interval",
        "compaction-sleep-interval",
    ),
    (
        "experimental-watch-progress-notify-interval",
        "watch-progress-notify-interval",
    ),
    ("experimental-downgrade-check-time", "downgrade-check-time"),
    (
        "experimental-warning-apply-duration",
        "warning-apply-duration",
    ),
    (
        "experimental-warning-unary-request-duration",
        "warning-unary-request-duration",
    ),
    ("experimental-memory-mlock", "memory-mlock"),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        "bootstrap-defrag-threshold-megabytes",
    ),
    ("experimental-max-learners", "max-learners"),
    (
        "experimental-snapshot-catchup-entries",
        "snapshot-catchup-entries",
    ),
    (
        "experimental-peer-skip-client-san-verification",
        "peer-skip-client-san-verification",
    ),
    (
        "experimental-enable-distributed-tracing",
        "enable-distributed-tracing",
    ),
    (
        "experimental-distributed-tracing-address",
        "distributed-tracing-address",
    ),
    (
        "experimental-distributed-tracing-service-name",
        "distributed-tracing-service-name",
    ),
    (
        "experimental-distributed-tracing-instance-id",
        "distributed-tracing-instance-id",
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        "distributed-tracing-sampling-rate",
    ),
];

/// A feature gate's release stage (`AllAlpha=true` / `AllBeta=true` turn on every gate of
/// theirs that is not named).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Alpha,
    Beta,
}

/// etcd 3.6's server feature gates: name, stage, and the 3.5 flag it replaces (none for
/// `SetMemberLocalAddr`, new in 3.6, which has no effect here).
const GATES: &[(&str, Stage, Option<&str>)] = &[
    (
        "CompactHashCheck",
        Stage::Alpha,
        Some("experimental-compact-hash-check-enabled"),
    ),
    (
        "InitialCorruptCheck",
        Stage::Alpha,
        Some("experimental-initial-corrupt-check"),
    ),
    (
        "LeaseCheckpoint",
        Stage::Alpha,
        Some("experimental-enable-lease-checkpoint"),
    ),
    (
        "LeaseCheckpointPersist",
        Stage::Alpha,
        Some("experimental-enable-lease-checkpoint-persist"),
    ),
    ("SetMemberLocalAddr", Stage::Alpha, None),
    (
        "StopGRPCServiceOnDefrag",
        Stage::Alpha,
        Some("experimental-stop-grpc-service-on-defrag"),
    ),
    (
        "TxnModeWriteWithSharedBuffer",
        Stage::Beta,
        Some("experimental-txn-mode-write-with-shared-buffer"),
    ),
];

/// Why `SetMemberLocalAddr` does nothing here.
const SET_MEMBER_LOCAL_ADDR: &str =
    "peer connections leave from the address the operating system picks";

/// The featuregate package's `Set`: `Name=bool` pairs, comma-separated, in order (a later
/// pair wins), with its error texts.
pub(crate) fn parse_gates(text: &str) -> Result<Vec<(String, bool)>, String> {
    let mut gates = Vec::new();
    for item in text.split(',').filter(|item| !item.is_empty()) {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim()),
            None => return Err(format!("missing bool value for {}", item.trim())),
        };
        let Some(on) = goparse::parse_bool(value) else {
            return Err(format!(
                "invalid value of {name}={value}, err: {}",
                goparse::NumError::Syntax.strconv_text("ParseBool", value)
            ));
        };
        let known = GATES.iter().any(|(gate, ..)| *gate == name);
        if !known && name != "AllAlpha" && name != "AllBeta" {
            return Err(format!("unrecognized feature gate: {name}"));
        }
        gates.push((name.to_string(), on));
    }
    Ok(gates)
}

/// Whether `name` was given: on the command line, in the environment, or (the config file
/// marks nothing as set) with a value other than its default.
fn given(flags: &FlagSet, name: &str) -> bool {
    let slot = flags.slot(name);
    slot.set || flags::value_text(&slot.value) != flags::value_text(&slot.def.default_value())
}

/// Copies each 3.6 name given alone into its 3.5 name, and each gate into its flag; returns
/// the warnings for gates without effect.
pub(crate) fn apply(flags: &mut FlagSet) -> Result<Vec<String>, ConfigError> {
    for (old, new) in RENAMED {
        if given(flags, new) && !given(flags, old) {
            let value = flags.slot(new).value.clone();
            *flags.value_mut(old) = value;
        }
    }
    let mut warnings = Vec::new();
    let text = flags.string("feature-gates");
    let named = parse_gates(&text).map_err(|e| {
        ConfigError::verify(format!(
            "invalid value {} for flag -feature-gates: {e}",
            goparse::quote(&text)
        ))
    })?;
    let value_of = |gate: &str, stage: Stage| -> Option<bool> {
        let all = if stage == Stage::Alpha {
            "AllAlpha"
        } else {
            "AllBeta"
        };
        let last = |wanted: &str| {
            named
                .iter()
                .rev()
                .find(|(name, _)| name == wanted)
                .map(|(_, on)| *on)
        };
        last(gate).or_else(|| last(all))
    };
    for &(gate, stage, flag) in GATES {
        let Some(on) = value_of(gate, stage) else {
            continue;
        };
        let Some(flag) = flag else {
            if on {
                warnings.push(format!(
                    "--feature-gates={gate}=true has no effect in etcd-rs: {SET_MEMBER_LOCAL_ADDR}"
                ));
            }
            continue;
        };
        if given(flags, flag) {
            let flag_value = flags.boolean(flag);
            return Err(ConfigError::verify(format!(
                "cannot specify both flags: --{flag}={flag_value} and --feature-gates={gate}={on} at the same time, please just use --feature-gates={gate}={on}"
            )));
        }
        let default = flags::value_text(&flags.slot(flag).def.default_value());
        if let Some((_, why)) = super::effect::NO_EFFECT.iter().find(|(n, _)| *n == flag)
            && on.to_string() != default
        {
            warnings.push(format!(
                "--feature-gates={gate}={on} has no effect in etcd-rs: {why}"
            ));
        }
        *flags.value_mut(flag) = Value::Bool(on);
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_as_the_featuregate_package_does() {
        assert_eq!(
            parse_gates("InitialCorruptCheck=true, LeaseCheckpoint = false,").ok(),
            Some(vec![
                ("InitialCorruptCheck".to_string(), true),
                ("LeaseCheckpoint".to_string(), false)
            ])
        );
        assert_eq!(
            parse_gates("Foo=true").err().as_deref(),
            Some("unrecognized feature gate: Foo")
        );
        assert_eq!(
            parse_gates("CompactHashCheck").err().as_deref(),
            Some("missing bool value for CompactHashCheck")
        );
        assert_eq!(
            parse_gates("CompactHashCheck=maybe").err().as_deref(),
            Some(
                "invalid value of CompactHashCheck=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax"
            )
        );
    }

    #[test]
    fn every_name_is_a_flag_of_the_same_kind_and_default() {
        for (old, new) in RENAMED {
            let def = |name: &str| {
                flags::FLAGS
                    .iter()
                    .find(|def| def.name == name)
                    .unwrap_or_else(|| panic!("--{name} is not in the flag table"))
            };
            let (old_def, new_def) = (def(old), def(new));
            assert_eq!(old_def.default, new_def.default, "{old} / {new}");
            assert_eq!(
                format!("{:?}", old_def.kind),
                format!("{:?}", new_def.kind),
                "{old} / {new}"
            );
        }
        for (_, _, flag) in GATES {
            if let Some(flag) = flag {
                assert!(flags::FLAGS.iter().any(|def| def.name == *flag), "{flag}");
            }
        }
    }
}
