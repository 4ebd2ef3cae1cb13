//! Failures of peer calls in Go's words. etcd's members log a refused TLS handshake as Go's
//! `crypto/tls` says it (`remote error: tls: bad certificate`), and operators grep for that
//! text, so a member of ours says the same.

/// The text Go's TLS stack gives for a failed call whose cause is a TLS alert from the other
/// side (`remote error: tls: bad certificate`), which operators grep etcd's logs for; otherwise
/// the error's own text. Looks through `error`'s sources (a gRPC status, a hyper or I/O error).
pub fn transport_error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = Some(error);
    while let Some(e) = cause {
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::AlertReceived(alert)) = tls {
            return format!("remote error: tls: {}", go_alert_text(*alert));
        }
        // Some layers keep only the text of rustls' error.
        if let Some(name) = e.to_string().split("received fatal alert: ").nth(1)
            && let Some(alert) = (0..=u8::MAX)
                .map(rustls::AlertDescription::from)
                .find(|alert| format!("{alert:?}") == name.trim_end_matches(['"', ')']))
        {
            return format!("remote error: tls: {}", go_alert_text(alert));
        }
        cause = e.source();
    }
    error.to_string()
}

/// Go's `crypto/tls` name of an alert.
fn go_alert_text(alert: rustls::AlertDescription) -> String {
    use rustls::AlertDescription as A;
    match alert {
        A::CloseNotify => "close notify",
        A::UnexpectedMessage => "unexpected message",
        A::BadRecordMac => "bad record MAC",
        A::DecryptionFailed => "decryption failed",
        A::RecordOverflow => "record overflow",
        A::DecompressionFailure => "decompression failure",
        A::HandshakeFailure => "handshake failure",
        A::BadCertificate => "bad certificate",
        A::UnsupportedCertificate => "unsupported certificate",
        A::CertificateRevoked => "revoked certificate",
        A::CertificateExpired => "expired certificate",
        A::CertificateUnknown => "unknown certificate",
        A::IllegalParameter => "illegal parameter",
        A::UnknownCA => "unknown certificate authority",
        A::AccessDenied => "access denied",
        A::DecodeError => "error decoding message",
        A::DecryptError => "error decrypting message",
        A::ProtocolVersion => "protocol version not supported",
        A::InsufficientSecurity => "insufficient security level",
        A::InternalError => "internal error",
        A::UserCanceled => "user canceled",
        A::NoRenegotiation => "no renegotiation",
        A::MissingExtension => "missing extension",
        A::UnsupportedExtension => "unsupported extension",
        A::UnrecognisedName => "unrecognized name",
        A::CertificateRequired => "certificate required",
        A::NoApplicationProtocol => "no application protocol",
        other => return format!("alert({})", u8::from(other)),
    }
    .to_owned()
}
