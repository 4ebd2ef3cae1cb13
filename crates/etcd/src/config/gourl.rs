//! URL handling with Go's semantics: the subset of `net/url.Parse`, `net.SplitHostPort`,
//! `net.ParseIP` and etcd's `types.NewURLs` that decides which URLs etcd accepts and what
//! it says about the rest. The `url` crate normalises differently (drops default ports,
//! adds a trailing `/`), so validation happens here and conversion to [`url::Url`] last.

use std::net::IpAddr;

use super::goparse::quote;

/// A URL as Go's `url.Parse` splits it, limited to the parts etcd looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoUrl {
    pub(crate) scheme: String,
    pub(crate) user: Option<String>,
    /// `host[:port]` exactly as written (Go keeps it unnormalised).
    pub(crate) host: String,
    pub(crate) opaque: String,
    pub(crate) path: String,
    pub(crate) raw_query: String,
    pub(crate) force_query: bool,
    pub(crate) fragment: String,
}

impl GoUrl {
    /// Go's `URL.String()` for the shapes etcd accepts.
    pub(crate) fn to_go_string(&self) -> String {
        let mut out = String::new();
        if !self.scheme.is_empty() {
            out.push_str(&self.scheme);
            out.push(':');
        }
        if !self.opaque.is_empty() {
            out.push_str(&self.opaque);
        } else {
            if (!self.scheme.is_empty() || !self.host.is_empty() || self.user.is_some())
                && (!self.host.is_empty() || !self.path.is_empty() || self.user.is_some())
            {
                out.push_str("//");
            }
            if let Some(user) = &self.user {
                out.push_str(user);
                out.push('@');
            }
            out.push_str(&self.host);
            out.push_str(&self.path);
        }
        if self.force_query || !self.raw_query.is_empty() {
            out.push('?');
            out.push_str(&self.raw_query);
        }
        if !self.fragment.is_empty() {
            out.push('#');
            out.push_str(&self.fragment);
        }
        out
    }
}

/// Go's `url.Parse`. The error text is Go's: `parse "<url>": <why>`.
pub(crate) fn parse(raw: &str) -> Result<GoUrl, String> {
    let (without_frag, fragment) = match raw.split_once('#') {
        Some((before, after)) => (before, after),
        None => (raw, ""),
    };
    let mut url = parse_no_fragment(without_frag)
        .map_err(|why| format!("parse {}: {why}", quote(without_frag)))?;
    if !fragment.is_empty() {
        url.fragment =
            unescape(fragment, false).map_err(|why| format!("parse {}: {why}", quote(raw)))?;
    }
    Ok(url)
}

fn parse_no_fragment(raw: &str) -> Result<GoUrl, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".to_string());
    }
    let mut url = GoUrl {
        scheme: String::new(),
        user: None,
        host: String::new(),
        opaque: String::new(),
        path: String::new(),
        raw_query: String::new(),
        force_query: false,
        fragment: String::new(),
    };
    if raw == "*" {
        url.path = "*".to_string();
        return Ok(url);
    }
    let (scheme, mut rest) = split_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        url.force_query = true;
        rest = &rest[..rest.len() - 1];
    } else if let Some((before, query)) = rest.split_once('?') {
        url.raw_query = query.to_string();
        rest = before;
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            url.opaque = rest.to_string();
            return Ok(url);
        }
        let segment = rest.split('/').next().unwrap_or("");
        if segment.contains(':') {
            return Err("first path segment in URL cannot contain colon".to_string());
        }
    }
    if (!url.scheme.is_empty() || !rest.starts_with("///")) && rest.starts_with("//") {
        let authority_and_path = &rest[2..];
        let (authority, path) = match authority_and_path.find('/') {
            Some(i) => (&authority_and_path[..i], &authority_and_path[i..]),
            None => (authority_and_path, ""),
        };
        let (user, host) = parse_authority(authority)?;
        url.user = user;
        url.host = host;
        rest = path;
    }
    url.path = unescape(rest, false)?;
    Ok(url)
}

/// Go's `getScheme`.
fn split_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' => {
                if i == 0 {
                    return Ok(("", raw));
                }
            }
            b':' => {
                if i == 0 {
                    return Err("missing protocol scheme".to_string());
                }
                return Ok((&raw[..i], &raw[i + 1..]));
            }
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_authority(authority: &str) -> Result<(Option<String>, String), String> {
    match authority.rfind('@') {
        None => Ok((None, parse_host(authority)?)),
        Some(i) => {
            let userinfo = &authority[..i];
            if !userinfo.bytes().all(valid_userinfo_byte) {
                return Err("net/url: invalid userinfo".to_string());
            }
            Ok((Some(userinfo.to_string()), parse_host(&authority[i + 1..])?))
        }
    }
}

fn valid_userinfo_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&b) || b >= 0x80
}

/// Go's `parseHost`.
fn parse_host(host: &str) -> Result<String, String> {
    if host.starts_with('[') {
        let Some(close) = host.rfind(']') else {
            return Err("missing ']' in host".to_string());
        };
        let colon_port = &host[close + 1..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
    } else if let Some(i) = host.rfind(':') {
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
    }
    for c in host.chars() {
        if c.is_ascii() && !c.is_ascii_alphanumeric() && !"-_.~!$&'()*+,;=:[]<>\"%".contains(c) {
            return Err(format!(
                "invalid character {} in host name",
                quote(&c.to_string())
            ));
        }
    }
    unescape(host, true)
}

fn valid_optional_port(port: &str) -> bool {
    if port.is_empty() {
        return true;
    }
    match port.strip_prefix(':') {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Percent-decoding with Go's error for a malformed escape.
fn unescape(s: &str, host: bool) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
            match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                (Some(hi), Some(lo)) => {
                    if host && hi < 8 && &s[i..i + 3] != "%25" {
                        return Err(format!("invalid URL escape {}", quote(&s[i..i + 3])));
                    }
                    out.push((hi * 16 + lo) as u8);
                    i += 3;
                }
                _ => {
                    let end = (i + 3).min(bytes.len());
                    let seq = String::from_utf8_lossy(&bytes[i..end]).into_owned();
                    return Err(format!("invalid URL escape {}", quote(&seq)));
                }
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `net.SplitHostPort`; the error is Go's `*net.AddrError` text.
pub(crate) fn split_host_port(hostport: &str) -> Result<(String, String), String> {
    let addr_err = |why: &str| format!("address {hostport}: {why}");
    let Some(last_colon) = hostport.rfind(':') else {
        return Err(addr_err("missing port in address"));
    };
    let (host, j, k) = if hostport.starts_with('[') {
        let Some(end) = hostport.find(']') else {
            return Err(addr_err("missing ']' in address"));
        };
        if end + 1 == hostport.len() {
            return Err(addr_err("missing port in address"));
        }
        if end + 1 != last_colon {
            if hostport.as_bytes()[end + 1] == b':' {
                return Err(addr_err("too many colons in address"));
            }
            return Err(addr_err("missing port in address"));
        }
        (&hostport[1..end], 1, end + 1)
    } else {
        let host = &hostport[..last_colon];
        if host.contains(':') {
            return Err(addr_err("too many colons in address"));
        }
        (host, 0, 0)
    };
    if hostport[j..].contains('[') {
        return Err(addr_err("unexpected '[' in address"));
    }
    if hostport[k..].contains(']') {
        return Err(addr_err("unexpected ']' in address"));
    }
    Ok((host.to_string(), hostport[last_colon + 1..].to_string()))
}

/// Go's `net.ParseIP(host) != nil`.
pub(crate) fn is_ip(host: &str) -> bool {
    if host.contains('%') {
        return false;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => host
            .split('.')
            .all(|octet| octet == "0" || !octet.starts_with('0')),
        Ok(IpAddr::V6(_)) => true,
        Err(_) => false,
    }
}

/// etcd's `types.NewURLs`: trims each entry, parses it, and insists on an http, https, unix
/// or unixs scheme, a `host:port` and no path. The result is sorted by string, duplicates
/// kept, as etcd does.
pub(crate) fn new_urls<S: AsRef<str>>(inputs: &[S]) -> Result<Vec<GoUrl>, String> {
    if inputs.is_empty() {
        return Err("no valid URLs given".to_string());
    }
    let mut urls = Vec::with_capacity(inputs.len());
    for input in inputs {
        let trimmed = input.as_ref().trim();
        let url = parse(trimmed)?;
        if !matches!(url.scheme.as_str(), "http" | "https" | "unix" | "unixs") {
            return Err(format!(
                "URL scheme must be http, https, unix, or unixs: {trimmed}"
            ));
        }
        if split_host_port(&url.host).is_err() {
            return Err(format!(
                "URL address does not have the form \"host:port\": {trimmed}"
            ));
        }
        if !url.path.is_empty() {
            return Err(format!("URL must not contain a path: {trimmed}"));
        }
        urls.push(url);
    }
    urls.sort_by_key(GoUrl::to_go_string);
    Ok(urls)
}

/// Splits a comma list and runs [`new_urls`] on it (`strings.Split(s, ",")`).
pub(crate) fn new_urls_from_list(list: &str) -> Result<Vec<GoUrl>, String> {
    let parts: Vec<&str> = list.split(',').collect();
    new_urls(&parts)
}

/// Converts a validated Go URL to a [`url::Url`].
pub(crate) fn to_url(go: &GoUrl) -> Result<url::Url, String> {
    let text = go.to_go_string();
    url::Url::parse(&text).map_err(|err| format!("parse {}: {err}", quote(&text)))
}

/// etcd's `checkBindURLs`: listen URLs must name an IP (or `localhost`), unix sockets aside.
pub(crate) fn check_bind_urls(urls: &[GoUrl]) -> Result<(), String> {
    for url in urls {
        if url.scheme == "unix" || url.scheme == "unixs" {
            continue;
        }
        let (host, _) = split_host_port(&url.host)?;
        if host == "localhost" {
            continue;
        }
        if !is_ip(&host) {
            return Err(format!(
                "expected IP in URL for binding ({})",
                url.to_go_string()
            ));
        }
    }
    Ok(())
}

/// etcd's `checkHostURLs`: advertised URLs need a non-empty host.
pub(crate) fn check_host_urls(urls: &[GoUrl]) -> Result<(), String> {
    for url in urls {
        let (host, _) = split_host_port(&url.host)?;
        if host.is_empty() {
            return Err(format!("unexpected empty host ({})", url.to_go_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_urls_reproduces_etcd_messages() {
        let cases: &[(&str, &str)] = &[
            (
                "http://127.0.0.1:2379/foo",
                "URL must not contain a path: http://127.0.0.1:2379/foo",
            ),
            (
                "http://127.0.0.1:2379/",
                "URL must not contain a path: http://127.0.0.1:2379/",
            ),
            (
                "ftp://127.0.0.1:2379",
                "URL scheme must be http, https, unix, or unixs: ftp://127.0.0.1:2379",
            ),
            (
                "http://127.0.0.1",
                "URL address does not have the form \"host:port\": http://127.0.0.1",
            ),
            ("", "URL scheme must be http, https, unix, or unixs: "),
            (
                "localhost:2379",
                "URL scheme must be http, https, unix, or unixs: localhost:2379",
            ),
            (
                "127.0.0.1:2379",
                "parse \"127.0.0.1:2379\": first path segment in URL cannot contain colon",
            ),
            (
                "http://127.0.0.1:abc",
                "parse \"http://127.0.0.1:abc\": invalid port \":abc\" after host",
            ),
            (":2379", "parse \":2379\": missing protocol scheme"),
            ("http://[::1", "parse \"http://[::1\": missing ']' in host"),
        ];
        for (input, want) in cases {
            assert_eq!(new_urls(&[*input]).unwrap_err(), *want, "input {input:?}");
        }
    }

    #[test]
    fn accepted_urls_keep_their_go_spelling_and_are_sorted() {
        let urls = new_urls_from_list(" http://b:2379,unix://etcd.sock:1,http://[::1]:80").unwrap();
        let spelled: Vec<String> = urls.iter().map(GoUrl::to_go_string).collect();
        assert_eq!(
            spelled,
            ["http://[::1]:80", "http://b:2379", "unix://etcd.sock:1"]
        );
        assert!(new_urls_from_list("http://:2379").is_ok());
        assert!(new_urls_from_list("http://127.0.0.1:").is_ok());
    }

    #[test]
    fn host_checks_match_etcd() {
        let urls = new_urls_from_list("http://example.com:2379").unwrap();
        assert_eq!(
            check_bind_urls(&urls).unwrap_err(),
            "expected IP in URL for binding (http://example.com:2379)"
        );
        let ok = new_urls_from_list("http://localhost:1,http://0.0.0.0:2,http://[::]:3,unix://a:1")
            .unwrap();
        assert!(check_bind_urls(&ok).is_ok());
        let empty = new_urls_from_list("http://:2379").unwrap();
        assert_eq!(
            check_host_urls(&empty).unwrap_err(),
            "unexpected empty host (http://:2379)"
        );
        assert!(!is_ip("127.000.0.1"));
        assert!(is_ip("::ffff:1.2.3.4"));
        assert_eq!(
            split_host_port("a:b:c").unwrap_err(),
            "address a:b:c: too many colons in address"
        );
    }
}
