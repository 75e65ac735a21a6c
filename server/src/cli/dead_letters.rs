//! `window-sidecar dead-letters …`: the operator's command for dead letters. It is a client of
//! a running sidecar's `DeadLetterService` (`kubectl exec` into the pod and run it beside the
//! sidecar), so the same token, mutual TLS and `--allow-keys` apply, and it finds the sidecar
//! through the variables the client libraries read (`WINDOW_SIDECAR_ADDR`, `_TOKEN`,
//! `_TLS_CA`, `_TLS_CERT`, `_TLS_KEY`).
//!
//! The service speaks in its message's field names (`ids`, `all: true`); the command checks
//! what it can before it calls (a selection, the ids named, the address) and says what is wrong
//! in its own flags, naming the stream or list, and exits with a sysexits code ([`exit`]).
//! A redrive goes in bounded batches, each dead letter printed as its batch returns, so an
//! interrupted redrive has said what it moved.

use std::error::Error as _;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::exit;
use crate::domain::letter::{REDRIVE_NOT_REENTERED, REDRIVE_REFUSED, list_digest, same_id};
use crate::proto::dead_letter_service_client::DeadLetterServiceClient;
use crate::proto::dead_letter_target::Kind as TargetKind;
use crate::proto::{self, DeadLetterEntry};

/// The most one List returns (the service's bound).
const MAX_LIST: u32 = 10_000;
/// The most dead letters one redrive call of the command carries.
const MAX_BATCH: usize = 100;

/// Works the dead letters of a stream or list through a running sidecar.
#[derive(Debug, Parser)]
#[command(version, after_help = exit::DEAD_LETTERS_HELP)]
pub struct DeadLettersCli {
    /// The sidecar: `host:port` or `unix:/path/to.sock` (not a URL; TLS is --tls-ca).
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
        /// The most to show (at most 10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIST)))]
        limit: u32,
    },
    /// One dead letter in full: origin, counts, reason, headers and payload.
    Show {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        /// Its id, as `list` shows it.
        id: String,
    },
    /// Sends dead letters back to where they came from, printing each as it goes: a stream's
    /// into the consumer group it came from (no other group sees it again), a list's as a fresh
    /// value.
    Redrive {
        /// `stream:<key>` or `list:<key>`.
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Send fresh copies here instead of putting them back where they came from (needed for
        /// dead letters that do not say where they came from, such as ruststream-fred's, and for
        /// stream entries trimmed meanwhile). A stream copy is read by every group of KEY, even
        /// when KEY is the stream a dead letter came from.
        #[arg(long, value_name = "KEY")]
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
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    /// Dead letters whose reason matches this glob (`card*`).
    #[arg(long, value_name = "GLOB")]
    reason: Option<String>,
    /// Dead letters at least this old (`10m`, `2h`; streams only).
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
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

    fn is_given(&self) -> bool {
        self.all || !self.ids.is_empty() || self.reason.is_some() || self.older_than.is_some()
    }

    /// A redrive or purge must choose: checked here, so that the answer names the flags.
    fn required(&self, action: &'static str, target: &Target) -> Result<(), CliError> {
        if self.is_given() {
            Ok(())
        } else {
            Err(CliError::NoSelection {
                action,
                target: target.clone(),
            })
        }
    }
}

/// `stream:<key>` or `list:<key>`.
#[derive(Clone, Debug)]
pub struct Target(TargetKind);

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

/// As messages name it: `stream orders:dead`.
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            TargetKind::Stream(key) => write!(f, "stream {key}"),
            TargetKind::List(key) => write!(f, "list {key}"),
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

/// Why the command failed. Each says what to change in the command's own terms and names
/// the stream or list it worked on; [`CliError::exit_code`] is its sysexits code.
#[derive(Debug, Error)]
pub enum CliError {
    #[error("{flag} {}: cannot read it: {source}", .path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--tls-cert and --tls-key go together: give both, or neither")]
    CertWithoutKey,
    #[error(
        "--tls-cert and --tls-key are for a TLS sidecar: give --tls-ca (WINDOW_SIDECAR_TLS_CA), the CA of its certificate, too"
    )]
    CertWithoutCa,
    #[error("--token (WINDOW_SIDECAR_TOKEN) is not a valid header value: it must be visible ASCII")]
    Token,
    #[error(
        "--sidecar (WINDOW_SIDECAR_ADDR) {addr:?} is a URL: write host:port ({bare:?}) or unix:/path/to.sock{tls}"
    )]
    Url {
        addr: String,
        bare: String,
        tls: &'static str,
    },
    #[error(
        "--sidecar (WINDOW_SIDECAR_ADDR) {addr:?} is not host:port or unix:/path/to.sock: {why}"
    )]
    Address { addr: String, why: String },
    #[error(
        "No sidecar at {addr} ({why}): start it, or point --sidecar (WINDOW_SIDECAR_ADDR) at its --listen address"
    )]
    NoSidecar { addr: String, why: String },
    #[error("the sidecar at {addr} {why}")]
    Protocol { addr: String, why: String },
    #[error(
        "which dead letters of {target} to {action}? Choose them with --id ID, --reason GLOB, --older-than AGE, or --all for every one"
    )]
    NoSelection {
        action: &'static str,
        target: Target,
    },
    #[error("{}", not_found(.flag, .ids, .target))]
    NotFound {
        /// `--id `, or nothing for `show`'s id.
        flag: &'static str,
        ids: Vec<String>,
        target: Target,
    },
    #[error("the sidecar at {addr} refused to {action} {target}: {} ({:?})", .status.message(), .status.code())]
    Refused {
        addr: String,
        action: &'static str,
        target: Target,
        status: tonic::Status,
    },
    #[error(
        "{cause}; {done} of the {chosen} dead letters chosen were redriven before, as printed; each of the others is still a dead letter or was redriven once: `list {spec}` shows which, and the same redrive again goes on where this one stopped"
    )]
    Stopped {
        cause: Box<CliError>,
        done: usize,
        chosen: usize,
        spec: String,
    },
    #[error(
        "Redis refused to redrive {refused} of the {chosen} dead letters chosen of {target}; they are still dead letters, each listed with Redis's error"
    )]
    RedriveRefused {
        refused: usize,
        chosen: usize,
        target: Target,
    },
}

fn not_found(flag: &str, ids: &[String], target: &Target) -> String {
    let named = ids
        .iter()
        .map(|id| format!("{flag}{id}"))
        .collect::<Vec<_>>()
        .join(", ");
    let what = if ids.len() == 1 {
        format!("no dead letter {} in {target}", ids[0])
    } else {
        format!("no dead letters {} in {target}", ids.join(", "))
    };
    if flag.is_empty() {
        format!("{what}; `list` shows the ids there")
    } else {
        format!("{named}: {what}, so nothing was changed; `list` shows the ids there")
    }
}

impl CliError {
    /// The sysexits code the command exits with.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::CertWithoutKey
            | CliError::CertWithoutCa
            | CliError::Token
            | CliError::Url { .. }
            | CliError::Address { .. }
            | CliError::NoSelection { .. } => exit::USAGE,
            CliError::File { .. } | CliError::NotFound { .. } => exit::NO_INPUT,
            CliError::NoSidecar { .. } => exit::UNAVAILABLE,
            CliError::Protocol { .. } => exit::PROTOCOL,
            CliError::Refused { status, .. } => match status.code() {
                Code::PermissionDenied | Code::Unauthenticated => exit::NO_PERMISSION,
                Code::Unavailable | Code::DeadlineExceeded => exit::UNAVAILABLE,
                Code::InvalidArgument => exit::USAGE,
                Code::NotFound => exit::NO_INPUT,
                _ => exit::FAILURE,
            },
            CliError::Stopped { cause, .. } => cause.exit_code(),
            CliError::RedriveRefused { .. } => exit::FAILURE,
        }
    }
}

/// What the command knew of the connection when a call on it failed.
#[derive(Clone, Copy, Debug)]
struct Link {
    /// TLS (--tls-ca given).
    tls: bool,
    /// A client certificate (--tls-cert given).
    cert: bool,
    /// A call on it was answered before: it spoke gRPC, so a closed connection is a sidecar
    /// that went away, not one that speaks something else.
    answered: bool,
}

/// Why a connection or a call failed on the way, when it did not reach the sidecar's service:
/// `Ok` a sidecar that is not there, `Err` one that speaks another protocol. `None` when
/// nothing in `err`'s chain says so.
fn transport_failure(
    err: &(dyn std::error::Error + 'static),
    link: Link,
) -> Option<Result<String, String>> {
    let mut chain = Vec::new();
    let mut next = Some(err);
    let mut dropped = false;
    while let Some(e) = next {
        if let Some(tls) = rustls_error(e) {
            return Some(Err(tls_failure(tls)));
        }
        if let Some(why) = tls_text(&e.to_string()) {
            return Some(Err(why));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let why = match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::TimedOut => "no answer within 5 s".to_owned(),
                std::io::ErrorKind::NotFound => "no such socket file".to_owned(),
                std::io::ErrorKind::PermissionDenied => {
                    "the socket file may not be opened by this user".to_owned()
                }
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => {
                    chain.push(io.to_string());
                    dropped = true;
                    break;
                }
                _ if io.to_string().contains("lookup address") => {
                    format!("its host name does not resolve: {io}")
                }
                _ => io.to_string(),
            };
            return Some(Ok(why));
        }
        chain.push(e.to_string());
        next = e.source();
    }
    let text = chain.join(": ");
    if text.contains("dns error") {
        return Some(Ok(format!("its host name does not resolve: {text}")));
    }
    if text.contains("timed out") {
        return Some(Ok("no answer within 5 s".to_owned()));
    }
    let closed = dropped
        || ["connection closed", "connection reset", "broken pipe"]
            .iter()
            .any(|word| text.contains(word));
    if link.answered && (closed || text.contains("http2 error")) {
        return Some(Ok(format!("it went away during the call: {text}")));
    }
    if text.contains("http2 error") && !link.tls {
        // A TLS listener answers HTTP/2 in clear with a TLS alert, which is no HTTP/2 frame.
        return Some(Err(format!(
            "does not answer as a plaintext gRPC server ({text}): it likely speaks TLS, so give its CA with --tls-ca (WINDOW_SIDECAR_TLS_CA)"
        )));
    }
    if closed {
        return Some(Err(match (link.tls, link.cert) {
            (false, _) => format!(
                "closed the connection at its first bytes ({text}): it likely speaks TLS, so give its CA with --tls-ca (WINDOW_SIDECAR_TLS_CA)"
            ),
            // TLS 1.3 finishes the client's handshake before the server checks its
            // certificate: a sidecar that requires one closes the connection then.
            (true, false) => format!(
                "closed the TLS connection after the handshake ({text}): it requires a client certificate (mutual TLS), so give --tls-cert and --tls-key"
            ),
            (true, true) => format!(
                "closed the TLS connection after the handshake ({text}): it does not accept the client certificate of --tls-cert (is it signed by the sidecar's --tls-client-ca?)"
            ),
        }));
    }
    (!chain.is_empty()).then_some(Ok(text))
}

/// The TLS error `err` is or wraps: `io::Error`'s `source()` skips the error it wraps, so
/// each wrapped one is looked into.
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let io = err.downcast_ref::<std::io::Error>()?;
    rustls_error(io.get_ref()?)
}

/// A TLS failure as rustls words it, where the error came as text (an I/O error that wraps
/// it by its message).
fn tls_text(message: &str) -> Option<String> {
    const CLIENT_CERT_REFUSED: [&str; 3] = ["BadCertificate", "UnknownCA", "CertificateUnknown"];
    let alert = message.strip_prefix("received fatal alert: ");
    Some(match alert {
        Some("CertificateRequired" | "HandshakeFailure") => {
            "requires a client certificate (mutual TLS), so give --tls-cert and --tls-key"
                .to_owned()
        }
        Some(alert) if CLIENT_CERT_REFUSED.contains(&alert) => CLIENT_CERT_REFUSED_WHY.to_owned(),
        Some(alert) => format!("failed the TLS handshake: it sent the alert {alert}"),
        None if message.starts_with("invalid peer certificate") => format!(
            "presented a certificate that --tls-ca does not accept ({message}): give the CA that signed the sidecar's --tls-cert, for the name in --sidecar"
        ),
        None if message.contains("corrupt message") => NOT_TLS.to_owned(),
        None => return None,
    })
}

const NOT_TLS: &str = "does not speak TLS (it answered a TLS handshake with something else): drop --tls-ca (WINDOW_SIDECAR_TLS_CA), or start the sidecar with --tls-cert";
const CLIENT_CERT_REFUSED_WHY: &str = "refused the client certificate of --tls-cert: it is not signed by the sidecar's --tls-client-ca";

fn tls_failure(err: &rustls::Error) -> String {
    use rustls::{AlertDescription, Error};
    match err {
        Error::InvalidMessage(_) => NOT_TLS.to_owned(),
        Error::InvalidCertificate(why) => format!(
            "presented a certificate that --tls-ca does not accept ({why:?}): give the CA that signed the sidecar's --tls-cert, for the name in --sidecar"
        ),
        Error::AlertReceived(AlertDescription::CertificateRequired)
        | Error::AlertReceived(AlertDescription::HandshakeFailure) => {
            "requires a client certificate (mutual TLS), so give --tls-cert and --tls-key"
                .to_owned()
        }
        Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown,
        ) => CLIENT_CERT_REFUSED_WHY.to_owned(),
        other => format!("failed the TLS handshake: {other}"),
    }
}

/// A call's failure: where the call did not reach the sidecar's service, what kept it;
/// otherwise what the sidecar answered.
fn call_failed(
    addr: &str,
    link: Link,
    action: &'static str,
    target: &Target,
    status: tonic::Status,
) -> CliError {
    let from_transport = status
        .source()
        .and_then(|source| transport_failure(source, link))
        .or_else(|| {
            // A status tonic made itself, without the error it made it from.
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Internal
            )
            .then(|| status.message())
            .filter(|m| m.contains("transport error") || m.contains("h2 protocol error"))
            .map(|m| Ok(format!("the connection failed: {m}")))
        });
    match from_transport {
        Some(Ok(why)) => CliError::NoSidecar {
            addr: addr.to_owned(),
            why,
        },
        Some(Err(why)) => CliError::Protocol {
            addr: addr.to_owned(),
            why,
        },
        None => CliError::Refused {
            addr: addr.to_owned(),
            action,
            target: target.clone(),
            status,
        },
    }
}

/// Prints what is written, as it is written: a line is on stdout once its work is done.
fn emit(out: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
}

/// How many dead letters one redrive call carries: a tenth of a second's worth at `rate`
/// (one call when it is as fast as Redis answers: a hundred at most).
fn batch_size(rate: u32) -> usize {
    match rate {
        0 => MAX_BATCH,
        rate => (rate as usize / 10).clamp(1, MAX_BATCH),
    }
}

/// Why a redrive plan entry is not sent: it says no origin and no --to was given.
const NO_ORIGIN: &str = "it does not say where it came from (no x-window-subscription header, as ruststream-fred's dead letters); redrive it with --to KEY";

/// Why a dead letter was not redriven, in the command's terms: the service names its own
/// field (`to`) where the command has --to.
fn skipped_text(r: &proto::Redriven) -> String {
    if r.to.is_empty() && !r.skipped.is_empty() {
        NO_ORIGIN.to_owned()
    } else if r.skipped.starts_with(REDRIVE_NOT_REENTERED) {
        r.skipped.replace("`to`", "--to")
    } else {
        r.skipped.clone()
    }
}

/// Where a redriven dead letter went: `back into group billing of orders as 1-0` (its
/// original entry, pending in its group again) or `to orders:replay as 2-0` (a copy).
fn where_to(r: &proto::Redriven) -> String {
    let to = if r.group.is_empty() {
        format!("to {}", r.to)
    } else {
        format!("back into group {} of {}", r.group, r.to)
    };
    if r.new_id.is_empty() {
        to
    } else {
        format!("{to} as {}", r.new_id)
    }
}

/// What a redrive printed so far, and the counts of its summary.
struct Redrives {
    json: bool,
    dry_run: bool,
    moved: usize,
    refused: usize,
}

impl Redrives {
    fn line(&mut self, r: &proto::Redriven, out: &mut String) {
        let was_refused = r.skipped.starts_with(REDRIVE_REFUSED);
        self.refused += usize::from(was_refused);
        let skipped = skipped_text(r);
        let skipped = skipped.as_str();
        let verb = if self.dry_run {
            "would redrive"
        } else {
            "redrove"
        };
        if skipped.is_empty() {
            self.moved += 1;
        }
        if self.json {
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({"id": r.id, "to": r.to, "group": r.group, "new_id": r.new_id, "skipped": skipped, "refused": was_refused, "dry_run": self.dry_run})
            );
        } else if was_refused {
            let _ = writeln!(out, "refused {}: {skipped}", r.id);
        } else if skipped.is_empty() {
            let _ = writeln!(out, "{verb} {} {}", r.id, where_to(r));
        } else {
            let _ = writeln!(out, "skipped {}: {skipped}", r.id);
        }
    }
}

impl DeadLettersCli {
    /// Runs the command; prints its results on stdout as they come.
    pub async fn run(self) -> Result<(), CliError> {
        // What the command line alone decides fails before any call, as a usage error.
        match &self.action {
            Action::Redrive { target, select, .. } => select.required("redrive", target)?,
            Action::Purge { target, select, .. } => select.required("purge", target)?,
            Action::List { .. } | Action::Show { .. } => {}
        }
        let mut client = self.connect().await?;
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
                    .map_err(|s| self.failed("list", target, false, s))?
                    .into_inner();
                let mut out = String::new();
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
                emit(&out);
            }
            Action::Show { target, id } => {
                let found = self
                    .find(&mut client, "show", target, std::slice::from_ref(id))
                    .await?;
                let letter = found.first().ok_or_else(|| CliError::NotFound {
                    flag: "",
                    ids: vec![id.clone()],
                    target: target.clone(),
                })?;
                if self.json {
                    emit(&format!("{}\n", letter_json(letter)));
                } else {
                    emit(&letter_text(letter));
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
                self.ids_there(&mut client, "redrive", target, &select.ids)
                    .await?;
                self.redrive(&mut client, target, select, to, *dry_run, *rate, *limit)
                    .await?;
            }
            Action::Purge {
                target,
                select,
                dry_run,
                limit,
            } => {
                self.ids_there(&mut client, "purge", target, &select.ids)
                    .await?;
                let done = client
                    .purge_dead_letters(self.request(proto::PurgeDeadLettersRequest {
                        target: target.message(),
                        selection: Some(select.message()),
                        dry_run: *dry_run,
                        limit: *limit,
                    })?)
                    .await
                    .map_err(|s| self.failed("purge", target, !select.ids.is_empty(), s))?
                    .into_inner();
                let (verb, summary) = if done.dry_run {
                    ("would purge", "would be purged (dry run)")
                } else {
                    ("purged", "purged")
                };
                let mut out = String::new();
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
                emit(&out);
            }
        }
        Ok(())
    }

    /// The dead letters `ids` name (a list id that moved is found by its digest).
    async fn find(
        &self,
        client: &mut DeadLetterServiceClient<Channel>,
        action: &'static str,
        target: &Target,
        ids: &[String],
    ) -> Result<Vec<DeadLetterEntry>, CliError> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_LIST as usize) {
            let listed = client
                .list_dead_letters(self.request(proto::ListDeadLettersRequest {
                    target: target.message(),
                    selection: Some(proto::DeadLetterSelection {
                        ids: chunk.to_vec(),
                        ..Default::default()
                    }),
                    limit: chunk.len() as u32,
                })?)
                .await
                .map_err(|s| self.failed(action, target, false, s))?
                .into_inner();
            found.extend(listed.dead_letters);
        }
        Ok(found)
    }

    /// Fails, before anything changes, when an `--id` given names no dead letter of `target`:
    /// otherwise a mistyped id would choose nothing and the command would succeed.
    async fn ids_there(
        &self,
        client: &mut DeadLetterServiceClient<Channel>,
        action: &'static str,
        target: &Target,
        ids: &[String],
    ) -> Result<(), CliError> {
        if ids.is_empty() {
            return Ok(());
        }
        let found = self.find(client, action, target, ids).await?;
        let mut missing: Vec<String> = Vec::new();
        for id in ids {
            if !found.iter().any(|l| same_id(id, &l.id)) && !missing.contains(id) {
                missing.push(id.clone());
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CliError::NotFound {
                flag: "--id ",
                ids: missing,
                target: target.clone(),
            })
        }
    }

    /// A redrive: one dry run of the whole selection first (it chooses the dead letters and
    /// checks every destination against the sidecar's --allow-keys before anything moves),
    /// then those dead letters by id in batches of a tenth of a second's worth at `rate`, each
    /// printed as its batch returns.
    #[expect(clippy::too_many_arguments, reason = "the redrive's flags, one each")]
    async fn redrive(
        &self,
        client: &mut DeadLetterServiceClient<Channel>,
        target: &Target,
        select: &Select,
        to: &Option<String>,
        dry_run: bool,
        rate: u32,
        limit: u32,
    ) -> Result<(), CliError> {
        let to = to.clone().unwrap_or_default();
        let plan = client
            .redrive_dead_letters(self.request(proto::RedriveDeadLettersRequest {
                target: target.message(),
                selection: Some(select.message()),
                to: to.clone(),
                dry_run: true,
                per_second: 0,
                limit,
            })?)
            .await
            .map_err(|s| self.failed("redrive", target, !select.ids.is_empty(), s))?
            .into_inner()
            .redriven;
        let mut report = Redrives {
            json: self.json,
            dry_run,
            moved: 0,
            refused: 0,
        };
        let summary = |report: &Redrives, out: &mut String| {
            if !self.json {
                let what = if dry_run {
                    "would be redriven (dry run)"
                } else {
                    "redriven"
                };
                let _ = writeln!(
                    out,
                    "{} of {} dead letters {what}",
                    report.moved,
                    plan.len()
                );
            }
        };
        if dry_run {
            let mut out = String::new();
            for r in &plan {
                report.line(r, &mut out);
            }
            summary(&report, &mut out);
            emit(&out);
            return Ok(());
        }
        // The places (from the oldest) of the list dead letters gone so far, as the plan
        // named them: each moves the ones after it one place down.
        let mut gone: Vec<usize> = Vec::new();
        for batch in plan.chunks(batch_size(rate)) {
            let started = tokio::time::Instant::now();
            let ids: Vec<String> = batch
                .iter()
                .filter(|r| !r.to.is_empty())
                .map(|r| moved_down(&r.id, &gone))
                .collect();
            let mut done = Vec::new();
            if !ids.is_empty() {
                let answer = client
                    .redrive_dead_letters(self.request(proto::RedriveDeadLettersRequest {
                        target: target.message(),
                        selection: Some(proto::DeadLetterSelection {
                            ids: ids.clone(),
                            ..Default::default()
                        }),
                        to: to.clone(),
                        dry_run: false,
                        per_second: rate,
                        limit: ids.len() as u32,
                    })?)
                    .await;
                done = match answer {
                    Ok(answer) => answer.into_inner().redriven,
                    Err(status) => {
                        return Err(CliError::Stopped {
                            cause: Box::new(self.failed("redrive", target, true, status)),
                            done: report.moved,
                            chosen: plan.len(),
                            spec: spec(target),
                        });
                    }
                };
            }
            let mut out = String::new();
            for planned in batch {
                if planned.to.is_empty() {
                    report.line(planned, &mut out);
                    continue;
                }
                // A list id that moved comes back under its new place, found by its digest.
                let place = list_digest(&planned.id).map(|(place, _)| place);
                match done.iter().position(|r| same_id(&planned.id, &r.id)) {
                    Some(at) => {
                        let r = done.remove(at);
                        // Redriven, or gone already; a refused one stays in place.
                        if !r.skipped.starts_with(REDRIVE_REFUSED) {
                            gone.extend(place);
                        }
                        report.line(&r, &mut out);
                    }
                    None => {
                        gone.extend(place);
                        report.line(
                            &proto::Redriven {
                                id: planned.id.clone(),
                                to: planned.to.clone(),
                                skipped: "it was no longer there (redriven or purged meanwhile)"
                                    .into(),
                                ..Default::default()
                            },
                            &mut out,
                        );
                    }
                }
            }
            emit(&out);
            // The sidecar paces within a call; between calls the next must not start early.
            if rate > 0 {
                let span = Duration::from_secs(ids.len() as u64) / rate;
                tokio::time::sleep_until(started + span).await;
            }
        }
        let mut out = String::new();
        summary(&report, &mut out);
        emit(&out);
        if report.refused > 0 {
            return Err(CliError::RedriveRefused {
                refused: report.refused,
                chosen: plan.len(),
                target: target.clone(),
            });
        }
        Ok(())
    }

    /// What failed a call; `answered`: an earlier call on this connection was answered.
    fn failed(
        &self,
        action: &'static str,
        target: &Target,
        answered: bool,
        status: tonic::Status,
    ) -> CliError {
        let link = Link {
            tls: self.tls_ca.is_some(),
            cert: self.tls_cert.is_some(),
            answered,
        };
        call_failed(&self.sidecar, link, action, target, status)
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
        let addr = self.sidecar.clone();
        let link = Link {
            tls: self.tls_ca.is_some(),
            cert: self.tls_cert.is_some(),
            answered: false,
        };
        let failed = |err: tonic::transport::Error| match transport_failure(&err, link) {
            Some(Err(why)) => CliError::Protocol {
                addr: addr.clone(),
                why,
            },
            Some(Ok(why)) => CliError::NoSidecar {
                addr: addr.clone(),
                why,
            },
            None => CliError::NoSidecar {
                addr: addr.clone(),
                why: err.to_string(),
            },
        };
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| CliError::File {
                flag,
                path: path.clone(),
                source,
            })
        };
        let channel = if let Some(path) = self.sidecar.strip_prefix("unix:") {
            crate::grpc::connect_unix(path).await.map_err(failed)?
        } else {
            check_address(&self.sidecar, self.tls_ca.is_some())?;
            let scheme = if self.tls_ca.is_some() {
                "https"
            } else {
                "http"
            };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.sidecar))
                .map_err(|e| CliError::Address {
                    addr: self.sidecar.clone(),
                    why: e
                        .source()
                        .map_or_else(|| e.to_string(), ToString::to_string),
                })?
                .connect_timeout(Duration::from_secs(5));
            if let Some(ca) = &self.tls_ca {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?));
                match (&self.tls_cert, &self.tls_key) {
                    (Some(cert), Some(key)) => {
                        tls = tls.identity(Identity::from_pem(
                            read("--tls-cert", cert)?,
                            read("--tls-key", key)?,
                        ));
                    }
                    (None, None) => {}
                    _ => return Err(CliError::CertWithoutKey),
                }
                endpoint = endpoint.tls_config(tls).map_err(|e| CliError::Protocol {
                    addr: self.sidecar.clone(),
                    why: format!("cannot be reached with this TLS configuration: {e}"),
                })?;
            } else if self.tls_cert.is_some() || self.tls_key.is_some() {
                return Err(CliError::CertWithoutCa);
            }
            endpoint.connect().await.map_err(failed)?
        };
        Ok(DeadLetterServiceClient::new(channel))
    }
}

/// `host:port` as --sidecar takes it, not a URL: `http://` would otherwise become part of the
/// host name and fail as a name that does not resolve.
fn check_address(addr: &str, tls: bool) -> Result<(), CliError> {
    if let Some((scheme, rest)) = addr.split_once("://") {
        let bare = rest.trim_end_matches('/').to_owned();
        let tls = match (scheme, tls) {
            ("https", false) => "; for TLS give the sidecar's CA with --tls-ca",
            _ => "",
        };
        return Err(CliError::Url {
            addr: addr.to_owned(),
            bare,
            tls,
        });
    }
    if !addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
    }) {
        return Err(CliError::Address {
            addr: addr.to_owned(),
            why: "it needs a port, as 127.0.0.1:50051".to_owned(),
        });
    }
    Ok(())
}

/// A list dead letter's id with its place moved down past the dead letters before it that are
/// gone (`gone`: their places as first listed), so that the sidecar finds it at its place
/// rather than by its digest through the whole list; other ids as they are.
fn moved_down(id: &str, gone: &[usize]) -> String {
    match list_digest(id) {
        Some((place, digest)) => {
            let before = gone.iter().filter(|g| **g < place).count();
            format!("{}:{digest:016x}", place - before)
        }
        None => id.to_owned(),
    }
}

/// `stream:orders:dead`, as the command takes it.
fn spec(target: &Target) -> String {
    match &target.0 {
        TargetKind::Stream(key) => format!("stream:{key}"),
        TargetKind::List(key) => format!("list:{key}"),
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

    #[test]
    fn an_address_is_host_and_port_not_a_url() {
        assert!(check_address("127.0.0.1:50051", false).is_ok());
        assert!(check_address("[::1]:50051", false).is_ok());
        let url = check_address("http://127.0.0.1:50051/", false).unwrap_err();
        assert_eq!(url.exit_code(), exit::USAGE);
        assert!(
            url.to_string()
                .contains("write host:port (\"127.0.0.1:50051\")"),
            "{url}"
        );
        let https = check_address("https://sidecar:443", false).unwrap_err();
        assert!(https.to_string().contains("--tls-ca"), "{https}");
        let bare = check_address("127.0.0.1", false).unwrap_err();
        assert!(bare.to_string().contains("needs a port"), "{bare}");
    }

    #[test]
    fn a_batch_is_a_tenth_of_a_second_at_the_rate() {
        assert_eq!(batch_size(0), MAX_BATCH);
        assert_eq!(batch_size(1), 1);
        assert_eq!(batch_size(100), 10);
        assert_eq!(batch_size(300), 30);
        assert_eq!(batch_size(1_000_000), MAX_BATCH);
    }

    #[test]
    fn tls_failures_say_which_side_to_change() {
        let required = tls_text("received fatal alert: CertificateRequired").unwrap();
        assert!(required.contains("--tls-cert and --tls-key"), "{required}");
        let refused = tls_text("received fatal alert: UnknownCA").unwrap();
        assert!(refused.contains("--tls-client-ca"), "{refused}");
        assert!(tls_text("connection refused").is_none());
        let not_tls = tls_failure(&rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert!(not_tls.contains("does not speak TLS"), "{not_tls}");
    }

    #[test]
    fn each_failure_exits_with_its_sysexits_code() {
        let target: Target = "stream:orders:dead".parse().unwrap();
        let refused = |code| CliError::Refused {
            addr: "a:1".into(),
            action: "redrive",
            target: target.clone(),
            status: tonic::Status::new(code, "no"),
        };
        assert_eq!(refused(Code::PermissionDenied).exit_code(), 77);
        assert_eq!(refused(Code::Unauthenticated).exit_code(), 77);
        assert_eq!(refused(Code::Unavailable).exit_code(), 69);
        assert_eq!(refused(Code::FailedPrecondition).exit_code(), 1);
        let missing = CliError::NotFound {
            flag: "--id ",
            ids: vec!["999-0".into()],
            target: target.clone(),
        };
        assert_eq!(missing.exit_code(), 66);
        assert!(
            missing
                .to_string()
                .starts_with("--id 999-0: no dead letter 999-0 in stream orders:dead"),
            "{missing}"
        );
        let stopped = CliError::Stopped {
            cause: Box::new(CliError::NoSidecar {
                addr: "a:1".into(),
                why: "connection refused".into(),
            }),
            done: 3,
            chosen: 9,
            spec: spec(&target),
        };
        assert_eq!(stopped.exit_code(), 69);
        assert!(
            stopped.to_string().contains("list stream:orders:dead"),
            "{stopped}"
        );
    }

    #[test]
    fn a_redrive_line_says_which_group_got_the_entry_back_and_names_the_flag() {
        let back = proto::Redriven {
            id: "9-0".into(),
            to: "orders".into(),
            new_id: "1-0".into(),
            group: "billing".into(),
            ..Default::default()
        };
        assert_eq!(where_to(&back), "back into group billing of orders as 1-0");
        let copy = proto::Redriven {
            group: String::new(),
            to: "orders:replay".into(),
            new_id: "2-0".into(),
            ..back.clone()
        };
        assert_eq!(where_to(&copy), "to orders:replay as 2-0");
        let trimmed = proto::Redriven {
            skipped: format!(
                "{REDRIVE_NOT_REENTERED} alone: …; redrive it with `to` naming a stream"
            ),
            new_id: String::new(),
            ..back
        };
        assert!(
            skipped_text(&trimmed).ends_with("redrive it with --to naming a stream"),
            "{}",
            skipped_text(&trimmed)
        );
        let no_origin = proto::Redriven {
            id: "3-0".into(),
            skipped: "no origin; redrive it with `to`".into(),
            ..Default::default()
        };
        assert_eq!(skipped_text(&no_origin), NO_ORIGIN);
    }

    #[test]
    fn a_list_id_moves_down_past_the_dead_letters_gone_before_it() {
        let id = |place: usize| format!("{place}:00000000000000ff");
        assert_eq!(moved_down(&id(7), &[]), id(7));
        assert_eq!(moved_down(&id(7), &[2, 5, 9]), id(5));
        assert_eq!(moved_down("1796193140954-0", &[2]), "1796193140954-0");
    }
}
