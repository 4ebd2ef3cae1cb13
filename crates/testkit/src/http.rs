//! A minimal HTTP/1.1 GET client for the member's plain-HTTP endpoints (`/health`, `/version`,
//! `/metrics`). It sends `Connection: close` and understands `Content-Length`, chunked and
//! read-to-EOF bodies; that is all those endpoints need.

use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A parsed HTTP response.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// Status code, e.g. 200.
    pub status: u16,
    /// Header names (as sent) and values, in order.
    pub headers: Vec<(String, String)>,
    /// Body decoded as UTF-8 (lossy).
    pub body: String,
}

impl HttpResponse {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("body is not JSON: {:?}", self.body))
    }
}

/// `GET path` from `host:port` (e.g. `"127.0.0.1:23790"`), with a 5 s overall timeout.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<HttpResponse> {
    tokio::time::timeout(Duration::from_secs(5), get_inner(addr, path))
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out"))?
}

/// `method path` to `host:port` with extra `headers` and `body` (sent with a
/// `Content-Length`), with a 5 s overall timeout: for the peer port's endpoints, which etcd
/// answers by method, headers and body.
pub async fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<HttpResponse> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        stream.write_all(&bytes).await?;
        // Read until the answer is whole, not until EOF: etcd's peer port (behind cmux)
        // closes a `Connection: close` connection only at its 5 s read deadline.
        let mut raw = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&chunk[..n]);
            if is_whole(&raw) {
                break;
            }
        }
        parse(&raw)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("{method} http://{addr}{path} timed out"))?
}

/// Whether `raw` holds a whole response: headers and all of a `Content-Length` or chunked body.
fn is_whole(raw: &[u8]) -> bool {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let rest = &raw[split + 4..];
    let status = head.split(' ').nth(1).unwrap_or_default();
    if status == "204" || status == "304" {
        return true;
    }
    if head.contains("transfer-encoding: chunked") {
        return rest.ends_with(b"0\r\n\r\n");
    }
    let length = head
        .split("\r\n")
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    length.is_some_and(|len| rest.len() >= len)
}

async fn get_inner(addr: &str, path: &str) -> anyhow::Result<HttpResponse> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    exchange(stream, addr, path).await
}

async fn exchange<S>(mut stream: S, addr: &str, path: &str) -> anyhow::Result<HttpResponse>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify once the body is sent.
    if let Err(e) = stream.read_to_end(&mut raw).await
        && raw.is_empty()
    {
        return Err(e.into());
    }
    parse(&raw)
}

/// `GET path` over TLS from `host:port`, trusting `ca_file` and presenting `client` (certificate
/// and key PEM files) when given; 5 s overall timeout.
pub async fn https_get(
    addr: &str,
    path: &str,
    ca_file: &std::path::Path,
    client: Option<&crate::certs::CertFiles>,
) -> anyhow::Result<HttpResponse> {
    let get = async {
        let connector = tls_connector(ca_file, client, &[b"http/1.1"])?;
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
        let stream = connector
            .connect(name, tcp)
            .await
            .context("TLS handshake")?;
        exchange(stream, addr, path).await
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .with_context(|| format!("GET https://{addr}{path} timed out"))?
}

/// A rustls connector trusting `ca_file`, presenting `client` when given, offering `alpn`.
pub fn tls_connector(
    ca_file: &std::path::Path,
    client: Option<&crate::certs::CertFiles>,
    alpn: &[&[u8]],
) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file)? {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client {
        Some(files) => {
            let certs =
                CertificateDer::pem_file_iter(&files.cert)?.collect::<Result<Vec<_>, _>>()?;
            builder.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(&files.key)?)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}

fn parse(raw: &[u8]) -> anyhow::Result<HttpResponse> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of HTTP headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/") {
        bail!("not an HTTP response: {status_line:?}");
    }
    let status: u16 = parts
        .next()
        .unwrap_or_default()
        .parse()
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut resp = HttpResponse {
        status,
        headers,
        body: String::new(),
    };
    let body = if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        dechunk(rest)?
    } else if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().context("bad content-length")?;
        rest.get(..len)
            .context("body shorter than content-length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    resp.body = String::from_utf8_lossy(&body).into_owned();
    Ok(resp)
}

fn dechunk(mut rest: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk size")?;
        let size_field = String::from_utf8_lossy(&rest[..eol]);
        let size_hex = size_field.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("bad chunk size {size_hex:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(rest.get(..size).context("truncated chunk")?);
        rest = rest.get(size + 2..).context("truncated chunk trailer")?;
    }
}

/// The certificate (DER) a TLS server at `addr` presents to a new connection that trusts
/// `ca_file` and presents `client` when given.
pub async fn served_certificate(
    addr: &str,
    ca_file: &std::path::Path,
    client: Option<&crate::certs::CertFiles>,
) -> anyhow::Result<Vec<u8>> {
    let handshake = async {
        let connector = tls_connector(ca_file, client, &[b"h2"])?;
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
        let stream = connector
            .connect(name, tcp)
            .await
            .context("TLS handshake")?;
        let (_, session) = stream.get_ref();
        let cert = session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .context("no server certificate")?;
        anyhow::Ok(cert.as_ref().to_vec())
    };
    tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .with_context(|| format!("TLS handshake with {addr} timed out"))?
}

/// Whether a TLS 1.2-only client completes a handshake with `addr` (trusting `ca_file`).
pub async fn tls12_handshake(addr: &str, ca_file: &std::path::Path) -> anyhow::Result<()> {
    tls_handshake_with(addr, ca_file, &rustls::version::TLS12).await
}

/// Whether a TLS 1.3-only client completes a handshake with `addr` (trusting `ca_file`).
pub async fn tls13_handshake(addr: &str, ca_file: &std::path::Path) -> anyhow::Result<()> {
    tls_handshake_with(addr, ca_file, &rustls::version::TLS13).await
}

/// A handshake with `addr` offering only `version`.
async fn tls_handshake_with(
    addr: &str,
    ca_file: &std::path::Path,
    version: &'static rustls::SupportedProtocolVersion,
) -> anyhow::Result<()> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let handshake = async {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file)? {
            roots.add(cert?)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[version])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tcp = TcpStream::connect(addr).await?;
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
        connector
            .connect(name, tcp)
            .await
            .with_context(|| format!("{version:?} handshake"))?;
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .with_context(|| format!("TLS handshake with {addr} timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_body() {
        let r =
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{\"health\":\"true\"}").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, r#"{"health":"true"}"#);
        assert_eq!(r.json().unwrap()["health"], "true");
    }

    #[test]
    fn chunked_body() {
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, "abcdefg");
    }

    #[test]
    fn eof_body_and_header_lookup() {
        let r = parse(b"HTTP/1.0 404 Not Found\r\nX-A: 1\r\n\r\nnope").unwrap();
        assert_eq!(
            (r.status, r.body.as_str(), r.header("x-a")),
            (404, "nope", Some("1"))
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"\x00\x00\x12\x04\r\n\r\n").is_err());
    }
}
