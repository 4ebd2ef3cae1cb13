//! One etcd endpoint as a flag gives it, and the tonic endpoint dialed for it.
//!
//! etcd's clients take `host:port` or a URL: `http://` and `unix://` mean plain TCP, `https://`
//! and `unixs://` mean TLS. A scheme is dropped before dialing (the channel is always built on
//! `http://host:port`; TLS, when wanted, comes from the connector, not from the URI), and so
//! is a trailing `/`.

use std::time::Duration;

use tonic::transport::Endpoint;

use crate::error::{Error, Result};

/// An endpoint read from its flag form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The endpoint as given, for errors.
    pub given: String,
    /// `host:port` (an IPv6 host in brackets), what is dialed and logged.
    pub host_port: String,
    /// Whether the scheme asks for TLS (`https`, `unixs`).
    pub secure: bool,
}

impl Target {
    /// Reads `raw` (`host:port` or `scheme://host:port[/]`).
    pub fn parse(raw: &str) -> Target {
        let (secure, rest) = match raw.split_once("://") {
            Some((scheme, rest)) => (scheme == "https" || scheme == "unixs", rest),
            None => (false, raw),
        };
        Target {
            given: raw.to_owned(),
            host_port: rest.trim_end_matches('/').to_owned(),
            secure,
        }
    }

    /// Reads every endpoint of a list; an empty list is [`Error::NoEndpoints`].
    pub fn parse_list(raw: &[String]) -> Result<Vec<Target>> {
        if raw.is_empty() {
            return Err(Error::NoEndpoints);
        }
        Ok(raw.iter().map(|endpoint| Target::parse(endpoint)).collect())
    }
}

/// How connections to an endpoint are made and kept alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DialOptions {
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// The interval of HTTP/2 PINGs while a call is open. Like clientv3 (grpc-go's
    /// `PermitWithoutStream` false), an idle connection is not pinged: etcd's servers send
    /// away a client that pings with no call open (`too_many_pings`).
    pub keepalive_time: Duration,
    /// How long a PING may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
}

impl DialOptions {
    /// The tonic endpoint for `target`: TCP_NODELAY, the connect timeout and keep-alive.
    pub fn endpoint(&self, target: &Target) -> Result<Endpoint> {
        let endpoint =
            Endpoint::from_shared(format!("http://{}", target.host_port)).map_err(|e| {
                Error::BadEndpoint {
                    endpoint: target.given.clone(),
                    reason: e.to_string(),
                }
            })?;
        Ok(endpoint
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keepalive_time)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(raw: &str) -> (String, bool) {
        let parsed = Target::parse(raw);
        assert_eq!(parsed.given, raw);
        (parsed.host_port, parsed.secure)
    }

    #[test]
    fn schemes_are_dropped_and_tls_ones_noted() {
        assert_eq!(target("127.0.0.1:2379"), ("127.0.0.1:2379".into(), false));
        assert_eq!(
            target("http://127.0.0.1:2379"),
            ("127.0.0.1:2379".into(), false)
        );
        assert_eq!(target("https://h:1/"), ("h:1".into(), true));
        assert_eq!(target("unix://h:1"), ("h:1".into(), false));
        assert_eq!(target("unixs://h:1"), ("h:1".into(), true));
        assert_eq!(target("https://[::1]:2379"), ("[::1]:2379".into(), true));
        assert_eq!(target("h:1//"), ("h:1".into(), false));
    }

    #[test]
    fn an_empty_list_is_refused() {
        assert!(matches!(Target::parse_list(&[]), Err(Error::NoEndpoints)));
        let list = Target::parse_list(&["a:1".to_owned(), "https://b:2".to_owned()])
            .expect("two endpoints");
        assert_eq!(list[0].host_port, "a:1");
        assert!(!list[0].secure);
        assert_eq!(list[1].host_port, "b:2");
        assert!(list[1].secure);
    }

    #[test]
    fn endpoints_carry_the_options_and_bad_ones_name_themselves() {
        let options = DialOptions {
            connect_timeout: Duration::from_secs(2),
            keepalive_time: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
        };
        let endpoint = options
            .endpoint(&Target::parse("https://[::1]:2379/"))
            .expect("a valid endpoint");
        assert_eq!(endpoint.uri().to_string(), "http://[::1]:2379/");
        assert_eq!(endpoint.uri().port_u16(), Some(2379));

        let err = options
            .endpoint(&Target::parse("http://bad host:1"))
            .expect_err("a space is no part of a host");
        match &err {
            Error::BadEndpoint { endpoint, reason } => {
                assert_eq!(endpoint, "http://bad host:1");
                assert!(!reason.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            err.to_string()
                .starts_with("invalid endpoint \"http://bad host:1\": ")
        );
    }
}
