//! Belay's wire contract: the gRPC package `belay.v1` generated from
//! `proto/belay/v1/belay.proto`, and the JSON documents ([`wire`]) that travel
//! inside its `*_json` fields between engine and workers; and [`connect`],
//! the one way clients reach an engine (TLS, API key; feature `grpc`); and
//! [`pools`], the tags of a task's requirements and a worker's capabilities.

#[cfg(feature = "grpc")]
pub mod connect;
pub mod pools;
#[cfg(feature = "grpc")]
pub mod signal;
#[cfg(feature = "telemetry")]
pub mod telemetry;
pub mod trace;
pub mod wire;

/// Generated messages, clients and servers of package `belay.v1`
/// (feature `grpc`, the default).
#[cfg(feature = "grpc")]
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("belay.v1");
}

#[cfg(feature = "grpc")]
impl std::fmt::Debug for v1::SecretValue {
    /// The key and the value's length: a vaulted secret never shows in
    /// `Debug` output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretValue")
            .field("key", &self.key)
            .field(
                "value",
                &format_args!("<{} bytes hidden>", self.value.len()),
            )
            .finish()
    }
}

/// The encoded `FileDescriptorSet` of `belay.v1`, served by gRPC reflection
/// (feature `grpc`).
#[cfg(feature = "grpc")]
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/belay_v1_descriptor.bin"));

#[cfg(all(test, feature = "grpc"))]
mod tests {
    #[test]
    fn a_secret_value_never_shows_in_debug_output() {
        let response = super::v1::DispatchToolCallResponse {
            secrets: vec![super::v1::SecretValue {
                key: "txn_otp".into(),
                value: "otp-123456".into(),
            }],
            ..Default::default()
        };
        let shown = format!("{response:?}");
        assert!(shown.contains("txn_otp") && shown.contains("10 bytes hidden"));
        assert!(!shown.contains("otp-123456"), "{shown}");
    }
}
