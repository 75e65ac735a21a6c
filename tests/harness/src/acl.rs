//! Authentication helpers: a password-protected server and ACL users.
//!
//! ```no_run
//! # async fn demo() {
//! use window_sidecar_harness::{RedisServer, acl_user};
//! let server = RedisServer::start_with_password("s3cret");
//! let admin = server.client_with_auth(None, "s3cret").await; // AUTH as `default`
//! acl_user(&admin, "sidecar", "pw", "~allowed:* +@all").await;
//! let limited = server.client_with_auth(Some("sidecar"), "pw").await;
//! # }
//! ```
//!
//! Users made with `ACL SETUSER` live in memory only: a [`RedisServer::restart`] forgets them
//! (the `--requirepass` of `start_with_password` survives, it is an argument).

use fred::prelude::*;

use crate::RedisServer;

/// `ACL SETUSER <name> reset on ><password> <rules...>`: (re)creates the user from scratch with
/// exactly these rules, e.g. `"~allowed:* +@all"`, `"~stream:* &* +@all -@dangerous"` or
/// `"allkeys allchannels +@read"`. Rules are split on whitespace.
pub async fn acl_user(client: &Client, name: &str, password: &str, rules: &str) {
    let mut args = vec![
        "SETUSER".to_owned(),
        name.to_owned(),
        "reset".to_owned(),
        "on".to_owned(),
        format!(">{password}"),
    ];
    args.extend(rules.split_whitespace().map(str::to_owned));
    let _: Value = client
        .custom(fred::cmd!("ACL"), args)
        .await
        .unwrap_or_else(|e| panic!("ACL SETUSER {name}: {e}"));
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for URL user info).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `redis://[user]:password@host:port`, user and password percent-encoded.
pub fn url_with_auth(base_url: &str, username: Option<&str>, password: &str) -> String {
    let (scheme, rest) = base_url.split_once("://").expect("a URL with a scheme");
    let user = username.map(encode).unwrap_or_default();
    format!("{scheme}://{user}:{}@{rest}", encode(password))
}

impl RedisServer {
    /// Starts a server with `--requirepass <password>` (the `default` user's password).
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(&["--requirepass", password])
    }

    /// [`Self::url`] with credentials: `redis://[user]:password@127.0.0.1:<port>`.
    pub fn url_with_auth(&self, username: Option<&str>, password: &str) -> String {
        url_with_auth(&self.url(), username, password)
    }

    /// A connected fred client authenticating as `username` (or `default`) with `password`.
    pub async fn client_with_auth(&self, username: Option<&str>, password: &str) -> Client {
        crate::connect(&self.url_with_auth(username, password)).await
    }
}
