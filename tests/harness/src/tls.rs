//! TLS for tests: certificates made with the `openssl` CLI, and a `redis-server` listening only
//! on a TLS port (`--port 0 --tls-port <p>`), SIGKILLed by pid and its dir removed on drop.
//!
//! Readiness (and anything a test wants to check over TLS without a TLS-enabled client) goes
//! through `redis-cli --tls`, independent of fred's TLS features; see [`TlsRedisServer::cli`].
//! A TLS-enabled client must trust [`TlsMaterial::ca_cert`] (the server certificate is valid
//! for `127.0.0.1` and `localhost`) and, when client certificates are required, present
//! [`TlsMaterial::client_cert`] / [`TlsMaterial::client_key`].

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::RedisServer;
use crate::util::{Probe, Proc, TempDir, arg};

/// A self-signed CA, a server certificate for `127.0.0.1`/`localhost` and a client
/// certificate, all signed by that CA (ECDSA P-256, PEM files; keys are unencrypted PKCS#8).
#[derive(Debug)]
pub struct TlsMaterial {
    pub dir: PathBuf,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// `CN=localhost`, `subjectAltName = IP:127.0.0.1, DNS:localhost`, EKU serverAuth.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// `CN=window-sidecar-test-client`, EKU clientAuth.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _owned: Option<TempDir>,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the openssl CLI is installed (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const CA_CONF: &str = "\
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = window-sidecar test CA
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
";

const SERVER_EXT: &str = "\
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

const CLIENT_EXT: &str = "\
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

impl TlsMaterial {
    /// Writes `ca.crt`/`ca.key`, `server.crt`/`server.key` and `client.crt`/`client.key` (plus
    /// a few helper files) into `dir` (created if missing; the caller owns and removes it).
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("create tls dir");
        let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect(name);
        w("ca.cnf", CA_CONF);
        w("server.ext", SERVER_EXT);
        w("client.ext", CLIENT_EXT);
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-new", "-nodes", "-config", "ca.cnf"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", "30"]);
        openssl(dir, &ca);
        // Distinct serials across runs, in case anything caches by issuer + serial.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            & 0x7fff_ffff_ffff_fff0;
        for (i, (name, cn)) in [
            ("server", "localhost"),
            ("client", "window-sidecar-test-client"),
        ]
        .into_iter()
        .enumerate()
        {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            let subj = format!("/CN={cn}");
            let mut req = vec!["req", "-new", "-nodes"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(dir, &req);
            let serial = format!("{}", nanos + i as u64 + 1);
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-set_serial",
                    &serial,
                    "-days",
                    "30",
                    "-extfile",
                    &ext,
                    "-out",
                    &crt,
                ],
            );
        }
        Self {
            dir: dir.to_path_buf(),
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            _owned: None,
        }
    }

    /// Like [`Self::generate`], in a temp dir that is removed when the material is dropped.
    pub fn generate_temp() -> Self {
        let dir = TempDir::new("tls");
        let mut material = Self::generate(dir.path());
        material._owned = Some(dir);
        material
    }

    /// `redis-cli` TLS flags: `--tls --cacert <ca>` plus `--cert/--key` of the client
    /// certificate when `with_client_cert`.
    pub fn cli_args(&self, with_client_cert: bool) -> Vec<String> {
        let mut args = vec!["--tls".into(), "--cacert".into(), arg(&self.ca_cert)];
        if with_client_cert {
            args.extend([
                "--cert".into(),
                arg(&self.client_cert),
                "--key".into(),
                arg(&self.client_key),
            ]);
        }
        args
    }
}

/// A `redis-server` reachable only over TLS on a free loopback port (no plain port).
#[derive(Debug)]
pub struct TlsRedisServer {
    proc: Proc,
    cli: Vec<String>,
}

impl TlsRedisServer {
    /// Starts the server; `require_client_cert` maps to `--tls-auth-clients yes|no`. Ready once
    /// `redis-cli --tls` (with the client certificate) gets its `INFO server` through.
    pub fn start(material: &TlsMaterial, require_client_cert: bool) -> Self {
        Self::start_with(material, require_client_cert, &[])
    }

    /// [`Self::start`] with extra `redis-server` arguments.
    pub fn start_with(material: &TlsMaterial, require_client_cert: bool, extra: &[&str]) -> Self {
        let cli = material.cli_args(require_client_cert);
        let probe = Probe::Cli(material.cli_args(true));
        let proc = Proc::start("tls", probe, |port, dir| {
            let mut args: Vec<String> = vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--tls-cert-file".into(),
                arg(&material.server_cert),
                "--tls-key-file".into(),
                arg(&material.server_key),
                "--tls-ca-cert-file".into(),
                arg(&material.ca_cert),
                "--tls-auth-clients".into(),
                if require_client_cert { "yes" } else { "no" }.into(),
                "--save".into(),
                "".into(),
                "--appendonly".into(),
                "no".into(),
                "--daemonize".into(),
                "no".into(),
                "--dir".into(),
                arg(dir),
                "--logfile".into(),
                arg(dir.join("redis.log")),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        });
        Self { proc, cli }
    }

    pub fn port(&self) -> u16 {
        self.proc.port
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.proc.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// SIGKILL by pid.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts it again on the same port (empty).
    pub fn restart(&mut self) {
        let port = self.proc.port;
        let started = (0..20).any(|_| {
            self.proc.spawn() || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                false
            }
        });
        assert!(started, "TLS redis-server did not restart on port {port}");
    }

    /// Runs `redis-cli --tls --cacert <ca> [--cert <client> --key <client key>] -h 127.0.0.1
    /// -p <port> <args...>` (the client certificate only when the server requires one).
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_with(&self.cli, args)
    }

    /// Like [`Self::cli`] with explicit TLS flags (e.g. [`TlsMaterial::cli_args`]`(false)` to
    /// show that a server requiring client certificates rejects a client without one).
    pub fn cli_with(&self, tls_args: &[String], args: &[&str]) -> Output {
        Command::new("redis-cli")
            .args(tls_args)
            .args(["-h", "127.0.0.1", "-p", &self.proc.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is installed and runnable")
    }

    /// The server's log tail.
    pub fn log_tail(&self) -> String {
        self.proc.log_tail()
    }
}

impl RedisServer {
    /// Same as [`TlsRedisServer::start`].
    pub fn start_tls(material: &TlsMaterial, require_client_cert: bool) -> TlsRedisServer {
        TlsRedisServer::start(material, require_client_cert)
    }
}
