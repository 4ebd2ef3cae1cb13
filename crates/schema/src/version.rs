//! Version strings this server reports: the etcd release it is compatible with (what
//! `etcdctl endpoint status`, `/version` and `--version` show) and the cluster version; how
//! versions compare (etcd's semver on major.minor.patch) and the record of a downgrade.

/// The etcd server version etcd-rs reports. Clients gate features on it, so it names the etcd
/// release whose API etcd-rs implements.
pub const SERVER_VERSION: &str = "3.5.17";

/// The cluster version (major.minor.0) a cluster of etcd-rs members alone runs at, as etcd
/// publishes it once all members agree.
pub const CLUSTER_VERSION: &str = "3.5.0";

/// The lowest cluster version (etcd's `MinClusterVersion`): what a leader sets when it cannot
/// learn every member's version before it must set one.
pub const MIN_CLUSTER_VERSION: &str = "3.0.0";

/// etcd-rs' own version (the crate version), shown beside etcd's in `--version`.
pub const ETCDRS_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A parsed version: major, minor and patch (pre-release and build suffixes dropped, as etcd
/// compares them only on these three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch.
    pub patch: u64,
}

impl Version {
    /// `major.minor.patch`, with an optional `-pre` or `+build` suffix; `None` otherwise.
    pub fn parse(text: &str) -> Option<Version> {
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Version {
            major,
            minor,
            patch,
        })
    }

    /// Only the major and minor (the patch zero), as etcd keeps cluster versions.
    pub fn cluster(self) -> Version {
        Version { patch: 0, ..self }
    }

    /// The version one minor below (etcd's `AllowedDowngradeVersion`), `None` below x.1.
    pub fn one_minor_below(self) -> Option<Version> {
        Some(Version {
            major: self.major,
            minor: self.minor.checked_sub(1)?,
            patch: 0,
        })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// This build's server version, parsed.
pub fn local() -> Version {
    Version::parse(SERVER_VERSION).unwrap_or(Version {
        major: 3,
        minor: 5,
        patch: 0,
    })
}

/// `major.minor` of a version string (`3.4.0` → `3.4`), the whole string when it has no
/// second dot.
pub fn major_minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((at, _)) => &version[..at],
        None => version,
    }
}

/// etcd's `DowngradeInfo` as JSON (`{"target-version":"3.4.0","enabled":true}`), the form in
/// which a downgrade is recorded in the backend and in etcd-rs' v2 entry.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
pub struct DowngradeInfo {
    /// The target cluster version; empty when disabled.
    #[serde(rename = "target-version", default)]
    pub target_version: String,
    /// Whether a downgrade is under way.
    #[serde(default)]
    pub enabled: bool,
    /// etcd-rs's own mark, which etcd's JSON decoder passes over: etcd 3.5 members applied
    /// this downgrade (it came as `downgrade_info_set` below cluster version 3.6), so the
    /// cluster version must stay (`EtcdServer::downgrade_known_to_etcd35`).
    /// Written only in etcd-rs's own store ([`DowngradeInfo::encode_stored`]), always there,
    /// so that a stored record without it is etcd's own; never on the wire.
    #[serde(rename = "etcdrs-known-to-etcd35", default, skip_serializing)]
    pub known_to_etcd35: bool,
}

impl DowngradeInfo {
    /// The record of `target` (enabled) or of no downgrade (`None`).
    pub fn new(target: Option<&str>) -> DowngradeInfo {
        DowngradeInfo {
            target_version: target.unwrap_or_default().to_owned(),
            enabled: target.is_some(),
            known_to_etcd35: false,
        }
    }

    /// Its JSON, etcd's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Its JSON as etcd-rs stores it: etcd's, with etcd-rs's mark after it (which etcd's
    /// decoder passes over, so the record also goes into etcd's database as it is).
    pub fn encode_stored(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "etcdrs-known-to-etcd35".to_owned(),
                self.known_to_etcd35.into(),
            );
        }
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// The target of an enabled downgrade in `json`; `None` when disabled or unreadable.
    pub fn decode(json: &[u8]) -> Option<String> {
        let info: DowngradeInfo = serde_json::from_slice(json).ok()?;
        (info.enabled && !info.target_version.is_empty()).then_some(info.target_version)
    }

    /// etcd's own record `json` (from an etcd member's database) as etcd-rs keeps it: an
    /// enabled downgrade there was applied by etcd's members, who know of it, when the
    /// cluster version is below 3.6. A record etcd-rs wrote is returned as it is.
    pub fn from_etcd(json: &[u8], cluster_version: Option<&str>) -> Vec<u8> {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
            return json.to_vec();
        };
        if value.get("etcdrs-known-to-etcd35").is_some() {
            return json.to_vec();
        }
        let Ok(mut info) = serde_json::from_value::<DowngradeInfo>(value) else {
            return json.to_vec();
        };
        info.known_to_etcd35 = info.enabled
            && cluster_version
                .and_then(Version::parse)
                .is_none_or(|v| (v.major, v.minor) < (3, 6));
        info.encode_stored()
    }

    /// Whether `json` records an enabled downgrade that etcd 3.5 members know of.
    pub fn decode_known_to_etcd35(json: &[u8]) -> bool {
        serde_json::from_slice::<DowngradeInfo>(json)
            .is_ok_and(|info| info.enabled && info.known_to_etcd35)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_etcds_semver() {
        let v = |t| Version::parse(t).expect("parses");
        assert!(v("3.4.23") < v("3.5.0"));
        assert!(v("3.5.17") > v("3.5.0"));
        assert_eq!(v("3.5.17").cluster(), v("3.5.0"));
        assert_eq!(v("3.6.0-alpha.0"), v("3.6.0"));
        assert_eq!(v("3.5.0").one_minor_below(), Some(v("3.4.0")));
        assert_eq!(Version::parse("3.5"), None);
        assert_eq!(Version::parse("x.y.z"), None);
        assert_eq!(major_minor("3.4.0"), "3.4");
        assert_eq!(major_minor("3"), "3");
        assert_eq!(v("3.4.0").to_string(), "3.4.0");
    }

    #[test]
    fn downgrade_records_read_back() {
        let on = DowngradeInfo::new(Some("3.4.0")).encode();
        assert_eq!(on, br#"{"target-version":"3.4.0","enabled":true}"#);
        assert_eq!(DowngradeInfo::decode(&on).as_deref(), Some("3.4.0"));
        assert_eq!(
            DowngradeInfo::decode(&DowngradeInfo::new(None).encode()),
            None
        );
        assert_eq!(DowngradeInfo::decode(b"{"), None);
        // etcd-rs's mark: in its store only, and etcd's record from its database gets it.
        let mut known = DowngradeInfo::new(Some("3.4.0"));
        known.known_to_etcd35 = true;
        assert_eq!(known.encode(), on);
        let stored = known.encode_stored();
        assert!(DowngradeInfo::decode_known_to_etcd35(&stored));
        assert_eq!(DowngradeInfo::decode(&stored).as_deref(), Some("3.4.0"));
        let ours = DowngradeInfo::new(Some("3.4.0")).encode_stored();
        assert!(!DowngradeInfo::decode_known_to_etcd35(&ours));
        assert_eq!(DowngradeInfo::from_etcd(&ours, Some("3.5.0")), ours);
        let from_35 = DowngradeInfo::from_etcd(&on, Some("3.5.0"));
        assert!(DowngradeInfo::decode_known_to_etcd35(&from_35));
        let from_36 = DowngradeInfo::from_etcd(&on, Some("3.6.0"));
        assert!(!DowngradeInfo::decode_known_to_etcd35(&from_36));
    }
}
