//! The v2 node model over the v3 keyspace: v2 paths cleaned as Go's `path.Clean` does and
//! mapped to v3 keys (a file is `<prefix>/a/b`, a directory its marker `<prefix>/a/`),
//! hidden names, which changes a wait sees, and the v2 JSON of files and of directory trees
//! read back from a v3 range. Pure functions: no server, no I/O.

use etcdrs_proto::mvccpb::KeyValue;
use serde_json::{Map, Value, json};

use super::V3_PREFIX;

/// `path.Clean("/" + p)`.
pub(super) fn clean(raw: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in raw.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

pub(super) fn file_key(path: &str) -> Vec<u8> {
    format!("{V3_PREFIX}{path}").into_bytes()
}

pub(super) fn dir_key(path: &str) -> Vec<u8> {
    if path == "/" {
        format!("{V3_PREFIX}/").into_bytes()
    } else {
        format!("{V3_PREFIX}{path}/").into_bytes()
    }
}

/// The proper ancestors of `path` (`/a/b/c` → `/a`, `/a/b`).
pub(super) fn ancestors(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = path[at + 1..].find('/') {
        at += i + 1;
        out.push(path[..at].to_owned());
    }
    out
}

fn is_hidden(name: &str) -> bool {
    name.starts_with('_')
}

/// A file node's JSON.
pub(super) fn file_json(path: &str, kv: &KeyValue, with_value: bool) -> Value {
    let mut node = Map::new();
    node.insert("key".into(), json!(path));
    if with_value {
        node.insert(
            "value".into(),
            json!(String::from_utf8_lossy(&kv.value).into_owned()),
        );
    }
    node.insert("modifiedIndex".into(), json!(kv.mod_revision));
    node.insert("createdIndex".into(), json!(kv.create_revision));
    Value::Object(node)
}

/// A directory as read from the v3 keyspace: its marker and everything below.
#[derive(Default)]
pub(super) struct Tree {
    pub(super) file: Option<KeyValue>,
    pub(super) marker: Option<KeyValue>,
    pub(super) children: std::collections::BTreeMap<String, Tree>,
}

impl Tree {
    pub(super) fn insert(&mut self, rest: &str, kv: KeyValue) {
        match rest.split_once('/') {
            None => self.children.entry(rest.to_owned()).or_default().file = Some(kv),
            Some((name, "")) => self.children.entry(name.to_owned()).or_default().marker = Some(kv),
            Some((name, deeper)) => self
                .children
                .entry(name.to_owned())
                .or_default()
                .insert(deeper, kv),
        }
    }

    /// (created, modified) of a directory: its marker's, else its oldest descendant's.
    pub(super) fn indices(&self) -> (i64, i64) {
        if let Some(m) = &self.marker {
            return (m.create_revision, m.mod_revision);
        }
        let created = self
            .children
            .values()
            .map(|c| c.file.as_ref().map_or(c.indices().0, |f| f.create_revision))
            .min()
            .unwrap_or(0);
        (created, created)
    }

    pub(super) fn dir_json(&self, path: &str, depth: usize, recursive: bool) -> Value {
        let mut node = Map::new();
        if path != "/" {
            node.insert("key".into(), json!(path));
        }
        node.insert("dir".into(), json!(true));
        if depth == 0 || recursive {
            let nodes: Vec<Value> = self
                .children
                .iter()
                .filter(|(name, _)| !is_hidden(name))
                .map(|(name, child)| {
                    let child_path = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    match &child.file {
                        Some(kv) => file_json(&child_path, kv, true),
                        None => child.dir_json(&child_path, depth + 1, recursive),
                    }
                })
                .collect();
            if !nodes.is_empty() {
                node.insert("nodes".into(), Value::Array(nodes));
            }
        }
        if path != "/" {
            let (created, modified) = self.indices();
            node.insert("modifiedIndex".into(), json!(modified));
            node.insert("createdIndex".into(), json!(created));
        }
        Value::Object(node)
    }
}

/// Whether a change to `event_path` answers a wait on `path`: the node itself, or (recursive)
/// a file below it whose name below `path` has no hidden element. Directory markers never do.
pub(super) fn wanted(path: &str, event_path: &str, recursive: bool) -> bool {
    if event_path.ends_with('/') {
        return false;
    }
    if event_path == path {
        return true;
    }
    if !recursive {
        return false;
    }
    let below = if path == "/" {
        event_path.strip_prefix('/')
    } else {
        event_path
            .strip_prefix(path)
            .and_then(|rest| rest.strip_prefix('/'))
    };
    below.is_some_and(|rest| !rest.split('/').any(is_hidden))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_as_go_cleans_them() {
        assert_eq!(clean(""), "/");
        assert_eq!(clean("a//b/./c/../d/"), "/a/b/d");
        assert_eq!(ancestors("/a/b/c"), ["/a", "/a/b"]);
        assert!(ancestors("/a").is_empty());
    }

    #[test]
    fn waits_see_their_node_and_visible_descendants() {
        assert!(wanted("/d/t", "/d/t", false));
        assert!(!wanted("/d/t", "/d/t/m", false));
        assert!(wanted("/d/t", "/d/t/m", true));
        assert!(!wanted("/d/t", "/d/t/_config/size", true));
        assert!(!wanted("/d/t", "/d/t/x/", true));
        assert!(!wanted("/d/t", "/d/tt", true));
        assert!(wanted("/", "/a/b", true));
    }
}
