//! Types generated from `proto/window_sidecar/v1/` (`window.proto`, `dead_letters.proto`): the
//! wire contract the gRPC services serve and the `dead-letters` command speaks. In a file of its
//! own rather than inline in lib.rs, so that the services' use of it is not a use of the crate
//! root, which sits above them.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("window_sidecar.v1");

/// The encoded file descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("window_sidecar_descriptor");
