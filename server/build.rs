//! Generates the gRPC server and client from `proto/` with a vendored `protoc`, so building needs
//! no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = std::path::PathBuf::from("../proto");
    let protos = [
        proto_root.join("window_sidecar/v1/window.proto"),
        proto_root.join("window_sidecar/v1/dead_letters.proto"),
    ];
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let mut config = prost_build::Config::new();
    // A `PROTOC` from the environment wins, as prost-build users expect.
    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => path.into(),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    config.protoc_executable(protoc);

    // google/protobuf/*.proto ship with the vendored compiler.
    let well_known: std::path::PathBuf = protoc_bin_vendored::include_path()?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("window_sidecar_descriptor.bin"))
        .bytes(".window_sidecar.v1")
        .compile_with_config(config, &protos, &[proto_root, well_known])?;
    Ok(())
}
