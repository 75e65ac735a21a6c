//! What a Redis failure is, as the sidecar reports it: one classification of fred's errors,
//! which the gRPC layer maps to statuses and the session to what it tells a client.

use fred::prelude::*;
use thiserror::Error;

/// A Redis failure, as the sidecar reports it.
#[derive(Debug, Error)]
pub enum RedisError {
    #[error("invalid Redis URL {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("TLS to Redis: {reason}")]
    Tls { reason: String },
    #[error("Redis is unreachable: {0}")]
    Unavailable(String),
    #[error("Redis did not answer in time ({0})")]
    Timeout(String),
    /// Redis refused the sidecar's credentials (`WRONGPASS`, `NOAUTH`). `user` is the ACL user
    /// the sidecar logs in as, once known; the reply is Redis's, which never holds the password.
    #[error(
        "authentication to Redis failed{}: {reply}; the sidecar's --redis-username and --redis-password-file (or the URL's user and password) do not match the Redis ACL. It keeps trying and serves once they do",
        for_user(user.as_deref())
    )]
    Auth { user: Option<String>, reply: String },
    #[error("Redis refused {command}: {message}")]
    Refused { command: String, message: String },
    /// The group's delay set, a key of the sidecar's own, holds another type: nobody can tell
    /// which entries are due, so a read counts none of them and is tried again.
    #[error(
        "the delay set {key} holds a {holds}, not a sorted set: delete it or rename it (the read counted no delivery)"
    )]
    DelaySetWrongType { key: String, holds: String },
    #[error("unexpected reply to {command}: {detail}")]
    Protocol {
        command: &'static str,
        detail: String,
    },
}

fn for_user(user: Option<&str>) -> String {
    user.map(|user| format!(" for user {user:?}"))
        .unwrap_or_default()
}

impl RedisError {
    /// Classifies a fred error of `command`.
    pub fn from_fred(command: &str, err: &Error) -> Self {
        match err.kind() {
            ErrorKind::Auth => RedisError::Auth {
                user: None,
                reply: err.details().to_owned(),
            },
            ErrorKind::Timeout => RedisError::Timeout(format!("{command}: {}", err.details())),
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Backpressure => {
                RedisError::Unavailable(err.details().to_owned())
            }
            _ => RedisError::Refused {
                command: command.to_owned(),
                message: err.details().to_owned(),
            },
        }
    }
}
