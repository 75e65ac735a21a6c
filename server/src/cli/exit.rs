//! The codes the binary exits with, in the style of sysexits(3): a script can tell a mistake
//! in the command line (64) from a dead letter that is not there (66), a sidecar that does not
//! answer (69), one that speaks another protocol (76) and one that refuses the caller (77).

/// Done.
pub const OK: u8 = 0;
/// Failed otherwise: the sidecar could not start or stopped on an error; for `dead-letters`,
/// the sidecar or Redis refused for a reason of Redis's state (a redrive Redis refused, a purge
/// Redis stopped, keys in different cluster slots).
pub const FAILURE: u8 = 1;
/// EX_USAGE: the command line or the configuration cannot work (an unknown or malformed flag,
/// a redrive or purge that chooses nothing, an invalid setting).
pub const USAGE: u8 = 64;
/// EX_NOINPUT: what the command names is not there (a dead-letter id, a --tls-* file).
pub const NO_INPUT: u8 = 66;
/// EX_UNAVAILABLE: no sidecar answers at the address, or it went away during the call, or it
/// answers that it cannot serve now (Redis unreachable, shutting down).
pub const UNAVAILABLE: u8 = 69;
/// EX_PROTOCOL: the sidecar speaks another protocol than the command (TLS against plaintext,
/// a certificate that --tls-ca does not trust).
pub const PROTOCOL: u8 = 76;
/// EX_NOPERM: the sidecar refuses the caller (a token missing or wrong, a key outside its
/// --allow-keys).
pub const NO_PERMISSION: u8 = 77;

/// The table `--help` ends with, for the sidecar.
pub const SIDECAR_HELP: &str = "\
Exit codes (sysexits):
  0   stopped cleanly (SIGTERM or SIGINT, after the drain); --check-config: valid
  1   could not start (the listener, the runtime, --dev's redis-server) or stopped on an error
  64  the configuration cannot work (EX_USAGE): an unknown or malformed flag, an invalid
      setting, a --keep key outside --allow-keys or of another type";

/// The table `dead-letters --help` ends with.
pub const DEAD_LETTERS_HELP: &str = "\
Exit codes (sysexits):
  0   done (a dead letter skipped is no error: one that names no origin, one whose stream
      entry is no longer there to re-enter its group, one gone already)
  1   Redis refused: a redrive of a dead letter (each is listed with Redis's error), a purge,
      a redrive across cluster slots
  64  a usage error (EX_USAGE): an unknown or malformed flag or target, a redrive or purge
      without --id, --reason, --older-than or --all, --sidecar given as a URL
  66  not there (EX_NOINPUT): an id that is no dead letter of the stream or list, an
      unreadable --tls-* file
  69  no sidecar (EX_UNAVAILABLE): nothing listens at --sidecar, its host is unknown, it went
      away during the call, or it cannot serve now (Redis unreachable, shutting down)
  76  another protocol (EX_PROTOCOL): TLS against a plaintext sidecar or the other way round,
      a sidecar certificate --tls-ca does not trust
  77  refused (EX_NOPERM): the token is missing or wrong, a key is outside --allow-keys";
