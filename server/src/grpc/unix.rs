//! A client channel to a sidecar listening on a Unix domain socket (`--listen unix:PATH`), for
//! the sidecar's own tools: the `dead-letters` command, the tests and the benchmark.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Error};

/// Opens a channel to the sidecar at the socket `path`. The URI only satisfies tonic: its
/// authority is never looked up, the connector dials the socket.
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Channel, Error> {
    let path = path.as_ref().to_path_buf();
    Endpoint::from_static("http://sidecar.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}
