//! Where the flag values come from: etcd's `configFromCmdLine` (command-line flags, then
//! `ETCD_*` environment variables, with etcd's conflict and "unrecognized" reporting) and
//! `configFromFile` (a `--config-file` YAML, which replaces flags and environment
//! entirely). Both end in [`validate`] and then [`finish`]; this module only fills the
//! [`FlagSet`]. Only [`load_config_file`] touches the file system.

use super::error::{ConfigError, zap_line};
use super::finish::finish;
use super::flags::{self, FlagSet, Value};
use super::goparse::{duration_string, quote};
use super::gourl::{self, GoUrl};
use super::model::EtcdConfig;
use super::validate::validate;
use super::{Report, file, getenv};

/// etcd's floor for `--raft-read-timeout` and `--raft-write-timeout`.
const RAFT_MIN_TIMEOUT_NS: i64 = 5_000_000_000;
/// `--initial-cluster`'s default, which discovery flags clear.
pub(super) const DEFAULT_INITIAL_CLUSTER: &str = "default=http://localhost:2380";

/// URL lists as validation sees them (Go spelling kept for the messages).
pub(super) struct UrlLists {
    pub(super) listen_peer: Vec<GoUrl>,
    pub(super) listen_client: Vec<GoUrl>,
    pub(super) listen_client_http: Vec<GoUrl>,
    pub(super) advertise_peer: Vec<GoUrl>,
    /// `None` is Go's nil: `--listen-client-urls` given without `--advertise-client-urls`.
    pub(super) advertise_client: Option<Vec<GoUrl>>,
    pub(super) listen_metrics: Vec<GoUrl>,
}

impl UrlLists {
    pub(super) fn from_flags(flags: &FlagSet) -> UrlLists {
        UrlLists {
            listen_peer: flags.urls("listen-peer-urls"),
            listen_client: flags.urls("listen-client-urls"),
            listen_client_http: flags.urls("listen-client-http-urls"),
            advertise_peer: flags.urls("initial-advertise-peer-urls"),
            advertise_client: Some(flags.urls("advertise-client-urls")),
            listen_metrics: flags.urls("listen-metrics-urls"),
        }
    }
}

/// etcd's `configFromCmdLine`.
pub(super) fn from_command_line(
    mut flags: FlagSet,
    env: &[(String, String)],
    report: &mut Report,
) -> Result<EtcdConfig, ConfigError> {
    let mut env: Vec<(String, String)> = env.to_vec();
    if let Some(value) = getenv(&env, "ETCD_VERSION").filter(|v| !v.is_empty()) {
        report.warnings.push(format!(
            "cannot set special environment variable key=ETCD_VERSION value={value}"
        ));
        env.retain(|(key, _)| key != "ETCD_VERSION");
    }
    let outcome = flags.apply_env(&env);
    report.warnings.append(&mut flags.warnings);
    report.infos.extend(outcome.used);
    if let Some(key) = outcome.conflict {
        let mut message = String::new();
        for line in &outcome.unrecognized {
            message.push_str(&zap_line("warn", line, &[]));
        }
        let msg = "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))";
        message.push_str(&zap_line("fatal", msg, &[("environment-variable", &key)]));
        return Err(ConfigError {
            message,
            exit_code: 1,
            error: format!(
                "conflicting environment variable {} is shadowed by corresponding command-line flag (either unset environment variable or disable flag)",
                quote(&key)
            ),
        });
    }
    report.warnings.extend(outcome.unrecognized);
    if let Some(error) = outcome.error {
        return Err(ConfigError::verify(error));
    }

    for name in ["raft-read-timeout", "raft-write-timeout"] {
        if flags.duration(name) < RAFT_MIN_TIMEOUT_NS {
            *flags.value_mut(name) = Value::Dur(RAFT_MIN_TIMEOUT_NS);
            report.infos.push(format!(
                "{name} increased to minimum value: {}",
                duration_string(RAFT_MIN_TIMEOUT_NS)
            ));
        }
    }

    let mut urls = UrlLists::from_flags(&flags);
    let may_be_proxy = flags.string("proxy") != "off"
        || (!flags.string("discovery").is_empty() && flags.string("discovery-fallback") == "proxy");
    let missing_advertise_client =
        flags.is_set("listen-client-urls") && !flags.is_set("advertise-client-urls");
    if !may_be_proxy && missing_advertise_client {
        urls.advertise_client = None;
    }
    let discovery_set = !flags.string("discovery").is_empty()
        || !flags.string("discovery-srv").is_empty()
        || !flags.string("discovery-srv-name").is_empty()
        || !flags.strings("discovery-endpoints").is_empty();
    if discovery_set && !flags.is_set("initial-cluster") {
        *flags.value_mut("initial-cluster") = Value::Str(String::new());
    }
    let cluster_state = flags.string("initial-cluster-state");
    validate(&flags, &urls, &cluster_state, may_be_proxy, report)?;
    finish(flags, urls, &cluster_state, None, report)
}

/// etcd's `configFromFile` (embed's `ConfigFromFile`, then the proxy settings).
pub(super) fn load_config_file(path: &str, report: &mut Report) -> Result<EtcdConfig, ConfigError> {
    let text = read_file(path).map_err(ConfigError::verify)?;
    let doc = file::parse_yaml(&text).map_err(ConfigError::verify)?;
    let mut values = file::decode_config(&doc).map_err(ConfigError::verify)?;

    // URL keys, in etcd's order; a bad one is printed and exits 1 outside the logger.
    const URL_KEYS: &[(&str, &str)] = &[
        ("listen-peer-urls", "listen-peer-urls"),
        ("listen-client-urls", "listen-client-urls"),
        ("listen-client-http-urls", "listen-client-http-urls"),
        ("initial-advertise-peer-urls", "initial-advertise-peer-urls"),
        // etcd's message names the wrong key here; kept as is.
        ("advertise-client-urls", "advertise-peer-urls"),
        ("listen-metrics-urls", "listen-metrics-urls"),
    ];
    for (flag, label) in URL_KEYS {
        let Some(raw) = values.url_lists.get(flag).filter(|raw| !raw.is_empty()) else {
            continue;
        };
        let parsed = gourl::new_urls_from_list(raw).map_err(|err| {
            ConfigError::plain(format!("unexpected error setting up {label}: {err}"))
        })?;
        *values.flags.value_mut(flag) = Value::Urls {
            values: parsed.iter().map(GoUrl::to_go_string).collect(),
            urls: parsed,
        };
    }
    if !values.cors.is_empty() {
        let cors = if values.cors == "*" {
            Value::Urls {
                values: ["*".to_string()].into_iter().collect(),
                urls: Vec::new(),
            }
        } else {
            let parsed = gourl::new_urls_from_list(&values.cors).map_err(|err| {
                ConfigError::panic(format!("new UniqueURLs should never fail: {err}"))
            })?;
            Value::Urls {
                values: parsed.iter().map(GoUrl::to_go_string).collect(),
                urls: parsed,
            }
        };
        *values.flags.value_mut("cors") = cors;
    }
    if !values.host_whitelist.is_empty() {
        *values.flags.value_mut("host-whitelist") = Value::StrSet(
            values
                .host_whitelist
                .split(',')
                .map(str::to_string)
                .collect(),
        );
    }
    let flags = &mut values.flags;
    if (!flags.string("discovery").is_empty() || !flags.string("discovery-srv").is_empty())
        && flags.string("initial-cluster") == DEFAULT_INITIAL_CLUSTER
    {
        *flags.value_mut("initial-cluster") = Value::Str(String::new());
    }
    if values.cluster_state.is_empty() {
        values.cluster_state = "new".to_string();
    }
    let client = &values.client_security;
    let peer = &values.peer_security;
    let tls: [(&str, Value); 16] = [
        ("cert-file", Value::Str(client.cert_file.clone())),
        ("key-file", Value::Str(client.key_file.clone())),
        (
            "client-cert-file",
            Value::Str(client.client_cert_file.clone()),
        ),
        (
            "client-key-file",
            Value::Str(client.client_key_file.clone()),
        ),
        ("client-cert-auth", Value::Bool(client.client_cert_auth)),
        (
            "trusted-ca-file",
            Value::Str(client.trusted_ca_file.clone()),
        ),
        ("auto-tls", Value::Bool(client.auto_tls)),
        (
            "client-cert-allowed-hostname",
            Value::StrList(client.allowed_hostname.clone()),
        ),
        ("peer-cert-file", Value::Str(peer.cert_file.clone())),
        ("peer-key-file", Value::Str(peer.key_file.clone())),
        (
            "peer-client-cert-file",
            Value::Str(peer.client_cert_file.clone()),
        ),
        (
            "peer-client-key-file",
            Value::Str(peer.client_key_file.clone()),
        ),
        ("peer-client-cert-auth", Value::Bool(peer.client_cert_auth)),
        (
            "peer-trusted-ca-file",
            Value::Str(peer.trusted_ca_file.clone()),
        ),
        ("peer-auto-tls", Value::Bool(peer.auto_tls)),
        (
            "peer-cert-allowed-cn",
            Value::StrList(peer.allowed_cn.clone()),
        ),
    ];
    for (name, value) in tls {
        *flags.value_mut(name) = value;
    }
    *flags.value_mut("peer-cert-allowed-hostname") = Value::StrList(peer.allowed_hostname.clone());
    if flags.unsigned("self-signed-cert-validity") == 0 {
        *flags.value_mut("self-signed-cert-validity") = Value::U64(1);
    }
    let urls = UrlLists::from_flags(flags);
    validate(flags, &urls, &values.cluster_state, false, report)?;

    let proxy = file::decode_proxy(&doc, flags).map_err(ConfigError::verify)?;
    if !proxy.discovery_fallback.is_empty() {
        if !flags::FALLBACKS.contains(&proxy.discovery_fallback.as_str()) {
            return Err(ConfigError::plain(
                "unexpected error setting up discovery-fallback flag: invalid value".to_string(),
            ));
        }
        *flags.value_mut("discovery-fallback") = Value::Str(proxy.discovery_fallback);
    }
    if !proxy.proxy.is_empty() {
        if !flags::PROXY_MODES.contains(&proxy.proxy.as_str()) {
            return Err(ConfigError::plain(
                "unexpected error setting up proxyFlag: invalid value".to_string(),
            ));
        }
        *flags.value_mut("proxy") = Value::Str(proxy.proxy);
    }
    report.infos.push(format!(
        "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided path={path}"
    ));
    let cluster_state = values.cluster_state.clone();
    finish(
        values.flags,
        urls,
        &cluster_state,
        Some(path.to_string()),
        report,
    )
}

/// `ioutil.ReadFile` with Go's error text (`open <path>: no such file or directory`).
fn read_file(path: &str) -> Result<String, String> {
    use std::io::Read as _;
    fn go_text(err: &std::io::Error) -> String {
        let text = err.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        let mut chars = text.chars();
        match chars.next() {
            Some(first) => first.to_lowercase().chain(chars).collect(),
            None => String::new(),
        }
    }
    let mut file =
        std::fs::File::open(path).map_err(|err| format!("open {path}: {}", go_text(&err)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|err| format!("read {path}: {}", go_text(&err)))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
