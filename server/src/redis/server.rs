//! What the Redis server is and offers, learned once when the sidecar first reaches it: its
//! product and version (for the log line operators compare with the support table) and the
//! commands whose presence changes what the sidecar sends.

use fred::prelude::*;

use super::keys::KeySpecs;
use super::{call, str_arg};

/// The server behind the sidecar's Redis URL (on a cluster, the node that answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis` or `valkey` (Valkey names itself in `server_name`).
    pub product: String,
    pub version: String,
    /// `XACKDEL` exists (Redis 8.2, Valkey 9.2): settles under retention delete in one command.
    pub ack_delete: bool,
}

impl ServerInfo {
    /// Asks `INFO server`; the command table is the one already loaded. An ACL user may be
    /// refused INFO (it needs no more to consume): the version is then unknown, and what the
    /// server offers still comes from the command table.
    pub async fn load(client: &Client, specs: &KeySpecs) -> Self {
        let text = match call(client, "INFO", vec![str_arg("server")], false).await {
            Ok(reply) => reply.as_string().unwrap_or_default(),
            Err(err) => {
                tracing::debug!(error = %err, "INFO server failed; the server's version is unknown");
                String::new()
            }
        };
        Self::parse(&text, specs.knows("XACKDEL"))
    }

    /// Reads `INFO server` text.
    pub fn parse(info: &str, ack_delete: bool) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let product = field("server_name").unwrap_or_else(|| "redis".to_owned());
        let version = field(&format!("{product}_version"))
            .or_else(|| field("redis_version"))
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            product,
            version,
            ack_delete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_and_valkey_name_themselves() {
        let redis = "# Server\r\nredis_version:8.2.3\r\nredis_mode:standalone\r\n";
        assert_eq!(
            ServerInfo::parse(redis, true),
            ServerInfo {
                product: "redis".into(),
                version: "8.2.3".into(),
                ack_delete: true
            }
        );
        // Valkey keeps redis_version at the Redis release it is compatible with.
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        let info = ServerInfo::parse(valkey, false);
        assert_eq!(
            (info.product.as_str(), info.version.as_str()),
            ("valkey", "9.1.2")
        );
    }
}
