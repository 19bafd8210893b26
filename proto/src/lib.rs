//! Belay's wire contract: the gRPC package `belay.v1` generated from
//! `proto/belay/v1/belay.proto`, and the JSON documents ([`wire`]) that travel
//! inside its `*_json` fields between engine and workers.

pub mod wire;

/// Generated messages, clients and servers of package `belay.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("belay.v1");
}

/// The encoded `FileDescriptorSet` of `belay.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/belay_v1_descriptor.bin"));
