//! Generates the `belay.v1` client and server code and the file descriptor set
//! that the engine serves for gRPC reflection (feature `grpc`, the default;
//! without it there is nothing to generate).

#[cfg(not(feature = "grpc"))]
fn main() {}

#[cfg(feature = "grpc")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    // Honour $PROTOC when set; otherwise use the vendored binary so no system
    // package is needed.
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    // A secret's value must not show in `Debug` output (logs, panics):
    // `src/lib.rs` writes the `Debug` of `SecretValue` by hand.
    config.skip_debug([".belay.v1.SecretValue"]);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("belay_v1_descriptor.bin"))
        .compile_with_config(config, &["proto/belay/v1/belay.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/belay/v1/belay.proto");
    Ok(())
}
