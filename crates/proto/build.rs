//! Generates the prost messages and tonic clients/servers for etcd's API.
//!
//! protoc is taken from `PROTOC` or `PATH` (Debian's `protobuf-compiler`);
//! this script deliberately does not set `PROTOC` itself.

const PROTOS: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/etcdrspeer/peer.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // prost-build does not emit these itself.
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(PROTOS, &["proto"])?;
    Ok(())
}
