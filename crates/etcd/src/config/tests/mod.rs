//! The configuration parser's tests: etcd's defaults, flags, `ETCD_*` variables, config files
//! and every error text, each checked against what etcd 3.5 prints; one file per topic, the
//! helpers they share here.

mod command_line;
mod defaults;
mod environment;
mod file;
mod renamed;
mod validate;

use url::Url;

use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn env(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(list: &[&str], vars: &[(&str, &str)]) -> (EtcdConfig, Parsed) {
    let parsed = match parse(&args(list), &env(vars)) {
        Ok(parsed) => parsed,
        Err(err) => panic!("parse {list:?} failed: {}", err.message),
    };
    match &parsed.command {
        Command::Run(config) => ((**config).clone(), parsed),
        other => panic!("expected Run, got {other:?}"),
    }
}

fn fail(list: &[&str], vars: &[(&str, &str)]) -> ConfigError {
    match parse(&args(list), &env(vars)) {
        Ok(parsed) => panic!("parse {list:?} succeeded: {parsed:?}"),
        Err(err) => err,
    }
}

fn strings(urls: &[Url]) -> Vec<String> {
    urls.iter().map(etcdrs_server::url_string).collect()
}

fn write_config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.yaml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    (dir, path)
}
