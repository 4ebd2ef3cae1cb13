//! The v2 store's JSON, which etcd 3.4 and 3.5 put in a raft snapshot's `data`.
//!
//! etcd's `v2store.Save` marshals the store with Go's `encoding/json`: an object whose
//! `"Root"` is the root node, each node `{"Path", "CreatedIndex", "ModifiedIndex",
//! "ExpireTime", "Value", "Children"}`, `Children` an object keyed by the child's last path
//! segment (or `null`). In an etcd 3.x cluster the v2 store holds, besides any v2 API keys
//! (under `/1`), the membership (`etcdserver/api/membership/store.go`):
//!
//! - `/0/members/<hex id>/raftAttributes`: JSON `{"peerURLs": [..], "isLearner": bool}`
//! - `/0/members/<hex id>/attributes`: JSON `{"name": .., "clientURLs": [..]}` once published
//! - `/0/removed_members/<hex id>`: an empty value for each removed member
//! - `/0/version`: the cluster version, e.g. `3.4.0`
//!
//! This module reads those; it does not model the rest of the v2 store.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::request::Member;

/// One node of the store.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Node {
    /// The full path, e.g. `/0/version`.
    #[serde(rename = "Path", default)]
    pub path: String,
    /// The value (empty for a directory).
    #[serde(rename = "Value", default)]
    pub value: String,
    /// The children of a directory, by last path segment.
    #[serde(rename = "Children", default)]
    pub children: Option<BTreeMap<String, Node>>,
}

impl Node {
    /// The child named `name`, if this is a directory holding it.
    pub fn child(&self, name: &str) -> Option<&Node> {
        self.children.as_ref()?.get(name)
    }

    /// The node at `path` below this one (`"0/version"`).
    pub fn get(&self, path: &str) -> Option<&Node> {
        path.split('/')
            .filter(|s| !s.is_empty())
            .try_fold(self, |node, name| node.child(name))
    }
}

#[derive(Deserialize)]
struct StoreJson {
    #[serde(rename = "Root")]
    root: Node,
}

/// The parsed v2 store.
#[derive(Clone, Debug)]
pub struct V2Store {
    /// The root node, `/`.
    pub root: Node,
}

#[derive(Deserialize)]
struct RaftAttributes {
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    is_learner: bool,
}

#[derive(Deserialize)]
struct Attributes {
    #[serde(default)]
    name: String,
    #[serde(rename = "clientURLs", default)]
    client_urls: Vec<String>,
}

impl V2Store {
    /// Parses the store's JSON (a raft snapshot's `data`).
    pub fn parse(data: &[u8]) -> serde_json::Result<V2Store> {
        let store: StoreJson = serde_json::from_slice(data)?;
        Ok(V2Store { root: store.root })
    }

    /// The value at `path` (`/0/version`), if it is there.
    pub fn value(&self, path: &str) -> Option<&str> {
        self.root.get(path).map(|node| node.value.as_str())
    }

    /// The cluster version (`/0/version`), if one was set.
    pub fn cluster_version(&self) -> Option<String> {
        self.value("/0/version")
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }

    /// The members under `/0/members`, by id. A member without published attributes has an
    /// empty name and no client URLs, as in etcd.
    pub fn members(&self) -> Result<Vec<Member>> {
        let mut members = Vec::new();
        let Some(children) = self
            .root
            .get("/0/members")
            .and_then(|n| n.children.as_ref())
        else {
            return Ok(members);
        };
        for (hex_id, node) in children {
            // etcd skips entries that are not a member's directory; so does this.
            let Ok(id) = u64::from_str_radix(hex_id, 16) else {
                continue;
            };
            let mut member = Member {
                id,
                ..Member::default()
            };
            if let Some(raft) = node.child("raftAttributes") {
                let raft: RaftAttributes =
                    serde_json::from_str(&raft.value).map_err(Error::MemberJson)?;
                member.peer_urls = raft.peer_urls;
                member.is_learner = raft.is_learner;
            }
            if let Some(attributes) = node.child("attributes") {
                let attributes: Attributes =
                    serde_json::from_str(&attributes.value).map_err(Error::MemberJson)?;
                member.name = attributes.name;
                member.client_urls = attributes.client_urls;
            }
            members.push(member);
        }
        members.sort_by_key(|member| member.id);
        Ok(members)
    }

    /// The ids under `/0/removed_members`.
    pub fn removed_member_ids(&self) -> Vec<u64> {
        let Some(children) = self
            .root
            .get("/0/removed_members")
            .and_then(|n| n.children.as_ref())
        else {
            return Vec::new();
        };
        children
            .keys()
            .filter_map(|hex_id| u64::from_str_radix(hex_id, 16).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_version() {
        let json = br#"{"Root":{"Path":"/","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{
            "0":{"Path":"/0","Value":"","Children":{
                "members":{"Path":"/0/members","Value":"","Children":{
                    "8e9e05c52164694d":{"Path":"/0/members/8e9e05c52164694d","Value":"","Children":{
                        "attributes":{"Path":"/0/members/8e9e05c52164694d/attributes","Value":"{\"name\":\"m1\",\"clientURLs\":[\"http://127.0.0.1:2379\"]}","Children":null},
                        "raftAttributes":{"Path":"/0/members/8e9e05c52164694d/raftAttributes","Value":"{\"peerURLs\":[\"http://127.0.0.1:2380\"]}","Children":null}}}}},
                "removed_members":{"Path":"/0/removed_members","Value":"","Children":{"a":{"Path":"/0/removed_members/a","Value":"","Children":null}}},
                "version":{"Path":"/0/version","Value":"3.4.0","Children":null}}},
            "1":{"Path":"/1","Value":"","Children":{}}}},"CurrentIndex":8,"CurrentVersion":2}"#;
        let store = V2Store::parse(json).expect("parses");
        assert_eq!(store.cluster_version().as_deref(), Some("3.4.0"));
        let members = store.members().expect("members");
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].id, 0x8e9e05c52164694d);
        assert_eq!(members[0].name, "m1");
        assert_eq!(members[0].peer_urls, ["http://127.0.0.1:2380"]);
        assert_eq!(store.removed_member_ids(), [10]);
    }
}
