//! What both discovery protocols share: the registrations read from the service, ordered by
//! when they were created, the "is the cluster full" rule and the `--initial-cluster` string
//! made of the first `size` of them.

/// One member's registration: its key in the registry, its `name=peerURL[,...]` value and
/// the revision (v3) or index (v2) that created it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Key in the registry.
    pub key: String,
    /// `name=url` pairs, comma-separated.
    pub value: String,
    /// Creation revision or index: registrations are ranked by it.
    pub created: i64,
}

/// The registrations seen so far, in creation order.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    members: Vec<Registration>,
}

impl Registry {
    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether nobody registered yet.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The registrations, in creation order.
    pub fn members(&self) -> &[Registration] {
        &self.members
    }

    /// Whether `key` is registered.
    pub fn contains(&self, key: &str) -> bool {
        self.members.iter().any(|m| m.key == key)
    }

    /// Adds a registration, keeping creation order. A value that is not `name=url` or a key
    /// seen before is refused, with etcd's warning text.
    pub fn add(&mut self, registration: Registration) -> Result<(), &'static str> {
        if !registration.value.contains('=') {
            return Err("invalid peer info returned from discovery service");
        }
        if self.contains(&registration.key) {
            return Err("found duplicate peer from discovery service");
        }
        let at = self
            .members
            .partition_point(|m| m.created <= registration.created);
        self.members.insert(at, registration);
        Ok(())
    }

    /// Whether the first `size` registrations leave no room for `self_key` (etcd's
    /// `checkCluster`: a member not among the first `size` finds the cluster full).
    pub fn is_full_for(&self, self_key: &str, size: usize) -> bool {
        for (idx, member) in self.members.iter().enumerate() {
            if member.key == self_key {
                return false;
            }
            if idx + 1 >= size {
                return true;
            }
        }
        false
    }

    /// The `--initial-cluster` string of the first `size` registrations.
    pub fn initial_cluster(&self, size: usize) -> String {
        self.members
            .iter()
            .take(size)
            .map(|m| m.value.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Checks an `--initial-cluster` string as etcd's `types.NewURLsMap` does; returns the
/// number of distinct names.
pub fn check_urls_map(cluster: &str) -> Option<usize> {
    let mut names: Vec<&str> = Vec::new();
    for entry in cluster.split(',') {
        let (name, raw) = entry.split_once('=')?;
        let url = url::Url::parse(raw.trim()).ok()?;
        if !matches!(url.scheme(), "http" | "https" | "unix" | "unixs") {
            return None;
        }
        let after_scheme = raw.split_once("://").map_or("", |(_, rest)| rest);
        if url.host_str().is_none_or(str::is_empty) || after_scheme.contains('/') {
            return None;
        }
        if url.port().is_none() && !after_scheme.contains(':') {
            return None;
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(key: &str, created: i64) -> Registration {
        Registration {
            key: key.to_owned(),
            value: format!("{key}=http://127.0.0.1:2380"),
            created,
        }
    }

    #[test]
    fn ordered_by_creation_and_full_after_size() {
        let mut r = Registry::default();
        for (k, c) in [("c", 7), ("a", 3), ("b", 5)] {
            r.add(reg(k, c)).expect("add");
        }
        assert_eq!(
            r.members()
                .iter()
                .map(|m| m.key.as_str())
                .collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(r.add(reg("a", 9)).is_err());
        assert!(!r.is_full_for("b", 2));
        assert!(r.is_full_for("c", 2));
        assert!(r.is_full_for("z", 3));
        assert!(!r.is_full_for("z", 4));
        assert_eq!(
            r.initial_cluster(2),
            "a=http://127.0.0.1:2380,b=http://127.0.0.1:2380"
        );
    }

    #[test]
    fn urls_maps() {
        assert_eq!(
            check_urls_map("a=http://h:1,b=http://h:2,a=http://h:3"),
            Some(2)
        );
        assert_eq!(check_urls_map("a=http://h:1/path"), None);
        assert_eq!(check_urls_map("a=ftp://h:1"), None);
        assert_eq!(check_urls_map("nourl"), None);
    }
}
