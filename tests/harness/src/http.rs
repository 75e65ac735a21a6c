//! The sidecar's HTTP endpoints (metrics, probes, admin view) from a test: one `GET` and the
//! Prometheus text exposition read back.

use std::fmt::Display;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on a local HTTP/1.1 endpoint (`addr`: a `SocketAddr` or `host:port`): the status
/// code and the body (a chunked body is decoded).
pub async fn try_http_get(addr: impl Display, path: &str) -> Result<(u16, String), String> {
    let addr = addr.to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("GET {path} on {addr}: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| format!("GET {path} on {addr}: {e}"))?;
    let response = String::from_utf8(response).map_err(|e| format!("GET {path}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: not an HTTP response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path}: no status code in {head:?}"))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body).ok_or_else(|| format!("GET {path}: a bad chunked body"))?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// `GET path`, failing the test when the endpoint does not answer: the status and the body.
pub async fn http_get(addr: impl Display, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `GET /metrics`, which must answer 200: the exposition.
pub async fn scrape(addr: impl Display) -> String {
    ok_body(addr, "/metrics").await
}

/// `GET path`, which must answer 200: the body.
pub async fn ok_body(addr: impl Display, path: &str) -> String {
    match http_get(addr, path).await {
        (200, body) => body,
        (status, body) => panic!("GET {path} answered {status}: {body}"),
    }
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The samples of one metric family (`name` or `name{labels}`), as (labels without the
/// braces, value; NaN when the value does not parse).
pub fn series(exposition: &str, name: &str) -> Vec<(String, f64)> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (metric, labels) = match key.split_once('{') {
                Some((metric, labels)) => (metric, labels.trim_end_matches('}')),
                None => (key, ""),
            };
            (metric == name).then(|| (labels.to_owned(), value.trim().parse().unwrap_or(f64::NAN)))
        })
        .collect()
}

/// The value of one sample (`name{labels}` exactly as written, labels in the order the sidecar
/// writes them), or 0 when absent.
pub fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// The sum of every sample of a metric whose labels contain `label` (for example
/// `kind="flush"`; empty: all samples).
pub fn metric_sum(exposition: &str, name: &str, label: &str) -> f64 {
    series(exposition, name)
        .into_iter()
        .filter(|(labels, value)| labels.contains(label) && !value.is_nan())
        .map(|(_, value)| value)
        .sum()
}
