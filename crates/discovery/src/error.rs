//! The crate's one error type: the discovery protocols' failures (v2 and v3), with etcd's
//! texts, since the bootstrap step logs them as etcd does and users grep for them; and DNS SRV
//! lookup failures.

/// Why bootstrapping through a discovery service failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The token has no `_config/size` key.
    #[error("discovery: size key not found")]
    SizeNotFound,
    /// `_config/size` is not a positive integer.
    #[error("discovery: size key is bad")]
    BadSizeKey,
    /// The first `size` registrations are other members.
    #[error("discovery: cluster is full")]
    FullCluster,
    /// v3: a registered member's value is not a valid `name=url` list.
    #[error("discovery: invalid peer URL")]
    InvalidPeerUrl,
    /// v2: the discovery URL, or a registered member's value, is not valid.
    #[error("discovery: invalid URL")]
    InvalidUrl,
    /// v2: this member id is registered already (the token was used by an earlier attempt).
    #[error("discovery: found duplicate id")]
    DuplicateId,
    /// v2: two registered members have the same name.
    #[error("discovery: found duplicate name")]
    DuplicateName,
    /// v2: the discovery URL does not answer with etcd's v2 keys JSON.
    #[error("discovery: bad discovery endpoint")]
    BadDiscoveryEndpoint,
    /// A setting cannot be used (bad endpoint, unreadable TLS file, bad proxy URL).
    #[error("{0}")]
    Config(String),
    /// The discovery service refused a request in a way retrying cannot fix.
    #[error("{0}")]
    Service(String),

    /// The resolver could not be built (e.g. an unreadable `/etc/resolv.conf`).
    #[error("cannot configure the DNS resolver: {0}")]
    SystemConfig(String),
    /// The SRV query failed (no such name, no records, or no answer).
    #[error("lookup {name} on SRV: {reason}")]
    Srv {
        /// The full name queried, e.g. `_etcd-client._tcp.example.com.`.
        name: String,
        /// The resolver's explanation.
        reason: String,
    },
    /// A host name has no usable A/AAAA record.
    #[error("lookup {host}: {reason}")]
    Host {
        /// The host name.
        host: String,
        /// The resolver's explanation.
        reason: String,
    },
}

/// Result of this crate's discovery operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
