//! The `window-sidecar` command line: the sidecar's flags ([`Config`]) when it runs as the
//! sidecar, and its subcommands, `dead-letters` (a client of a running sidecar) and
//! `completions` (a shell's completion script, from this very definition).

pub mod dead_letters;
pub mod exit;

use clap::{CommandFactory, Parser, Subcommand};
use clap_complete::Shell;

use crate::config::Config;
use dead_letters::DeadLettersCli;

/// The binary's name, as the completion scripts complete it.
pub const BIN: &str = "window-sidecar";

/// The sidecar (no subcommand), or one of its subcommands.
#[derive(Parser)]
#[command(
    name = BIN,
    version,
    about,
    after_help = exit::SIDECAR_HELP,
    args_conflicts_with_subcommands = true,
    subcommand_value_name = "COMMAND",
    subcommand_help_heading = "Commands (instead of running the sidecar)"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Inspect, redrive and purge the dead letters of a stream or list through a running
    /// sidecar.
    DeadLetters(Box<DeadLettersCli>),
    /// Print the completion script of a shell on stdout.
    #[command(after_help = COMPLETIONS_HELP)]
    Completions {
        /// The shell.
        shell: Shell,
    },
}

const COMPLETIONS_HELP: &str = "\
Install:
  bash  window-sidecar completions bash > /etc/bash_completion.d/window-sidecar
  zsh   window-sidecar completions zsh > \"${fpath[1]}/_window-sidecar\"
  fish  window-sidecar completions fish > ~/.config/fish/completions/window-sidecar.fish";

/// The completion script of `shell` for every flag and subcommand. Built whole before it is
/// written: clap_complete panics on a write error, and a reader that stops early (`| head`)
/// is no error.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut script);
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_sound_and_names_every_command() {
        Cli::command().debug_assert();
        let help = Cli::command().render_help().to_string();
        for word in ["dead-letters", "completions", "Exit codes", "64"] {
            assert!(help.contains(word), "{word}: {help}");
        }
    }

    #[test]
    fn completions_cover_the_subcommands_and_their_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).unwrap();
            for word in ["dead-letters", "redrive", "older-than", "redis-url"] {
                assert!(script.contains(word), "{shell}: {word}");
            }
        }
    }

    #[test]
    fn a_subcommand_is_not_mixed_with_the_sidecars_flags() {
        let parsed = Cli::try_parse_from([BIN, "dead-letters", "list", "stream:d"]).unwrap();
        assert!(matches!(parsed.command, Some(Command::DeadLetters(_))));
        assert!(Cli::try_parse_from([BIN, "--dev", "dead-letters", "list", "stream:d"]).is_err());
        let parsed = Cli::try_parse_from([BIN, "--dev"]).unwrap();
        assert!(parsed.command.is_none() && parsed.config.dev);
    }
}
