//! Generates the prost messages and (with the `grpc` feature) tonic clients/servers for etcd's API, and the serde
//! (grpc-gateway JSON) impls of etcdserverpb, mvccpb, authpb, v3lockpb and v3electionpb.
//!
//! The `.proto` files are parsed by `protox`, a protobuf compiler written in Rust, so building
//! needs nothing but a Rust toolchain: no system `protoc`, and `PROTOC` is not read.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
];

/// The packages that etcd's JSON gateway exposes, and so get serde impls. etcd's gateway
/// also serves the lock and election services (`v3lock/v3lockpb/gw`, `v3election/v3electionpb/gw`).
const JSON_PACKAGES: &[&str] = &[
    "etcdserverpb",
    "mvccpb",
    "authpb",
    "v3lockpb",
    "v3electionpb",
];

/// The one bytes field generated as `bytes::Bytes` rather than `Vec<u8>`.
const PUT_VALUE: &str = ".etcdserverpb.PutRequest.value";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // prost-build does not emit these itself.
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // As `protoc --include_imports --include_source_info`: the comments become doc comments.
    let file_set = protox::compile(PROTOS, ["proto"])?;
    let descriptors = prost::Message::encode_to_vec(&file_set);
    // Kept for the JSON gateway, which reads requests by their descriptors (jsonpb's rules).
    std::fs::write(out_dir.join("descriptors.bin"), &descriptors)?;
    let mut config = tonic_prost_build::Config::new();
    // `prost::Name`: the JSON gateway finds a request's descriptor by its full name.
    config.enable_type_names();
    // A put's value as `bytes::Bytes`: decoded from a request's own buffer it is not copied,
    // and a large value is copied once on its way into the raft entry instead of twice.
    config.bytes([PUT_VALUE]);
    // Without the `grpc` feature, the messages alone: no service code, nothing of tonic.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(grpc)
        .build_client(grpc)
        .compile_fds_with_config(file_set, config)?;

    // grpc-gateway marshals with jsonpb `OrigName: true`: the proto's field names,
    // 64-bit integers as strings, bytes as base64 and zero values omitted. pbjson does the same
    // once told to keep the proto names.
    let prefixes: Vec<String> = JSON_PACKAGES.iter().map(|p| format!(".{p}")).collect();
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        // grpc-gateway's decoder skips fields it does not know.
        .ignore_unknown_fields()
        .build(&prefixes)?;

    // `tonic::include_proto!` in lib.rs includes only `<package>.rs`; the serde impls must live
    // in the same module as the messages, so each of those files includes its companion.
    for package in JSON_PACKAGES {
        let messages = out_dir.join(format!("{package}.rs"));
        let mut text = std::fs::read_to_string(&messages)?;
        text.push_str(&format!(
            "\ninclude!(concat!(env!(\"OUT_DIR\"), \"/{package}.serde.rs\"));\n"
        ));
        std::fs::write(&messages, text)?;
    }

    if !grpc {
        return Ok(());
    }
    // The Watch service once more, answering with `fanout::WatchOut`: the same route
    // (`/etcdserverpb.Watch/Watch`) and wire format, but events travel pre-encoded, so a
    // server or proxy that sends one event to many watchers encodes it once (see `fanout`).
    let fanout_watch = tonic_build::manual::Service::builder()
        .name("Watch")
        .package("etcdserverpb")
        .method(
            tonic_build::manual::Method::builder()
                .name("watch")
                .route_name("Watch")
                .input_type("crate::etcdserverpb::WatchRequest")
                .output_type("crate::fanout::WatchOut")
                .codec_path("tonic_prost::ProstCodec")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    let fanout_dir = out_dir.join("fanout");
    std::fs::create_dir_all(&fanout_dir)?;
    tonic_build::manual::Builder::new()
        .build_client(false)
        .out_dir(&fanout_dir)
        .compile(&[fanout_watch]);
    Ok(())
}
