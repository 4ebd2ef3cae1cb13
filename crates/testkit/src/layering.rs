//! The architecture test: the dependency rules of ARCHITECTURE.md ("Architecture Invariant"
//! lines), checked against the workspace's real dependency graph from `cargo metadata`.
//!
//! Only normal dependencies count (what a crate links into its users); dev- and
//! build-dependencies do not. Most rules forbid a crate anywhere in the transitive closure;
//! a few forbid only direct edges, where the crate is allowed to arrive through a dependency
//! that owns it (see each rule's reason). A violation names the path that breaks the rule.
//!
//! Cargo unifies features across the workspace, so the graph of `cargo metadata` shows what a
//! crate links once everything is built together. A few crates are lighter alone, through the
//! features they ask of their dependencies (`proto` without `grpc`, `discovery` without
//! `registry`); [`ALONE_RULES`] are checked on each crate's own resolution (`cargo tree -p`).
//!
//! The check is pure ([`violations`] over a [`Graph`]), so the tests below also prove, on a
//! synthetic graph, that a forbidden edge is caught. Beside them, checks of the server's own
//! modules: none glob-imports its parent, and their imports form no cycle ([`modules`]).

mod modules;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Whether a rule looks at the whole transitive closure or at direct dependencies only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Forbidden anywhere below the crate.
    Transitive,
    /// Forbidden as the crate's own dependency; allowed through another crate.
    Direct,
}

/// What a rule forbids.
#[derive(Clone, Copy, Debug)]
enum Forbid {
    /// Any crate of the workspace: the crate is a leaf of our graph.
    AnyWorkspaceCrate,
    /// These packages (workspace or external, by package name).
    Crates(&'static [&'static str]),
}

/// One invariant: `krate` must not depend on what `forbid` names.
#[derive(Clone, Copy, Debug)]
struct Rule {
    krate: &'static str,
    reach: Reach,
    forbid: Forbid,
    /// The invariant as ARCHITECTURE.md states it, for the failure message.
    why: &'static str,
}

/// Our crates that hold server state: storage, raft, the transport between members, and the
/// server that joins them.
const SERVER_SIDE: &[&str] = &[
    "etcdrs-server",
    "etcdrs-raftnode",
    "etcdrs-rafthttp",
    "etcdrs-mvcc",
    "etcdrs-wal",
    "etcdrs-backend",
    "raft",
    "redb",
];

/// The crates that appear only under `[dev-dependencies]`.
const DEV_ONLY: &[&str] = &["etcdrs-testkit", "etcdrs-fuzz"];

/// ARCHITECTURE.md's dependency rules.
const RULES: &[Rule] = &[
    Rule {
        krate: "etcdrs-proto",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "proto is a leaf: it depends on prost/tonic and nothing of ours",
    },
    Rule {
        krate: "etcdrs-hpack",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "hpack is the workspace's one HPACK codec, a leaf shared by serve and bench",
    },
    Rule {
        krate: "etcdrs-tls",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "tls depends on rustls only",
    },
    Rule {
        krate: "etcdrs-metrics",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "metrics (registration and buckets) depends on prometheus only",
    },
    Rule {
        krate: "etcdrs-fuzz",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "fuzz (the dev-only fuzzer) depends on nix only, so every crate can use it",
    },
    Rule {
        krate: "etcdrs-crc32c",
        reach: Reach::Transitive,
        forbid: Forbid::AnyWorkspaceCrate,
        why: "crc32c is the workspace's one CRC-32C, a leaf",
    },
    Rule {
        krate: "etcdrs-bolt",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-proto",
            "etcdrs-backend",
            "etcdrs-mvcc",
            "etcdrs-wal",
            "etcdrs-raftnode",
            "etcdrs-server",
            "etcdrs-etcddir",
        ]),
        why: "bolt knows nothing of etcd's buckets or encodings: it depends on crc32c only",
    },
    Rule {
        krate: "etcdrs-bolt",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&["redb"]),
        why: "bolt is a codec of bbolt files, not a storage engine: no redb",
    },
    Rule {
        krate: "etcdrs-backend",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-proto",
            "etcdrs-raftnode",
            "etcdrs-server",
            "etcdrs-serve",
            "raft",
            "tonic",
            "hyper",
        ]),
        why: "backend knows nothing of revisions, raft or the network",
    },
    Rule {
        krate: "etcdrs-wal",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-raftnode",
            "etcdrs-server",
            "etcdrs-serve",
            "raft",
            "tonic",
            "hyper",
        ]),
        why: "wal stores opaque entry bytes: no raft types, no network",
    },
    Rule {
        krate: "etcdrs-mvcc",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-raftnode",
            "etcdrs-wal",
            "etcdrs-server",
            "etcdrs-serve",
            "raft",
        ]),
        why: "mvcc knows nothing of raft or the server",
    },
    Rule {
        krate: "etcdrs-mvcc",
        reach: Reach::Direct,
        forbid: Forbid::Crates(&["tonic", "hyper", "h2", "axum"]),
        why: "mvcc has no network code (tonic arrives only under proto's generated types)",
    },
    Rule {
        krate: "etcdrs-raftnode",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-mvcc",
            "etcdrs-backend",
            "etcdrs-server",
            "etcdrs-serve",
            "etcdrs-proto",
        ]),
        why: "raftnode knows nothing of keys, MVCC or the server",
    },
    Rule {
        krate: "etcdrs-schema",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-server",
            "etcdrs-raftnode",
            "etcdrs-rafthttp",
            "etcdrs-wal",
            "etcdrs-serve",
            "etcdrs-client",
            "etcdrs-discovery",
            "etcdrs-grpcproxy",
        ]),
        why: "schema names buckets, keys and file layouts: it knows nothing of raft's progress, the transport or the server",
    },
    Rule {
        krate: "etcdrs-rafthttp",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-server",
            "etcdrs-mvcc",
            "etcdrs-backend",
            "etcdrs-serve",
            "etcdrs-proto",
            "etcdrs-etcddir",
            "etcdrs-schema",
            "etcdrs-bolt",
            "redb",
            "tonic",
        ]),
        why: "rafthttp knows raft messages and HTTP, nothing of keys, MVCC, storage formats or the server",
    },
    Rule {
        krate: "etcdrs-serve",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(SERVER_SIDE),
        why: "serve is shared by the server and the gRPC proxy: it links no server crate",
    },
    Rule {
        krate: "etcdrs-client",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(SERVER_SIDE),
        why: "client dials a cluster and owns no server logic: it never links server, raftnode, wal, mvcc or backend",
    },
    Rule {
        krate: "etcdrs-client",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&["etcdrs-serve", "etcdrs-grpcproxy", "etcdrs-discovery"]),
        why: "client is below its users: the proxy and discovery depend on it, never the reverse",
    },
    Rule {
        krate: "etcdrs-grpcproxy",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(SERVER_SIDE),
        why: "grpcproxy is a client of the cluster only: it never links server, mvcc, raftnode, wal or backend",
    },
    Rule {
        krate: "etcdrs-gateway",
        reach: Reach::Direct,
        forbid: Forbid::Crates(&["etcdrs-proto", "tonic", "prost", "h2"]),
        why: "gateway is L4: it depends on no protocol crate",
    },
    Rule {
        krate: "etcdrs-gateway",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-server",
            "etcdrs-raftnode",
            "etcdrs-mvcc",
            "etcdrs-wal",
            "etcdrs-backend",
            "etcdrs-serve",
            "etcdrs-grpcproxy",
        ]),
        why: "gateway relays bytes: it links neither the server nor the gRPC proxy",
    },
    Rule {
        krate: "etcdrs-discovery",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(SERVER_SIDE),
        why: "discovery knows nothing of raft or the store",
    },
    Rule {
        krate: "etcdrs-bench",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(SERVER_SIDE),
        why: "bench is a client only: it never depends on our server crates",
    },
    Rule {
        krate: "etcdrs-sim",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-grpcproxy",
            "etcdrs-gateway",
            "etcdrs-discovery",
            "etcdrs-client",
            "etcdrs",
        ]),
        why: "sim drives the member's own raft node and applier in one thread: it links the server's core, never a proxy, a client or the binary",
    },
    Rule {
        krate: "etcdrs-etcddir",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "etcdrs-wal",
            "etcdrs-backend",
            "etcdrs-mvcc",
            "etcdrs-raftnode",
            "etcdrs-server",
            "etcdrs-serve",
        ]),
        why: "etcddir reads etcd's files only: it knows nothing of etcd-rs's own storage",
    },
];

/// Network crates: what a crate that only stores or relays bytes must not link.
const NETWORK: &[&str] = &["tonic", "tonic-prost", "hyper", "h2", "axum", "tower"];

/// What a storage crate must not link: the network crates, and sockets at all (`mio`, which
/// tokio brings with its `net` feature; the store uses tokio's channels only).
const NO_SOCKETS: &[&str] = &[
    "tonic",
    "tonic-prost",
    "hyper",
    "h2",
    "axum",
    "tower",
    "mio",
];

/// Rules checked on a crate's own resolution, with the features it asks of its dependencies
/// (the workspace's unified graph shows more: tonic in proto as the server wants it).
const ALONE_RULES: &[Rule] = &[
    Rule {
        krate: "etcdrs-schema",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(NO_SOCKETS),
        why: "schema links no network crate: proto's messages without `grpc`, mvcc and backend",
    },
    Rule {
        krate: "etcdrs-mvcc",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(NO_SOCKETS),
        why: "mvcc has no network code: proto's messages without `grpc`, tokio's channels only",
    },
    Rule {
        krate: "etcdrs-etcddir",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(NETWORK),
        why: "etcddir reads files: proto's messages without `grpc`",
    },
    Rule {
        krate: "etcdrs-gateway",
        reach: Reach::Transitive,
        forbid: Forbid::Crates(&[
            "tonic",
            "tonic-prost",
            "prost",
            "etcdrs-proto",
            "etcdrs-client",
        ]),
        why: "gateway is L4 and parses no gRPC: discovery without `registry` (SRV lookups only)",
    },
];

/// The dependency graph of a workspace: every package's direct normal dependencies, by
/// package name.
#[derive(Debug, Default)]
struct Graph {
    /// The workspace's own packages.
    members: BTreeSet<String>,
    /// Each package's direct normal dependencies.
    deps: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// Reads the graph from `cargo metadata --format-version 1` output: the resolved graph
    /// (`resolve.nodes`), keeping the edges whose kinds include a normal one (`kind: null`).
    fn from_metadata(metadata: &serde_json::Value) -> Graph {
        let name_of: BTreeMap<&str, &str> = metadata["packages"]
            .as_array()
            .expect("metadata lists packages")
            .iter()
            .map(|p| {
                let id = p["id"].as_str().expect("a package has an id");
                (id, p["name"].as_str().expect("a package has a name"))
            })
            .collect();
        let name = |id: &serde_json::Value| {
            let id = id.as_str().expect("package ids are strings");
            name_of[id].to_owned()
        };
        let mut graph = Graph {
            members: metadata["workspace_members"]
                .as_array()
                .expect("metadata lists the workspace members")
                .iter()
                .map(name)
                .collect(),
            ..Graph::default()
        };
        let nodes = metadata["resolve"]["nodes"]
            .as_array()
            .expect("metadata has a resolved graph");
        for node in nodes {
            let deps = graph.deps.entry(name(&node["id"])).or_default();
            for dep in node["deps"].as_array().expect("a node lists its deps") {
                let normal = dep["dep_kinds"]
                    .as_array()
                    .expect("a dep lists its kinds")
                    .iter()
                    .any(|kind| kind["kind"].is_null());
                if normal {
                    deps.insert(name(&dep["pkg"]));
                }
            }
        }
        graph
    }

    /// A graph from `(crate, [direct normal deps])`; the crates named first are the members.
    fn from_edges(edges: &[(&str, &[&str])]) -> Graph {
        let mut graph = Graph::default();
        for (krate, deps) in edges {
            graph.members.insert((*krate).to_owned());
            graph
                .deps
                .entry((*krate).to_owned())
                .or_default()
                .extend(deps.iter().map(|d| (*d).to_owned()));
        }
        graph
    }

    /// The graph of one crate resolved alone, from `cargo tree -e normal --prefix depth -f {p}`
    /// output: each line is a depth, the package's name and its version; a line's parent is
    /// the nearest line above it one level up. The crate at depth 0 is the one member.
    fn from_tree(text: &str) -> Graph {
        let mut graph = Graph::default();
        let mut stack: Vec<String> = Vec::new();
        for line in text.lines() {
            let digits = line.chars().take_while(char::is_ascii_digit).count();
            let Ok(depth) = line[..digits].parse::<usize>() else {
                continue;
            };
            let Some(name) = line[digits..].split_whitespace().next() else {
                continue;
            };
            stack.truncate(depth);
            match stack.last() {
                Some(parent) => {
                    graph
                        .deps
                        .entry(parent.clone())
                        .or_default()
                        .insert(name.to_owned());
                }
                None => {
                    graph.members.insert(name.to_owned());
                }
            }
            graph.deps.entry(name.to_owned()).or_default();
            stack.push(name.to_owned());
        }
        graph
    }

    /// Every package reachable from `from` with the path that reaches it first (breadth
    /// first, so the shortest), `from` itself excluded.
    fn reachable(&self, from: &str) -> BTreeMap<String, Vec<String>> {
        let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut queue = VecDeque::from([vec![from.to_owned()]]);
        while let Some(path) = queue.pop_front() {
            let last = path.last().expect("paths are never empty");
            for dep in self.deps.get(last).into_iter().flatten() {
                if dep == from || paths.contains_key(dep) {
                    continue;
                }
                let mut longer = path.clone();
                longer.push(dep.clone());
                paths.insert(dep.clone(), longer.clone());
                queue.push_back(longer);
            }
        }
        paths
    }
}

/// What breaks `rules` (and the dev-only rule) in `graph`, one line per violation.
fn violations(graph: &Graph, rules: &[Rule]) -> Vec<String> {
    let mut found = Vec::new();
    for rule in rules {
        if !graph.members.contains(rule.krate) {
            found.push(format!(
                "{}: no such workspace crate (renamed? update the rule)",
                rule.krate
            ));
            continue;
        }
        let paths: BTreeMap<String, Vec<String>> = match rule.reach {
            Reach::Transitive => graph.reachable(rule.krate),
            Reach::Direct => graph.deps[rule.krate]
                .iter()
                .map(|dep| (dep.clone(), vec![rule.krate.to_owned(), dep.clone()]))
                .collect(),
        };
        for (dep, path) in paths {
            let forbidden = match rule.forbid {
                Forbid::AnyWorkspaceCrate => graph.members.contains(&dep),
                Forbid::Crates(names) => names.contains(&dep.as_str()),
            };
            if forbidden {
                found.push(format!("{}: {}", path.join(" -> "), rule.why));
            }
        }
    }
    for member in &graph.members {
        for (dep, path) in graph.reachable(member) {
            if DEV_ONLY.contains(&dep.as_str()) {
                found.push(format!(
                    "{}: {dep} appears only under [dev-dependencies]",
                    path.join(" -> ")
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace's graph, as `cargo metadata` resolves it.
    fn workspace() -> Graph {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
        let output = std::process::Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--manifest-path",
                manifest,
            ])
            .output()
            .expect("cargo metadata runs");
        assert!(
            output.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
        Graph::from_metadata(&metadata)
    }

    #[test]
    fn the_workspace_keeps_architecture_md_dependency_rules() {
        let graph = workspace();
        // The graph is real: the server sees both raft and the store.
        let server = graph.reachable("etcdrs-server");
        assert!(server.contains_key("etcdrs-raftnode") && server.contains_key("etcdrs-mvcc"));
        let found = violations(&graph, RULES);
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    /// `crate`'s own resolution, as `cargo tree -p` prints it.
    fn alone(krate: &str) -> Graph {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
        let output = std::process::Command::new(cargo)
            .args([
                "tree",
                "--manifest-path",
                manifest,
                "-p",
                krate,
                "-e",
                "normal",
                "--prefix",
                "depth",
                "-f",
                "{p}",
            ])
            .output()
            .expect("cargo tree runs");
        assert!(
            output.status.success(),
            "cargo tree failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Graph::from_tree(&String::from_utf8_lossy(&output.stdout))
    }

    #[test]
    fn crates_resolved_alone_keep_their_rules() {
        let mut found = Vec::new();
        for rule in ALONE_RULES {
            let graph = alone(rule.krate);
            // The graph is real: each of these crates links something of ours or of tokio.
            assert!(
                graph.reachable(rule.krate).len() > 3,
                "{}: {:?}",
                rule.krate,
                graph.deps
            );
            found.extend(violations(&graph, std::slice::from_ref(rule)));
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    #[test]
    fn a_network_crate_below_schema_alone_is_caught() {
        // `cargo tree -p etcdrs-schema` had schema asked proto with `grpc`.
        let tree = "0etcdrs-schema v0.1.0 (/w/crates/schema)\n\
                    1etcdrs-mvcc v0.1.0 (/w/crates/mvcc)\n\
                    2etcdrs-backend v0.1.0 (/w/crates/backend)\n\
                    3redb v4.6.0\n\
                    2etcdrs-proto v0.1.0 (/w/crates/proto)\n\
                    3prost v0.14.6\n\
                    1etcdrs-proto v0.1.0 (/w/crates/proto) (*)\n\
                    1etcdrs-bolt v0.1.0 (/w/crates/bolt)\n";
        let rule = |name| {
            ALONE_RULES
                .iter()
                .copied()
                .find(|r| r.krate == name)
                .expect("a rule")
        };
        let clean = Graph::from_tree(tree);
        assert_eq!(
            violations(&clean, &[rule("etcdrs-schema")]),
            Vec::<String>::new()
        );
        let with_tonic = tree.replace(
            "3prost v0.14.6\n",
            "3prost v0.14.6\n3tonic v0.14.9\n4hyper v1.12.0\n",
        );
        let found = violations(&Graph::from_tree(&with_tonic), &[rule("etcdrs-schema")]);
        let why =
            "schema links no network crate: proto's messages without `grpc`, mvcc and backend";
        assert_eq!(
            found,
            [
                format!("etcdrs-schema -> etcdrs-proto -> tonic -> hyper: {why}"),
                format!("etcdrs-schema -> etcdrs-proto -> tonic: {why}"),
            ]
        );
        // The gateway reaching the client through discovery's `registry` feature.
        let gateway = "0etcdrs-gateway v0.1.0\n1etcdrs-discovery v0.1.0\n2etcdrs-client v0.1.0\n3tonic v0.14.9\n";
        let found = violations(&Graph::from_tree(gateway), &[rule("etcdrs-gateway")]);
        assert!(
            found.iter().any(|f| f.starts_with(
                "etcdrs-gateway -> etcdrs-discovery -> etcdrs-client -> tonic: gateway is L4"
            )),
            "{}",
            found.join("\n")
        );
    }

    #[test]
    fn forbidden_edges_are_caught_with_their_path() {
        let graph = Graph::from_edges(&[
            ("etcdrs-proto", &["tonic", "etcdrs-tls"]),
            ("etcdrs-tls", &["rustls"]),
            ("etcdrs-serve", &["etcdrs-proto", "etcdrs-server"]),
            ("etcdrs-server", &["etcdrs-raftnode", "etcdrs-proto"]),
            ("etcdrs-raftnode", &["raft"]),
            (
                "etcdrs-grpcproxy",
                &["etcdrs-serve", "etcdrs-proto", "etcdrs-client"],
            ),
            ("etcdrs-gateway", &["etcdrs-discovery", "tonic"]),
            ("etcdrs-discovery", &["etcdrs-proto", "etcdrs-client"]),
            ("etcdrs-client", &["tonic", "etcdrs-mvcc"]),
            ("etcdrs-mvcc", &["etcdrs-backend"]),
            ("etcdrs-backend", &["redb"]),
            ("etcdrs-bench", &["etcdrs-proto", "etcdrs-testkit"]),
            ("etcdrs-testkit", &["tonic"]),
            (
                "etcdrs-rafthttp",
                &["etcdrs-raftnode", "etcdrs-mvcc", "hyper", "etcdrs-schema"],
            ),
            ("etcdrs-schema", &["etcdrs-mvcc", "etcdrs-raftnode"]),
        ]);
        let rules: Vec<Rule> = RULES
            .iter()
            .copied()
            .filter(|r| graph.members.contains(r.krate))
            .collect();
        let found = violations(&graph, &rules);
        let expected = [
            // proto -> tls: proto is a leaf.
            "etcdrs-proto -> etcdrs-tls: proto is a leaf",
            // serve -> server, and the server's raft below it.
            "etcdrs-serve -> etcdrs-server: serve is shared",
            "etcdrs-serve -> etcdrs-server -> etcdrs-raftnode -> raft: serve is shared",
            // The proxy reaches the server through serve.
            "etcdrs-grpcproxy -> etcdrs-serve -> etcdrs-server: grpcproxy is a client",
            "etcdrs-grpcproxy -> etcdrs-serve -> etcdrs-server -> etcdrs-raftnode: grpcproxy",
            // The client links the store, and the proxy and discovery reach it through the
            // client.
            "etcdrs-client -> etcdrs-mvcc: client dials a cluster",
            "etcdrs-client -> etcdrs-mvcc -> etcdrs-backend -> redb: client dials a cluster",
            "etcdrs-grpcproxy -> etcdrs-client -> etcdrs-mvcc: grpcproxy is a client",
            "etcdrs-discovery -> etcdrs-client -> etcdrs-mvcc: discovery knows nothing",
            "etcdrs-gateway -> etcdrs-discovery -> etcdrs-client -> etcdrs-mvcc: gateway relays",
            // tonic directly in the gateway (through discovery's proto it is allowed).
            "etcdrs-gateway -> tonic: gateway is L4",
            // The peer transport reaches the store, and its backend below it.
            "etcdrs-rafthttp -> etcdrs-mvcc: rafthttp knows raft messages and HTTP",
            "etcdrs-rafthttp -> etcdrs-mvcc -> etcdrs-backend: rafthttp knows",
            // The storage layout reaches raft's driver; the transport reaches the layout.
            "etcdrs-schema -> etcdrs-raftnode: schema names buckets",
            "etcdrs-rafthttp -> etcdrs-schema: rafthttp knows",
            // bench links testkit.
            "etcdrs-bench -> etcdrs-testkit: etcdrs-testkit appears only under [dev-dependencies]",
        ];
        for line in expected {
            assert!(
                found.iter().any(|f| f.starts_with(line)),
                "{line:?} missing from:\n{}",
                found.join("\n")
            );
        }
        // Protocol crates below discovery are allowed to the gateway.
        assert!(
            !found
                .iter()
                .any(|f| f.starts_with("etcdrs-gateway -> etcdrs-discovery -> etcdrs-proto")),
            "{}",
            found.join("\n")
        );

        // The same graph without the forbidden edges passes.
        let clean = Graph::from_edges(&[
            ("etcdrs-proto", &["tonic"]),
            ("etcdrs-tls", &["rustls"]),
            ("etcdrs-serve", &["etcdrs-proto"]),
            (
                "etcdrs-server",
                &["etcdrs-raftnode", "etcdrs-proto", "etcdrs-serve"],
            ),
            ("etcdrs-raftnode", &["raft"]),
            (
                "etcdrs-grpcproxy",
                &["etcdrs-serve", "etcdrs-proto", "etcdrs-client"],
            ),
            ("etcdrs-gateway", &["etcdrs-discovery"]),
            ("etcdrs-discovery", &["etcdrs-proto", "etcdrs-client"]),
            ("etcdrs-client", &["tonic", "rustls"]),
            ("etcdrs-mvcc", &["etcdrs-backend"]),
            ("etcdrs-backend", &["redb"]),
            ("etcdrs-bench", &["etcdrs-proto"]),
            ("etcdrs-testkit", &["tonic"]),
            ("etcdrs-rafthttp", &["etcdrs-raftnode", "hyper"]),
            ("etcdrs-schema", &["etcdrs-mvcc", "etcdrs-bolt"]),
            ("etcdrs-bolt", &["etcdrs-crc32c"]),
        ]);
        assert_eq!(violations(&clean, &rules), Vec::<String>::new());
    }

    /// The Rust files under `dir`, recursively.
    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The server's modules name what they import from their parents (issue 39): a glob
    /// import of the parent hides which module depends on what, and so the cycles between
    /// them. Test modules may still glob their module under test.
    #[test]
    fn server_modules_do_not_glob_import_their_parents() {
        let src = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../server/src"));
        let mut files = Vec::new();
        rust_files(src, &mut files);
        assert!(
            files.len() > 20,
            "the server's sources are at {}",
            src.display()
        );
        let mut found = Vec::new();
        for file in files {
            if file.file_name().is_some_and(|name| name == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("a source file");
            let mut in_tests = false;
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("mod tests") {
                    in_tests = true;
                }
                if line.trim() == "use super::*;" && !in_tests {
                    found.push(format!("{}:{}", file.display(), n + 1));
                }
            }
        }
        assert!(
            found.is_empty(),
            "glob imports of a parent:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn a_rule_for_a_missing_crate_fails() {
        let graph = Graph::from_edges(&[("etcdrs-proto", &["tonic"])]);
        let found = violations(&graph, RULES);
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("etcdrs-grpcproxy: no such workspace crate")),
            "{}",
            found.join("\n")
        );
    }
}
