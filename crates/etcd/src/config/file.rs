//! Decoding etcd's `--config-file` YAML. etcd converts the YAML to JSON and decodes that
//! with Go's `encoding/json`, so this follows JSON rules: keys are matched exactly or
//! case-insensitively, unknown keys are ignored, `null` leaves a default alone, keys are
//! visited in sorted order (Go marshals the converted map sorted) and the first type
//! mismatch is reported as `json: cannot unmarshal <kind> into Go struct field ...`.

use std::collections::BTreeMap;

use serde_yaml_ng::Value as Yaml;

use super::flags::{FlagSet, Value};

/// Go types a config key decodes into, with the name Go's reflection prints for each.
#[derive(Debug, Clone, Copy)]
enum GoType {
    Str,
    /// A named string type (`config.V2DeprecationEnum`).
    NamedStr(&'static str),
    Bool,
    Uint,
    Uint32,
    Uint64,
    Int,
    Int64,
    Duration,
    StrSlice,
}

impl GoType {
    fn type_name(self) -> &'static str {
        match self {
            GoType::Str => "string",
            GoType::NamedStr(name) => name,
            GoType::Bool => "bool",
            GoType::Uint => "uint",
            GoType::Uint32 => "uint32",
            GoType::Uint64 => "uint64",
            GoType::Int => "int",
            GoType::Int64 => "int64",
            GoType::Duration => "time.Duration",
            GoType::StrSlice => "[]string",
        }
    }
}

/// Where a decoded key ends up.
#[derive(Debug, Clone, Copy)]
enum Dest {
    /// Straight into the flag of that name.
    Flag(&'static str),
    /// A comma-separated URL list, checked after decoding (`listen-peer-urls`, ...).
    UrlList(&'static str),
    Cors,
    HostWhitelist,
    ClusterState,
    ClientSecurity,
    PeerSecurity,
    SocketOptions,
}

/// `embed.configYAML`'s JSON keys (etcd 3.5), plus the 3.6 v3-discovery keys.
#[rustfmt::skip]
const CONFIG_KEYS: &[(&str, GoType, Dest)] = &[
    ("name", GoType::Str, Dest::Flag("name")),
    ("data-dir", GoType::Str, Dest::Flag("data-dir")),
    ("wal-dir", GoType::Str, Dest::Flag("wal-dir")),
    ("snapshot-count", GoType::Uint64, Dest::Flag("snapshot-count")),
    ("experimental-snapshot-catch-up-entries", GoType::Uint64, Dest::Flag("experimental-snapshot-catchup-entries")),
    ("max-snapshots", GoType::Uint, Dest::Flag("max-snapshots")),
    ("max-wals", GoType::Uint, Dest::Flag("max-wals")),
    ("heartbeat-interval", GoType::Uint, Dest::Flag("heartbeat-interval")),
    ("election-timeout", GoType::Uint, Dest::Flag("election-timeout")),
    ("initial-election-tick-advance", GoType::Bool, Dest::Flag("initial-election-tick-advance")),
    ("backend-batch-interval", GoType::Duration, Dest::Flag("backend-batch-interval")),
    ("backend-batch-limit", GoType::Int, Dest::Flag("backend-batch-limit")),
    ("backend-bbolt-freelist-type", GoType::Str, Dest::Flag("backend-bbolt-freelist-type")),
    ("quota-backend-bytes", GoType::Int64, Dest::Flag("quota-backend-bytes")),
    ("max-txn-ops", GoType::Uint, Dest::Flag("max-txn-ops")),
    ("max-request-bytes", GoType::Uint, Dest::Flag("max-request-bytes")),
    ("max-concurrent-streams", GoType::Uint32, Dest::Flag("max-concurrent-streams")),
    ("self-signed-cert-validity", GoType::Uint, Dest::Flag("self-signed-cert-validity")),
    ("cipher-suites", GoType::StrSlice, Dest::Flag("cipher-suites")),
    ("tls-min-version", GoType::Str, Dest::Flag("tls-min-version")),
    ("tls-max-version", GoType::Str, Dest::Flag("tls-max-version")),
    ("initial-cluster-state", GoType::Str, Dest::ClusterState),
    ("discovery-srv", GoType::Str, Dest::Flag("discovery-srv")),
    ("discovery-srv-name", GoType::Str, Dest::Flag("discovery-srv-name")),
    ("discovery-proxy", GoType::Str, Dest::Flag("discovery-proxy")),
    ("discovery", GoType::Str, Dest::Flag("discovery")),
    ("discovery-token", GoType::Str, Dest::Flag("discovery-token")),
    ("discovery-endpoints", GoType::StrSlice, Dest::Flag("discovery-endpoints")),
    ("initial-cluster", GoType::Str, Dest::Flag("initial-cluster")),
    ("initial-cluster-token", GoType::Str, Dest::Flag("initial-cluster-token")),
    ("strict-reconfig-check", GoType::Bool, Dest::Flag("strict-reconfig-check")),
    ("enable-v2", GoType::Bool, Dest::Flag("enable-v2")),
    ("auto-compaction-mode", GoType::Str, Dest::Flag("auto-compaction-mode")),
    ("auto-compaction-retention", GoType::Str, Dest::Flag("auto-compaction-retention")),
    ("grpc-keepalive-min-time", GoType::Duration, Dest::Flag("grpc-keepalive-min-time")),
    ("grpc-keepalive-interval", GoType::Duration, Dest::Flag("grpc-keepalive-interval")),
    ("grpc-keepalive-timeout", GoType::Duration, Dest::Flag("grpc-keepalive-timeout")),
    ("socket-options", GoType::Str, Dest::SocketOptions),
    ("pre-vote", GoType::Bool, Dest::Flag("pre-vote")),
    ("auth-token", GoType::Str, Dest::Flag("auth-token")),
    ("bcrypt-cost", GoType::Uint, Dest::Flag("bcrypt-cost")),
    ("auth-token-ttl", GoType::Uint, Dest::Flag("auth-token-ttl")),
    ("experimental-initial-corrupt-check", GoType::Bool, Dest::Flag("experimental-initial-corrupt-check")),
    ("experimental-corrupt-check-time", GoType::Duration, Dest::Flag("experimental-corrupt-check-time")),
    ("experimental-compact-hash-check-enabled", GoType::Bool, Dest::Flag("experimental-compact-hash-check-enabled")),
    ("experimental-compact-hash-check-time", GoType::Duration, Dest::Flag("experimental-compact-hash-check-time")),
    ("experimental-enable-v2v3", GoType::Str, Dest::Flag("experimental-enable-v2v3")),
    ("experimental-enable-lease-checkpoint", GoType::Bool, Dest::Flag("experimental-enable-lease-checkpoint")),
    ("experimental-enable-lease-checkpoint-persist", GoType::Bool, Dest::Flag("experimental-enable-lease-checkpoint-persist")),
    ("experimental-compaction-batch-limit", GoType::Int, Dest::Flag("experimental-compaction-batch-limit")),
    ("experimental-compaction-sleep-interval", GoType::Duration, Dest::Flag("experimental-compaction-sleep-interval")),
    ("experimental-watch-progress-notify-interval", GoType::Duration, Dest::Flag("experimental-watch-progress-notify-interval")),
    ("experimental-warning-apply-duration", GoType::Duration, Dest::Flag("experimental-warning-apply-duration")),
    ("experimental-bootstrap-defrag-threshold-megabytes", GoType::Uint, Dest::Flag("experimental-bootstrap-defrag-threshold-megabytes")),
    ("experimental-max-learners", GoType::Int, Dest::Flag("experimental-max-learners")),
    ("force-new-cluster", GoType::Bool, Dest::Flag("force-new-cluster")),
    ("enable-pprof", GoType::Bool, Dest::Flag("enable-pprof")),
    ("metrics", GoType::Str, Dest::Flag("metrics")),
    ("listen-metrics-urls", GoType::Str, Dest::UrlList("listen-metrics-urls")),
    ("experimental-enable-distributed-tracing", GoType::Bool, Dest::Flag("experimental-enable-distributed-tracing")),
    ("experimental-distributed-tracing-address", GoType::Str, Dest::Flag("experimental-distributed-tracing-address")),
    ("experimental-distributed-tracing-service-name", GoType::Str, Dest::Flag("experimental-distributed-tracing-service-name")),
    ("experimental-distributed-tracing-instance-id", GoType::Str, Dest::Flag("experimental-distributed-tracing-instance-id")),
    ("experimental-distributed-tracing-sampling-rate", GoType::Int, Dest::Flag("experimental-distributed-tracing-sampling-rate")),
    ("logger", GoType::Str, Dest::Flag("logger")),
    ("log-level", GoType::Str, Dest::Flag("log-level")),
    ("log-outputs", GoType::StrSlice, Dest::Flag("log-outputs")),
    ("enable-log-rotation", GoType::Bool, Dest::Flag("enable-log-rotation")),
    ("log-rotation-config-json", GoType::Str, Dest::Flag("log-rotation-config-json")),
    ("enable-grpc-gateway", GoType::Bool, Dest::Flag("enable-grpc-gateway")),
    ("unsafe-no-fsync", GoType::Bool, Dest::Flag("unsafe-no-fsync")),
    ("experimental-downgrade-check-time", GoType::Duration, Dest::Flag("experimental-downgrade-check-time")),
    ("experimental-memory-mlock", GoType::Bool, Dest::Flag("experimental-memory-mlock")),
    ("experimental-txn-mode-write-with-shared-buffer", GoType::Bool, Dest::Flag("experimental-txn-mode-write-with-shared-buffer")),
    ("experimental-stop-grpc-service-on-defrag", GoType::Bool, Dest::Flag("experimental-stop-grpc-service-on-defrag")),
    ("v2-deprecation", GoType::NamedStr("config.V2DeprecationEnum"), Dest::Flag("v2-deprecation")),
    ("experimental-warning-unary-request-duration", GoType::Duration, Dest::Flag("experimental-warning-unary-request-duration")),
    // etcd 3.6's names (`config::renamed`)
    ("corrupt-check-time", GoType::Duration, Dest::Flag("corrupt-check-time")),
    ("compact-hash-check-time", GoType::Duration, Dest::Flag("compact-hash-check-time")),
    ("compaction-batch-limit", GoType::Int, Dest::Flag("compaction-batch-limit")),
    ("compaction-sleep-interval", GoType::Duration, Dest::Flag("compaction-sleep-interval")),
    ("watch-progress-notify-interval", GoType::Duration, Dest::Flag("watch-progress-notify-interval")),
    ("downgrade-check-time", GoType::Duration, Dest::Flag("downgrade-check-time")),
    ("warning-apply-duration", GoType::Duration, Dest::Flag("warning-apply-duration")),
    ("warning-unary-request-duration", GoType::Duration, Dest::Flag("warning-unary-request-duration")),
    ("memory-mlock", GoType::Bool, Dest::Flag("memory-mlock")),
    ("bootstrap-defrag-threshold-megabytes", GoType::Uint, Dest::Flag("bootstrap-defrag-threshold-megabytes")),
    ("max-learners", GoType::Int, Dest::Flag("max-learners")),
    ("snapshot-catchup-entries", GoType::Uint64, Dest::Flag("snapshot-catchup-entries")),
    ("enable-distributed-tracing", GoType::Bool, Dest::Flag("enable-distributed-tracing")),
    ("distributed-tracing-address", GoType::Str, Dest::Flag("distributed-tracing-address")),
    ("distributed-tracing-service-name", GoType::Str, Dest::Flag("distributed-tracing-service-name")),
    ("distributed-tracing-instance-id", GoType::Str, Dest::Flag("distributed-tracing-instance-id")),
    ("distributed-tracing-sampling-rate", GoType::Int, Dest::Flag("distributed-tracing-sampling-rate")),
    ("feature-gates", GoType::Str, Dest::Flag("feature-gates")),
    // configJSON
    ("listen-peer-urls", GoType::Str, Dest::UrlList("listen-peer-urls")),
    ("listen-client-urls", GoType::Str, Dest::UrlList("listen-client-urls")),
    ("listen-client-http-urls", GoType::Str, Dest::UrlList("listen-client-http-urls")),
    ("initial-advertise-peer-urls", GoType::Str, Dest::UrlList("initial-advertise-peer-urls")),
    ("advertise-client-urls", GoType::Str, Dest::UrlList("advertise-client-urls")),
    ("cors", GoType::Str, Dest::Cors),
    ("host-whitelist", GoType::Str, Dest::HostWhitelist),
    ("client-transport-security", GoType::Str, Dest::ClientSecurity),
    ("peer-transport-security", GoType::Str, Dest::PeerSecurity),
];

/// `embed.securityConfig`'s keys.
const SECURITY_KEYS: &[(&str, GoType)] = &[
    ("cert-file", GoType::Str),
    ("key-file", GoType::Str),
    ("client-cert-file", GoType::Str),
    ("client-key-file", GoType::Str),
    ("client-cert-auth", GoType::Bool),
    ("trusted-ca-file", GoType::Str),
    ("auto-tls", GoType::Bool),
    ("allowed-cn", GoType::StrSlice),
    ("allowed-hostname", GoType::StrSlice),
];

/// `transport.SocketOpts`' keys and the flags they feed.
const SOCKET_KEYS: &[(&str, GoType, &str)] = &[
    ("reuse-port", GoType::Bool, "socket-reuse-port"),
    ("reuse-address", GoType::Bool, "socket-reuse-address"),
];

/// `etcdmain.configProxy`'s keys (decoded in a second pass, as etcd does).
const PROXY_KEYS: &[(&str, GoType, &str)] = &[
    ("proxy-failure-wait", GoType::Uint, "proxy-failure-wait"),
    (
        "proxy-refresh-interval",
        GoType::Uint,
        "proxy-refresh-interval",
    ),
    ("proxy-dial-timeout", GoType::Uint, "proxy-dial-timeout"),
    ("proxy-write-timeout", GoType::Uint, "proxy-write-timeout"),
    ("proxy-read-timeout", GoType::Uint, "proxy-read-timeout"),
    ("proxy", GoType::Str, "proxy"),
    ("discovery-fallback", GoType::Str, "discovery-fallback"),
];

/// One `client-transport-security` / `peer-transport-security` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Security {
    pub(crate) cert_file: String,
    pub(crate) key_file: String,
    pub(crate) client_cert_file: String,
    pub(crate) client_key_file: String,
    pub(crate) client_cert_auth: bool,
    pub(crate) trusted_ca_file: String,
    pub(crate) auto_tls: bool,
    pub(crate) allowed_cn: Vec<String>,
    pub(crate) allowed_hostname: Vec<String>,
}

/// The first decoding pass: everything `embed.ConfigFromFile` reads.
#[derive(Debug)]
pub(crate) struct FileValues {
    pub(crate) flags: FlagSet,
    /// Raw comma lists for the URL keys that were present and non-empty, by flag name.
    pub(crate) url_lists: BTreeMap<&'static str, String>,
    pub(crate) cors: String,
    pub(crate) host_whitelist: String,
    pub(crate) cluster_state: String,
    pub(crate) client_security: Security,
    pub(crate) peer_security: Security,
}

/// The second pass: `configProxy`'s raw `proxy` and `discovery-fallback` strings.
#[derive(Debug, Default)]
pub(crate) struct ProxyValues {
    pub(crate) proxy: String,
    pub(crate) discovery_fallback: String,
}

/// A decoded scalar or list.
enum Decoded {
    Str(String),
    Bool(bool),
    U64(u64),
    I64(i64),
    List(Vec<String>),
}

/// Parses the file text as YAML (etcd: `error converting YAML to JSON: yaml: ...`).
pub(crate) fn parse_yaml(text: &str) -> Result<Yaml, String> {
    serde_yaml_ng::from_str::<Yaml>(text).map_err(|err| {
        let full = err.to_string();
        let problem = full.split(" at line ").next().unwrap_or(&full).to_string();
        match err.location() {
            Some(loc) => format!(
                "error converting YAML to JSON: yaml: line {}: {problem}",
                loc.line()
            ),
            None => format!("error converting YAML to JSON: yaml: {problem}"),
        }
    })
}

fn json_error(inner: String) -> String {
    format!("error unmarshaling JSON: while decoding JSON: {inner}")
}

/// A path to the field being decoded, for Go's error text.
struct Field<'a> {
    struct_name: &'a str,
    path: &'a str,
}

fn type_error(what: &str, field: &Field<'_>, ty: &str) -> String {
    format!(
        "json: cannot unmarshal {what} into Go struct field {}.{} of type {ty}",
        field.struct_name, field.path
    )
}

/// The object a YAML mapping becomes in JSON: string keys, sorted.
fn sorted_entries(map: &serde_yaml_ng::Mapping) -> Vec<(String, &Yaml)> {
    let mut entries: Vec<(String, &Yaml)> = map
        .iter()
        .filter_map(|(key, value)| {
            let key = match untag(key) {
                Yaml::String(s) => s.clone(),
                Yaml::Number(n) => n.to_string(),
                Yaml::Bool(b) => b.to_string(),
                Yaml::Null => "null".to_string(),
                _ => return None,
            };
            Some((key, value))
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

fn untag(value: &Yaml) -> &Yaml {
    match value {
        Yaml::Tagged(tagged) => untag(&tagged.value),
        other => other,
    }
}

/// Finds the key a JSON field name matches: exact first, then ASCII case-insensitively.
fn match_key<'a, T>(table: &'a [T], key: &str, name: impl Fn(&T) -> &'static str) -> Option<&'a T> {
    table.iter().find(|entry| name(entry) == key).or_else(|| {
        table
            .iter()
            .find(|entry| name(entry).eq_ignore_ascii_case(key))
    })
}

/// YAML 1.1 booleans that yaml.v2 (which etcd uses) resolves but YAML 1.2 keeps as strings.
fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            Some(false)
        }
        _ => None,
    }
}

/// The JSON number literal a YAML number turns into.
enum NumberLiteral {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

fn number_literal(n: &serde_yaml_ng::Number) -> NumberLiteral {
    if let Some(u) = n.as_u64() {
        return NumberLiteral::Unsigned(u);
    }
    if let Some(i) = n.as_i64() {
        return NumberLiteral::Signed(i);
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    // Go marshals an integral float64 without a fraction, so it decodes as an integer.
    if f.fract() == 0.0 && f.abs() < 1e19 {
        if f >= 0.0 {
            return NumberLiteral::Unsigned(f as u64);
        }
        return NumberLiteral::Signed(f as i64);
    }
    NumberLiteral::Float(f)
}

fn literal_text(lit: &NumberLiteral) -> String {
    match lit {
        NumberLiteral::Unsigned(u) => u.to_string(),
        NumberLiteral::Signed(i) => i.to_string(),
        NumberLiteral::Float(f) => f.to_string(),
    }
}

fn kind_name(value: &Yaml) -> &'static str {
    match value {
        Yaml::Null => "null",
        Yaml::Bool(_) => "bool",
        Yaml::Number(_) => "number",
        Yaml::String(_) => "string",
        Yaml::Sequence(_) => "array",
        Yaml::Mapping(_) => "object",
        Yaml::Tagged(tagged) => kind_name(&tagged.value),
    }
}

/// Decodes one value into a Go type; `Ok(None)` is JSON `null` on a non-slice (no change).
fn decode(value: &Yaml, ty: GoType, field: &Field<'_>) -> Result<Option<Decoded>, String> {
    let value = untag(value);
    let mismatch = |what: &str| Err(type_error(what, field, ty.type_name()));
    match (ty, value) {
        (GoType::StrSlice, Yaml::Null) => Ok(Some(Decoded::List(Vec::new()))),
        (_, Yaml::Null) => Ok(None),
        (GoType::Str | GoType::NamedStr(_), Yaml::String(s)) => Ok(Some(Decoded::Str(s.clone()))),
        (GoType::Bool, Yaml::Bool(b)) => Ok(Some(Decoded::Bool(*b))),
        (GoType::Bool, Yaml::String(s)) => match yaml11_bool(s) {
            Some(b) => Ok(Some(Decoded::Bool(b))),
            None => mismatch("string"),
        },
        (GoType::StrSlice, Yaml::Sequence(items)) => {
            let mut list = Vec::with_capacity(items.len());
            for item in items {
                match untag(item) {
                    Yaml::String(s) => list.push(s.clone()),
                    Yaml::Null => list.push(String::new()),
                    other => {
                        return Err(type_error(kind_name(other), field, "string"));
                    }
                }
            }
            Ok(Some(Decoded::List(list)))
        }
        (
            GoType::Uint
            | GoType::Uint32
            | GoType::Uint64
            | GoType::Int
            | GoType::Int64
            | GoType::Duration,
            Yaml::Number(n),
        ) => {
            let lit = number_literal(n);
            let out_of_type = || {
                Err(type_error(
                    &format!("number {}", literal_text(&lit)),
                    field,
                    ty.type_name(),
                ))
            };
            match (ty, &lit) {
                (GoType::Uint | GoType::Uint64, NumberLiteral::Unsigned(u)) => {
                    Ok(Some(Decoded::U64(*u)))
                }
                (GoType::Uint32, NumberLiteral::Unsigned(u)) if *u <= u64::from(u32::MAX) => {
                    Ok(Some(Decoded::U64(*u)))
                }
                (GoType::Int | GoType::Int64 | GoType::Duration, NumberLiteral::Unsigned(u)) => {
                    match i64::try_from(*u) {
                        Ok(i) => Ok(Some(Decoded::I64(i))),
                        Err(_) => out_of_type(),
                    }
                }
                (GoType::Int | GoType::Int64 | GoType::Duration, NumberLiteral::Signed(i)) => {
                    Ok(Some(Decoded::I64(*i)))
                }
                _ => out_of_type(),
            }
        }
        (_, Yaml::String(s))
            if yaml11_bool(s).is_some() && !matches!(ty, GoType::Str | GoType::NamedStr(_)) =>
        {
            mismatch("bool")
        }
        (_, other) => mismatch(kind_name(other)),
    }
}

fn store(flags: &mut FlagSet, name: &'static str, decoded: Decoded) {
    let value = match decoded {
        Decoded::Str(s) => {
            if name == "v2-deprecation" {
                Value::StrList(vec![s])
            } else {
                Value::Str(s)
            }
        }
        Decoded::Bool(b) => Value::Bool(b),
        Decoded::U64(u) => Value::U64(u),
        Decoded::I64(i) => {
            if matches!(flags.slot(name).value, Value::Dur(_)) {
                Value::Dur(i)
            } else {
                Value::I64(i)
            }
        }
        Decoded::List(list) => Value::StrList(list),
    };
    *flags.value_mut(name) = value;
}

fn decode_security(value: &Yaml, key: &str, into: &mut Security) -> Result<(), String> {
    let map = match untag(value) {
        Yaml::Null => return Ok(()),
        Yaml::Mapping(map) => map,
        other => {
            return Err(type_error(
                kind_name(other),
                &Field {
                    struct_name: "configYAML",
                    path: key,
                },
                "embed.securityConfig",
            ));
        }
    };
    for (sub_key, sub_value) in sorted_entries(map) {
        let Some((name, ty)) = match_key(SECURITY_KEYS, &sub_key, |entry| entry.0) else {
            continue;
        };
        let path = format!("{key}.{name}");
        let field = Field {
            struct_name: "securityConfig",
            path: &path,
        };
        let Some(decoded) = decode(sub_value, *ty, &field)? else {
            continue;
        };
        match (*name, decoded) {
            ("cert-file", Decoded::Str(s)) => into.cert_file = s,
            ("key-file", Decoded::Str(s)) => into.key_file = s,
            ("client-cert-file", Decoded::Str(s)) => into.client_cert_file = s,
            ("client-key-file", Decoded::Str(s)) => into.client_key_file = s,
            ("client-cert-auth", Decoded::Bool(b)) => into.client_cert_auth = b,
            ("trusted-ca-file", Decoded::Str(s)) => into.trusted_ca_file = s,
            ("auto-tls", Decoded::Bool(b)) => into.auto_tls = b,
            ("allowed-cn", Decoded::List(l)) => into.allowed_cn = l,
            ("allowed-hostname", Decoded::List(l)) => into.allowed_hostname = l,
            _ => {}
        }
    }
    Ok(())
}

fn decode_socket_options(value: &Yaml, flags: &mut FlagSet) -> Result<(), String> {
    let map = match untag(value) {
        Yaml::Null => return Ok(()),
        Yaml::Mapping(map) => map,
        other => {
            return Err(type_error(
                kind_name(other),
                &Field {
                    struct_name: "configYAML",
                    path: "socket-options",
                },
                "transport.SocketOpts",
            ));
        }
    };
    for (sub_key, sub_value) in sorted_entries(map) {
        let Some((name, ty, flag)) = match_key(SOCKET_KEYS, &sub_key, |entry| entry.0) else {
            continue;
        };
        let path = format!("socket-options.{name}");
        let field = Field {
            struct_name: "SocketOpts",
            path: &path,
        };
        if let Some(decoded) = decode(sub_value, *ty, &field)? {
            store(flags, flag, decoded);
        }
    }
    Ok(())
}

/// The top-level mapping, or Go's error for a document that is not an object.
fn top_level<'a>(
    doc: &'a Yaml,
    go_type: &str,
) -> Result<Option<&'a serde_yaml_ng::Mapping>, String> {
    match untag(doc) {
        Yaml::Null => Ok(None),
        Yaml::Mapping(map) => Ok(Some(map)),
        other => Err(json_error(format!(
            "json: cannot unmarshal {} into Go value of type {go_type}",
            kind_name(other)
        ))),
    }
}

/// First pass: decode into etcd's `configYAML` over `embed.NewConfig()` defaults.
pub(crate) fn decode_config(doc: &Yaml) -> Result<FileValues, String> {
    let mut flags = FlagSet::new();
    // Where embed.NewConfig() differs from the flag defaults.
    *flags.value_mut("auto-compaction-mode") = Value::Str(String::new());
    *flags.value_mut("auto-compaction-retention") = Value::Str(String::new());
    *flags.value_mut("self-signed-cert-validity") = Value::U64(0);
    *flags.value_mut("log-outputs") = Value::StrList(vec!["default".to_string()]);
    let mut values = FileValues {
        flags,
        url_lists: BTreeMap::new(),
        cors: String::new(),
        host_whitelist: String::new(),
        cluster_state: "new".to_string(),
        client_security: Security::default(),
        peer_security: Security::default(),
    };
    let Some(map) = top_level(doc, "embed.configYAML")? else {
        return Ok(values);
    };
    let mut first_error: Option<String> = None;
    for (key, value) in sorted_entries(map) {
        let Some((name, ty, dest)) = match_key(CONFIG_KEYS, &key, |entry| entry.0) else {
            continue;
        };
        let field = Field {
            struct_name: "configYAML",
            path: name,
        };
        let result = match dest {
            Dest::ClientSecurity => decode_security(value, name, &mut values.client_security),
            Dest::PeerSecurity => decode_security(value, name, &mut values.peer_security),
            Dest::SocketOptions => decode_socket_options(value, &mut values.flags),
            _ => decode(value, *ty, &field).map(|decoded| {
                let Some(decoded) = decoded else { return };
                match (*dest, decoded) {
                    (Dest::Flag(flag), decoded) => store(&mut values.flags, flag, decoded),
                    (Dest::UrlList(flag), Decoded::Str(s)) => {
                        values.url_lists.insert(flag, s);
                    }
                    (Dest::Cors, Decoded::Str(s)) => values.cors = s,
                    (Dest::HostWhitelist, Decoded::Str(s)) => values.host_whitelist = s,
                    (Dest::ClusterState, Decoded::Str(s)) => values.cluster_state = s,
                    _ => {}
                }
            }),
        };
        // Go's decoder keeps going after a type error and reports the first one.
        if let Err(err) = result {
            first_error.get_or_insert(err);
        }
    }
    match first_error {
        Some(err) => Err(json_error(err)),
        None => Ok(values),
    }
}

/// Second pass: decode into etcd's `configProxy`, writing the uint fields into `flags`.
pub(crate) fn decode_proxy(doc: &Yaml, flags: &mut FlagSet) -> Result<ProxyValues, String> {
    let mut out = ProxyValues::default();
    let Some(map) = top_level(doc, "etcdmain.configProxy")? else {
        return Ok(out);
    };
    let mut first_error: Option<String> = None;
    for (key, value) in sorted_entries(map) {
        let Some((name, ty, flag)) = match_key(PROXY_KEYS, &key, |entry| entry.0) else {
            continue;
        };
        let field = Field {
            struct_name: "configProxy",
            path: name,
        };
        match decode(value, *ty, &field) {
            Ok(Some(Decoded::Str(s))) if *flag == "proxy" => out.proxy = s,
            Ok(Some(Decoded::Str(s))) => out.discovery_fallback = s,
            Ok(Some(decoded)) => store(flags, flag, decoded),
            Ok(None) => {}
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(json_error(err)),
        None => Ok(out),
    }
}
