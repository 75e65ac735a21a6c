pub mod cluster;
pub mod codec;
pub mod command;
pub mod connection;
#[cfg(feature = "network-logs")]
pub mod debug;
pub mod hashers;
pub mod responders;
/// TLS configuration types.
#[cfg(any(
  feature = "enable-rustls",
  feature = "enable-native-tls",
  feature = "enable-rustls-ring"
))]
pub mod tls;
pub mod types;
pub mod utils;
