//! `--dev`: a throwaway local `redis-server` when none answers at the configured URL, so the
//! sidecar runs on a fresh machine with one command.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A `redis-server` child process; killed when dropped.
#[derive(Debug)]
pub struct DevRedis {
    _child: Child,
    pub url: String,
}

/// Whether something accepts TCP connections at the URL's host and port.
pub async fn reachable(url: &str) -> bool {
    let Ok(server) = crate::redis::single_server(url) else {
        return false;
    };
    let Some((host, port)) = server else {
        return true; // Only a single server is replaced by a throwaway one.
    };
    let addr = format!("{host}:{port}");
    matches!(
        tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Starts `redis-server` on a free loopback port, without persistence, and waits until it
/// accepts connections.
pub async fn start() -> std::io::Result<DevRedis> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_ok() {
            return Ok(DevRedis {
                _child: child,
                url: format!("redis://{addr}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(std::io::Error::other(
        "redis-server did not start within 5 s",
    ))
}
