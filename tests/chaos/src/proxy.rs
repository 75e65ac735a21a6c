//! A TCP proxy between the workers and one sidecar, so that the nemesis can cut a worker's
//! connection the way a network does: the sidecar sees its HTTP/2 connection end without a
//! goodbye, the worker sees its stream fail, and neither process is touched.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Forwards every connection accepted on its own port to `upstream`.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    acceptor: AbortHandle,
}

impl Proxy {
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().expect("proxy address").port();
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let open = Arc::clone(&connections);
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let task = tokio::spawn(async move {
                    // The sidecar may be down: the worker's connection then just closes.
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut open = open.lock();
                open.retain(|c| !c.is_finished());
                open.push(task.abort_handle());
            }
        })
        .abort_handle();
        Self {
            port,
            connections,
            acceptor,
        }
    }

    /// Closes every connection through the proxy at once (new ones are accepted again).
    /// Returns how many were cut.
    pub(crate) fn cut(&self) -> usize {
        let cut: Vec<AbortHandle> = std::mem::take(&mut *self.connections.lock());
        let live = cut.iter().filter(|c| !c.is_finished()).count();
        for connection in cut {
            connection.abort();
        }
        live
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}
