//! The secrets the configuration names by file, as a mounted Kubernetes Secret gives them: the
//! Redis password, the bearer token and the listener's TLS key pair. They are read once, when
//! the sidecar starts (rotating one means restarting it), and never by `--check-config`, which
//! checks a configuration on a machine that need not hold its Secrets.

use std::path::Path;

use super::{Config, ConfigError, Secret};

/// The listener's PEM files, read.
#[derive(Clone)]
pub struct ListenerPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// Mutual TLS: the CA that client certificates must chain to.
    pub client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for ListenerPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never print it.
        f.debug_struct("ListenerPem")
            .field("mutual", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|source| ConfigError::SecretFile {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_text(what: &'static str, path: &Path) -> Result<String, ConfigError> {
    String::from_utf8(read(what, path)?).map_err(|_| ConfigError::SecretFile {
        what,
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"),
    })
}

impl Config {
    /// The Redis password: `--redis-password-file` (without its final line break), else
    /// `--redis-password`.
    pub fn redis_password(&self) -> Result<Option<Secret>, ConfigError> {
        match &self.redis_password_file {
            Some(path) => {
                let text = read_text("Redis password file", path)?;
                Ok(Some(Secret::new(text.trim_end_matches(['\r', '\n']))))
            }
            None => Ok(self.redis_password.clone()),
        }
    }

    /// The bearer token: `--auth-token-file` (trimmed; empty is refused), else `--auth-token`.
    pub fn auth_token(&self) -> Result<Option<Secret>, ConfigError> {
        match &self.auth_token_file {
            Some(path) => {
                let text = read_text("token file", path)?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(ConfigError::EmptyTokenFile { path: path.clone() });
                }
                Ok(Some(Secret::new(token)))
            }
            None => Ok(self.auth_token.clone()),
        }
    }

    /// The listener's certificate, key and client CA, when it serves TLS.
    pub fn listener_pem(&self) -> Result<Option<ListenerPem>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        Ok(Some(ListenerPem {
            cert: read("TLS file", cert)?,
            key: read("TLS file", key)?,
            client_ca: self
                .tls_client_ca
                .as_deref()
                .map(|ca| read("TLS file", ca))
                .transpose()?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["window-sidecar"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).expect("parses")
    }

    #[test]
    fn secret_files_are_read_without_their_line_breaks() {
        let dir = std::env::temp_dir().join(format!("window-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let password = dir.join("password");
        std::fs::write(&password, " pass word \r\n").unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "\n  t0ken \n").unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, " \n").unwrap();
        let c = config(&[
            "--redis-password-file",
            password.to_str().unwrap(),
            "--auth-token-file",
            token.to_str().unwrap(),
        ]);
        assert_eq!(c.redis_password().unwrap().unwrap().expose(), " pass word ");
        assert_eq!(c.auth_token().unwrap().unwrap().expose(), "t0ken");
        let c = config(&["--auth-token-file", empty.to_str().unwrap()]);
        assert!(matches!(
            c.auth_token(),
            Err(ConfigError::EmptyTokenFile { .. })
        ));
        let missing = dir.join("missing");
        let c = config(&["--redis-password-file", missing.to_str().unwrap()]);
        let err = c.redis_password().unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read the Redis password file"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
