//! Numbers accepted connections and counts the subscriptions each holds open, so one client
//! connection cannot take every subscription a sidecar can serve.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TlsConnectInfo};

use crate::policy::PolicyError;

/// The number of an accepted connection, unique in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectionId(u64);

impl ConnectionId {
    /// The connection a request came on, with or without TLS.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<Self> {
        let extensions = request.extensions();
        extensions.get::<Self>().copied().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Self>>()
                .map(|tls| *tls.get_ref())
        })
    }
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// An accepted connection with its number; reads and writes go to the inner stream.
#[derive(Debug)]
pub struct Numbered<T> {
    io: T,
    id: ConnectionId,
}

impl<T> Numbered<T> {
    pub fn new(io: T) -> Self {
        Self {
            io,
            id: ConnectionId(NEXT.fetch_add(1, Ordering::Relaxed)),
        }
    }
}

impl<T> Connected for Numbered<T> {
    type ConnectInfo = ConnectionId;
    fn connect_info(&self) -> ConnectionId {
        self.id
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Numbered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Numbered<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Open subscriptions per connection.
#[derive(Debug, Default, Clone)]
pub struct Connections {
    open: Arc<Mutex<HashMap<ConnectionId, usize>>>,
}

impl Connections {
    /// Counts a new subscription on `id`, unless it already holds `max`. The count drops when
    /// the returned guard does.
    pub fn open(&self, id: ConnectionId, max: usize) -> Result<Held, PolicyError> {
        let mut open = self.open.lock();
        let count = open.entry(id).or_insert(0);
        if *count >= max {
            return Err(PolicyError::TooManySubscriptions { max });
        }
        *count += 1;
        Ok(Held {
            connections: self.clone(),
            id,
        })
    }

    /// Whether no connection holds a subscription.
    pub fn is_empty(&self) -> bool {
        self.open.lock().is_empty()
    }
}

/// One open subscription, counted against its connection until dropped.
#[derive(Debug)]
pub struct Held {
    connections: Connections,
    id: ConnectionId,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock();
        if let Some(count) = open.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_connection_and_forgets_closed_ones() {
        let connections = Connections::default();
        let (a, b) = (ConnectionId(1), ConnectionId(2));
        let first = connections.open(a, 2).unwrap();
        let second = connections.open(a, 2).unwrap();
        assert_eq!(
            connections.open(a, 2).unwrap_err(),
            PolicyError::TooManySubscriptions { max: 2 }
        );
        let other = connections.open(b, 2).unwrap();
        drop(first);
        let third = connections.open(a, 2).unwrap();
        drop((second, third, other));
        assert!(connections.is_empty());
    }
}
