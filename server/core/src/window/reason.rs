//! Why a slot's command or outcome was refused: the one classification of [`SlotError`]. The
//! wire's rejection reason and the rejection metric's label are both read from it, so the
//! client and the dashboard can never disagree on what happened.

use super::{CommandError, SlotError};

/// The reason of a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    UnknownSlot,
    AlreadySettled,
    InvalidCommand,
    ForbiddenCommand,
    InvalidOutcome,
    IncompleteSegment,
    CrossSlot,
    PermissionDenied,
    LimitExceeded,
}

impl Reason {
    /// Every reason, for series that must exist before the first refusal.
    pub const ALL: [Reason; 9] = [
        Reason::UnknownSlot,
        Reason::AlreadySettled,
        Reason::InvalidCommand,
        Reason::ForbiddenCommand,
        Reason::InvalidOutcome,
        Reason::IncompleteSegment,
        Reason::CrossSlot,
        Reason::PermissionDenied,
        Reason::LimitExceeded,
    ];

    /// The metric label (the wire's name without its `REJECTION_REASON_` prefix, lower case).
    pub fn label(self) -> &'static str {
        match self {
            Reason::UnknownSlot => "unknown_slot",
            Reason::AlreadySettled => "already_settled",
            Reason::InvalidCommand => "invalid_command",
            Reason::ForbiddenCommand => "forbidden_command",
            Reason::InvalidOutcome => "invalid_outcome",
            Reason::IncompleteSegment => "incomplete_segment",
            Reason::CrossSlot => "cross_slot",
            Reason::PermissionDenied => "permission_denied",
            Reason::LimitExceeded => "limit_exceeded",
        }
    }
}

impl SlotError {
    /// Why it was refused.
    pub fn reason(&self) -> Reason {
        match self {
            SlotError::UnknownSlot(_) => Reason::UnknownSlot,
            SlotError::AlreadySettled(_) => Reason::AlreadySettled,
            SlotError::InvalidCommand { source, .. } => match source {
                CommandError::Forbidden { .. } => Reason::ForbiddenCommand,
                CommandError::InvalidName(_)
                | CommandError::EmptyName
                | CommandError::Unknown(_)
                | CommandError::Arity { .. } => Reason::InvalidCommand,
                CommandError::CrossSlot { .. } => Reason::CrossSlot,
                CommandError::Policy { source, .. } if source.is_limit() => Reason::LimitExceeded,
                CommandError::Policy { .. } => Reason::PermissionDenied,
            },
            SlotError::TooManyCommands { .. } => Reason::LimitExceeded,
            SlotError::InvalidOutcome { .. } => Reason::InvalidOutcome,
            SlotError::IncompleteSegment(_) => Reason::IncompleteSegment,
        }
    }

    /// The refused command's name, when a named command was refused.
    pub fn command(&self) -> Option<&str> {
        let SlotError::InvalidCommand { source, .. } = self else {
            return None;
        };
        match source {
            CommandError::EmptyName => None,
            CommandError::Forbidden { name, .. }
            | CommandError::InvalidName(name)
            | CommandError::Unknown(name) => Some(name),
            CommandError::CrossSlot { command, .. }
            | CommandError::Policy { command, .. }
            | CommandError::Arity { command, .. } => Some(command),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: std::collections::BTreeSet<_> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
    }
}
