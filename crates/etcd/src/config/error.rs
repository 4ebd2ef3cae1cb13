//! [`ConfigError`]: what the `etcd` binary prints and the status it exits with when its
//! configuration is rejected, in each of the ways etcd 3.5 reports it (a Go `flag` usage
//! error, a zap `failed to verify flags` line, a plain `Fprintf`, a Go panic, a startup
//! failure). Owns the zap line format; it decides nothing about *which* error applies.

use std::fmt;

use super::goparse::json_escape;
use super::usage_text;
use super::validate::ERR_UNSET_ADVERTISE_CLIENT_URLS;

/// A configuration error, carrying etcd's output and exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Write this to stderr verbatim (it ends with a newline).
    pub message: String,
    /// Exit with this status.
    pub exit_code: i32,
    /// The bare error text (what etcd puts in the `"error"` field), for logging it yourself.
    pub error: String,
}

impl ConfigError {
    /// A Go `flag` parse error: the error line, then the usage text. Exit 2.
    pub(super) fn usage(error: String) -> ConfigError {
        ConfigError {
            message: format!("{error}\n{}\n", usage_text()),
            exit_code: 2,
            error,
        }
    }

    /// etcd's `failed to verify flags` path. Exit 1.
    pub(super) fn verify(error: String) -> ConfigError {
        let mut message = zap_line("warn", "failed to verify flags", &[("error", &error)]);
        if error == ERR_UNSET_ADVERTISE_CLIENT_URLS {
            message.push_str(&zap_line(
                "warn",
                "advertise client URLs are not set",
                &[("error", &error)],
            ));
        }
        ConfigError {
            message,
            exit_code: 1,
            error,
        }
    }

    /// An error etcd prints with `fmt.Fprintf(os.Stderr, ...)` or `log.Fatalf`. Exit 1.
    pub(super) fn plain(error: String) -> ConfigError {
        ConfigError {
            message: format!("{error}\n"),
            exit_code: 1,
            error,
        }
    }

    /// A Go panic (etcd panics on a bad `--log-level`). Exit 2.
    pub(super) fn panic(error: String) -> ConfigError {
        ConfigError {
            message: format!("panic: {error}\n"),
            exit_code: 2,
            error,
        }
    }

    /// A failure etcd hits while starting the server (after flag verification). Exit 1.
    pub(super) fn start(error: String) -> ConfigError {
        let mut message = zap_line("warn", "failed to start etcd", &[("error", &error)]);
        message.push_str(&zap_line("fatal", "discovery failed", &[("error", &error)]));
        ConfigError {
            message,
            exit_code: 1,
            error,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

impl std::error::Error for ConfigError {}

/// One zap JSON log line as etcd prints it, minus `ts` and `caller`.
pub(super) fn zap_line(level: &str, msg: &str, fields: &[(&str, &str)]) -> String {
    let mut line = format!(
        "{{\"level\":\"{}\",\"msg\":\"{}\"",
        json_escape(level),
        json_escape(msg)
    );
    for (key, value) in fields {
        line.push_str(&format!(
            ",\"{}\":\"{}\"",
            json_escape(key),
            json_escape(value)
        ));
    }
    line.push_str("}\n");
    line
}
