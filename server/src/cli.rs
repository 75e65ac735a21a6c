//! `window-sidecar dead-letters …`: the operator's command for dead letters. It is a client of
//! a running sidecar's `DeadLetterService` (`kubectl exec` into the pod and run it beside the
//! sidecar), so the same token, mutual TLS and `--allow-keys` apply, and it finds the sidecar
//! through the variables the client libraries read (`WINDOW_SIDECAR_ADDR`, `_TOKEN`,
//! `_TLS_CA`, `_TLS_CERT`, `_TLS_KEY`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::domain::letter::REDRIVE_REFUSED;
use crate::proto::dead_letter_service_client::DeadLetterServiceClient;
use crate::proto::dead_letter_target::Kind as TargetKind;
use crate::proto::{self, DeadLetterEntry};

/// The first argument that runs the dead-letter command instead of the sidecar.
pub const DEAD_LETTERS: &str = "dead-letters";

/// Works the dead letters of a stream or list through a running sidecar.
#[derive(Debug, Parser)]
#[command(name = "window-sidecar dead-letters", version)]
pub struct DeadLettersCli {
    /// The sidecar: `host:port` or `unix:/path/to.sock`.
    #[arg(
        long,
        env = "WINDOW_SIDECAR_ADDR",
        default_value = "127.0.0.1:50051",
        global = true
    )]
    sidecar: String,

    /// The sidecar's bearer token, when it requires one.
    #[arg(
        long,
        env = "WINDOW_SIDECAR_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,

    /// PEM CA of the sidecar's TLS certificate (TLS on when set).
    #[arg(long, env = "WINDOW_SIDECAR_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,

    /// PEM client certificate, for a sidecar that requires mutual TLS (with --tls-key).
    #[arg(long, env = "WINDOW_SIDECAR_TLS_CERT", global = true)]
    tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "WINDOW_SIDECAR_TLS_KEY", global = true)]
    tls_key: Option<PathBuf>,

    /// One JSON object per dead letter (or per result) instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// The dead letters of a stream or list, oldest first, one line each.
    List {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        #[command(flatten)]
        select: Select,
        /// The most to show.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One dead letter in full: origin, counts, reason, headers and payload.
    Show {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        /// Its id, as `list` shows it.
        id: String,
    },
    /// Sends dead letters back to where they came from as fresh entries.
    Redrive {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Where to send them instead of their origin (needed for dead letters that do not
        /// say where they came from, such as ruststream-fred's).
        #[arg(long)]
        to: Option<String>,
        /// Show what would be redriven; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Redrives per second at most; 0: as fast as Redis answers.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// The most to redrive.
        #[arg(long, default_value_t = 10_000)]
        limit: u32,
    },
    /// Removes dead letters.
    Purge {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Show what would be removed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The most to remove.
        #[arg(long, default_value_t = 10_000)]
        limit: u32,
    },
}

/// Which dead letters: those that match every option given.
#[derive(Debug, Args)]
struct Select {
    /// This dead letter (repeatable).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Dead letters whose reason matches this glob (`card*`).
    #[arg(long)]
    reason: Option<String>,
    /// Dead letters at least this old (`10m`, `2h`; streams only).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

impl Select {
    fn message(&self) -> proto::DeadLetterSelection {
        proto::DeadLetterSelection {
            ids: self.ids.clone(),
            reason: self.reason.clone().unwrap_or_default(),
            older_than: self.older_than.map(|d| prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
            all: self.all,
        }
    }
}

/// `stream:<key>` or `list:<key>`.
#[derive(Clone, Debug)]
struct Target(TargetKind);

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("stream", key)) if !key.is_empty() => Ok(Target(TargetKind::Stream(key.into()))),
            Some(("list", key)) if !key.is_empty() => Ok(Target(TargetKind::List(key.into()))),
            _ => Err(format!(
                "{s:?} names no dead letter: write stream:<key> or list:<key>"
            )),
        }
    }
}

impl Target {
    fn message(&self) -> Option<proto::DeadLetterTarget> {
        Some(proto::DeadLetterTarget {
            kind: Some(self.0.clone()),
        })
    }
}

/// Why the command failed.
#[derive(Debug, Error)]
pub enum CliError {
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--tls-cert and --tls-key go together")]
    CertWithoutKey,
    #[error("the bearer token is not a valid header value")]
    Token,
    #[error("cannot reach the sidecar at {addr}: {source}")]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("the sidecar at {addr} refused: {} ({:?})", .status.message(), .status.code())]
    Refused { addr: String, status: tonic::Status },
    #[error("no dead letter {0} there")]
    NotFound(String),
    #[error(
        "Redis refused to redrive {refused} of the {chosen} dead letters chosen; they are still dead letters, each listed with Redis's error"
    )]
    RedriveRefused { refused: usize, chosen: usize },
}

impl DeadLettersCli {
    /// Runs the command; prints its result on stdout.
    pub async fn run(self) -> Result<(), CliError> {
        let mut client = self.connect().await?;
        let refused = |status| CliError::Refused {
            addr: self.sidecar.clone(),
            status,
        };
        let mut out = String::new();
        match &self.action {
            Action::List {
                target,
                select,
                limit,
            } => {
                let listed = client
                    .list_dead_letters(self.request(proto::ListDeadLettersRequest {
                        target: target.message(),
                        selection: Some(select.message()),
                        limit: *limit,
                    })?)
                    .await
                    .map_err(refused)?
                    .into_inner();
                for letter in &listed.dead_letters {
                    if self.json {
                        let _ = writeln!(out, "{}", letter_json(letter));
                    } else {
                        let _ = writeln!(out, "{}", letter_line(letter));
                    }
                }
                if !self.json {
                    let _ = writeln!(
                        out,
                        "{} shown of {} dead letters",
                        listed.dead_letters.len(),
                        listed.total
                    );
                }
            }
            Action::Show { target, id } => {
                let listed = client
                    .list_dead_letters(self.request(proto::ListDeadLettersRequest {
                        target: target.message(),
                        selection: Some(proto::DeadLetterSelection {
                            ids: vec![id.clone()],
                            ..Default::default()
                        }),
                        limit: 1,
                    })?)
                    .await
                    .map_err(refused)?
                    .into_inner();
                let letter = listed
                    .dead_letters
                    .first()
                    .ok_or_else(|| CliError::NotFound(id.clone()))?;
                if self.json {
                    let _ = writeln!(out, "{}", letter_json(letter));
                } else {
                    out.push_str(&letter_text(letter));
                }
            }
            Action::Redrive {
                target,
                select,
                to,
                dry_run,
                rate,
                limit,
            } => {
                let done = client
                    .redrive_dead_letters(self.request(proto::RedriveDeadLettersRequest {
                        target: target.message(),
                        selection: Some(select.message()),
                        to: to.clone().unwrap_or_default(),
                        dry_run: *dry_run,
                        per_second: *rate,
                        limit: *limit,
                    })?)
                    .await
                    .map_err(refused)?
                    .into_inner();
                let (verb, summary) = if done.dry_run {
                    ("would redrive", "would be redriven (dry run)")
                } else {
                    ("redrove", "redriven")
                };
                let mut moved = 0;
                let mut refused = 0;
                for r in &done.redriven {
                    let was_refused = r.skipped.starts_with(REDRIVE_REFUSED);
                    refused += usize::from(was_refused);
                    if self.json {
                        let _ = writeln!(
                            out,
                            "{}",
                            serde_json::json!({"id": r.id, "to": r.to, "new_id": r.new_id, "skipped": r.skipped, "refused": was_refused, "dry_run": done.dry_run})
                        );
                    } else if was_refused {
                        let _ = writeln!(out, "refused {}: {}", r.id, r.skipped);
                    } else if r.skipped.is_empty() {
                        moved += 1;
                        let new = if r.new_id.is_empty() {
                            String::new()
                        } else {
                            format!(" as {}", r.new_id)
                        };
                        let _ = writeln!(out, "{verb} {} to {}{new}", r.id, r.to);
                    } else {
                        let _ = writeln!(out, "skipped {}: {}", r.id, r.skipped);
                    }
                }
                if !self.json {
                    let _ = writeln!(
                        out,
                        "{moved} of {} dead letters {summary}",
                        done.redriven.len()
                    );
                }
                if refused > 0 {
                    print!("{out}");
                    return Err(CliError::RedriveRefused {
                        refused,
                        chosen: done.redriven.len(),
                    });
                }
            }
            Action::Purge {
                target,
                select,
                dry_run,
                limit,
            } => {
                let done = client
                    .purge_dead_letters(self.request(proto::PurgeDeadLettersRequest {
                        target: target.message(),
                        selection: Some(select.message()),
                        dry_run: *dry_run,
                        limit: *limit,
                    })?)
                    .await
                    .map_err(refused)?
                    .into_inner();
                let (verb, summary) = if done.dry_run {
                    ("would purge", "would be purged (dry run)")
                } else {
                    ("purged", "purged")
                };
                for id in &done.ids {
                    if self.json {
                        let _ = writeln!(
                            out,
                            "{}",
                            serde_json::json!({"id": id, "dry_run": done.dry_run})
                        );
                    } else {
                        let _ = writeln!(out, "{verb} {id}");
                    }
                }
                if !self.json {
                    let _ = writeln!(out, "{} dead letters {summary}", done.ids.len());
                }
            }
        }
        print!("{out}");
        Ok(())
    }

    /// A request with the bearer token, when there is one.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, CliError> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value =
                MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| CliError::Token)?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }

    async fn connect(&self) -> Result<DeadLetterServiceClient<Channel>, CliError> {
        let connect = |source| CliError::Connect {
            addr: self.sidecar.clone(),
            source,
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| CliError::File {
                path: path.clone(),
                source,
            })
        };
        let channel = if let Some(path) = self.sidecar.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            Endpoint::from_static("http://sidecar.invalid")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(connect)?
        } else {
            let scheme = if self.tls_ca.is_some() {
                "https"
            } else {
                "http"
            };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.sidecar))
                .map_err(connect)?
                .connect_timeout(Duration::from_secs(5));
            if let Some(ca) = &self.tls_ca {
                let mut tls =
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
                match (&self.tls_cert, &self.tls_key) {
                    (Some(cert), Some(key)) => {
                        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                    }
                    (None, None) => {}
                    _ => return Err(CliError::CertWithoutKey),
                }
                endpoint = endpoint.tls_config(tls).map_err(connect)?;
            }
            endpoint.connect().await.map_err(connect)?
        };
        Ok(DeadLetterServiceClient::new(channel))
    }
}

/// Bytes as text when they are printable UTF-8, else escaped (`\x01`), so that a binary
/// value cannot garble the terminal.
fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_owned(),
        _ => bytes.escape_ascii().to_string(),
    }
}

fn age(letter: &DeadLetterEntry) -> String {
    letter.age.as_ref().map_or_else(
        || "-".to_owned(),
        |age| {
            humantime::format_duration(Duration::from_secs(age.seconds.max(0) as u64)).to_string()
        },
    )
}

fn origin(letter: &DeadLetterEntry) -> String {
    match (letter.origin.as_str(), letter.origin_group.as_str()) {
        ("", _) => "(origin unknown)".to_owned(),
        (key, "") => key.to_owned(),
        (key, group) => format!("{key} (group {group})"),
    }
}

/// One line of `list`.
fn letter_line(letter: &DeadLetterEntry) -> String {
    let mut body = if letter.fields.is_empty() {
        text(&letter.payload)
    } else {
        letter
            .fields
            .iter()
            .map(|f| format!("{}={}", f.name, text(&f.value)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if body.chars().count() > 60 {
        body = body.chars().take(57).collect::<String>() + "...";
    }
    format!(
        "{}  from {}  deliveries {}  age {}  reason {}  {}",
        letter.id,
        origin(letter),
        letter.deliveries,
        age(letter),
        if letter.reason.is_empty() {
            "-".to_owned()
        } else {
            format!("{:?}", letter.reason)
        },
        body
    )
}

/// `show`'s text.
fn letter_text(letter: &DeadLetterEntry) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "id:         {}", letter.id);
    let _ = writeln!(out, "origin:     {}", origin(letter));
    let _ = writeln!(out, "deliveries: {}", letter.deliveries);
    let _ = writeln!(out, "reason:     {}", letter.reason);
    let _ = writeln!(out, "age:        {}", age(letter));
    let _ = writeln!(out, "redriven:   {}", letter.redriven);
    if letter.raw {
        let _ = writeln!(out, "raw value (not a frame):");
    }
    for h in &letter.headers {
        let _ = writeln!(out, "header      {}: {}", h.name, text(&h.value));
    }
    for f in &letter.fields {
        let _ = writeln!(out, "field       {}: {}", f.name, text(&f.value));
    }
    if letter.fields.is_empty() {
        let _ = writeln!(out, "payload:    {}", text(&letter.payload));
    }
    out
}

fn letter_json(letter: &DeadLetterEntry) -> serde_json::Value {
    let pairs = |list: &[proto::DeadLetterHeader]| {
        list.iter()
            .map(|p| serde_json::json!([p.name, text(&p.value)]))
            .collect::<Vec<_>>()
    };
    serde_json::json!({
        "id": letter.id,
        "origin": letter.origin,
        "origin_group": letter.origin_group,
        "deliveries": letter.deliveries,
        "reason": letter.reason,
        "age_seconds": letter.age.as_ref().map(|a| a.seconds),
        "payload": text(&letter.payload),
        "headers": pairs(&letter.headers),
        "fields": pairs(&letter.fields),
        "raw": letter.raw,
        "redriven": letter.redriven,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_selections_parse() {
        let cli = DeadLettersCli::try_parse_from([
            "dead-letters",
            "redrive",
            "stream:orders:dead",
            "--reason",
            "card*",
            "--older-than",
            "10m",
            "--dry-run",
        ])
        .unwrap();
        let Action::Redrive {
            target,
            select,
            dry_run,
            ..
        } = cli.action
        else {
            panic!("{:?}", cli.action)
        };
        assert!(matches!(target.0, TargetKind::Stream(ref k) if k == "orders:dead"));
        assert!(dry_run);
        let selection = select.message();
        assert_eq!(selection.reason, "card*");
        assert_eq!(selection.older_than.unwrap().seconds, 600);
        let err = DeadLettersCli::try_parse_from(["dead-letters", "list", "orders"]).unwrap_err();
        assert!(
            err.to_string().contains("write stream:<key> or list:<key>"),
            "{err}"
        );
    }
}
