//! `etcd --help` text. Laid out like etcd's (a usage block on stderr, then flag sections
//! of `--flag 'default'` plus a description on stdout) so tools that scrape flag names and
//! defaults keep working; the wording is etcd-rs's own. Generated from the flag table.

use std::fmt::Write as _;

use super::flags::{FLAGS, Group};

/// The usage block etcd prints on stderr for `-h` and after a flag error.
pub(crate) fn usage_text() -> String {
    "Usage:

  etcd [flags]
    Start an etcd-rs member.

  etcd --version
    Print the version and exit.

  etcd -h | --help
    Print this help and exit.

  etcd --config-file
    Read the whole configuration from a YAML file; command-line flags and ETCD_* environment variables are then ignored.

  etcd gateway
    Run the stateless TCP gateway that forwards client connections to the cluster.

  etcd grpc-proxy
    Run the stateless gRPC (L7) proxy for the v3 API.
"
    .to_string()
}

const SECTIONS: &[(Group, &str)] = &[
    (Group::Member, "Member"),
    (Group::Clustering, "Clustering"),
    (Group::V3Discovery, "v3 discovery (etcd 3.6)"),
    (Group::Security, "Security"),
    (Group::Auth, "Auth"),
    (Group::Profiling, "Profiling and monitoring"),
    (Group::Logging, "Logging"),
    (Group::Tracing, "Distributed tracing (experimental)"),
    (Group::V2Proxy, "v2 proxy (accepted for compatibility)"),
    (Group::Experimental, "Experimental"),
    (Group::Unsafe, "Unsafe"),
];

/// The flag listing etcd prints on stdout for `-h` / `--help`.
pub(crate) fn flags_text() -> String {
    let mut out = String::from("\n");
    for (group, title) in SECTIONS {
        let _ = writeln!(out, "{title}:");
        for def in FLAGS.iter().filter(|def| def.group == *group) {
            let default = if def.name == "data-dir" {
                "${name}.etcd"
            } else {
                def.default
            };
            let _ = writeln!(out, "  --{} '{}'", def.name, default);
            let _ = writeln!(out, "    {}", def.help);
            if let Some((_, why)) = super::effect::NO_EFFECT
                .iter()
                .find(|(n, _)| *n == def.name)
            {
                let _ = writeln!(
                    out,
                    "    Accepted for compatibility; no effect in etcd-rs: {why}."
                );
            }
        }
        out.push('\n');
    }
    out.push_str(
        "Every flag can also be set through an environment variable named ETCD_ plus the flag name in\n\
         upper case with dashes turned into underscores (--data-dir is ETCD_DATA_DIR). Setting both a\n\
         flag and its variable is an error.\n\
         \n\
         Flags in the Unsafe section can break the guarantees the consensus protocol gives; use them\n\
         only to recover a cluster.\n",
    );
    out
}
