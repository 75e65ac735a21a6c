//! Admission of what a client asks a subscription to write: the operator's policy applied to
//! each queued command and its keys (from the server's own command table), and on a cluster
//! where each command must run. In atomic mode every key must share the subscription's slot
//! (the transaction runs on that node, with the settle); a key elsewhere is refused before
//! anything is sent. The same rule checks, when a subscription opens, that everything it
//! writes with its settles (delay set, companion keys, dead letter) shares its key's slot.

use bytes::Bytes;
use fred::util::redis_keyslot;
use thiserror::Error;

use super::KeySpecs;
use super::hash_tag;
use crate::domain::{Mode, Source};
use crate::policy::Policy;
use crate::redis::flush::Settling;
use crate::redis::form::Form;
use crate::window::{Command, CommandError};

/// A subscription whose own keys cannot be written atomically with its settles on a cluster.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "on a cluster, {name:?} must be in the hash slot of {key:?} ({slot}) to be written atomically with its settles, but it is in slot {name_slot}; use a key with a hash tag, such as \"{{{tag}}}\" for the subscription and \"{{{tag}}}:dead\" for its dead letter"
)]
pub struct SlotMismatch {
    pub name: String,
    pub name_slot: u16,
    pub key: String,
    pub slot: u16,
    pub tag: String,
}

/// What admitting a subscription's commands depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admission<'a> {
    pub key_specs: &'a KeySpecs,
    pub policy: &'a Policy,
    pub cluster: bool,
    pub mode: Mode,
    pub form: &'a Form,
    pub source: &'a Source,
}

impl Admission<'_> {
    /// Applies the policy to a command and, on a cluster, finds where it must run.
    pub(crate) fn admit(&self, mut command: Command) -> Result<Command, CommandError> {
        let (full_name, info) = self.key_specs.lookup(&command.name, &command.args)?;
        let refused = |source| CommandError::Policy {
            command: command.name.clone(),
            source,
        };
        self.policy
            .check_command(&full_name, info.categories(), &command.args)
            .map_err(refused)?;
        info.check_arity(&command.name, &full_name, &command.args)?;
        // The keys matter to a key policy and to a cluster's routing; a single node with any
        // key allowed (the usual side effect) needs none of them.
        if !self.cluster && self.policy.allows_any_key() {
            return Ok(command);
        }
        let keys = info.keys(&command.args);
        for key in &keys {
            self.policy.check_key(key).map_err(refused)?;
        }
        if !self.cluster {
            return Ok(command);
        }
        match self.mode {
            Mode::Atomic => {
                command.keys = keys.iter().map(|&k| k.clone()).collect();
                let Some(slot) = self.form.slot() else {
                    // Pub/sub has no key: a transaction goes to the node of its first key.
                    command.hash_slot = keys.first().map(|k| redis_keyslot(k));
                    return Ok(command);
                };
                if let Some(key) = keys.iter().find(|k| redis_keyslot(k) != slot) {
                    let (subscription_key, _, _) = self.source.describe();
                    let tag = hash_tag(&subscription_key)
                        .unwrap_or(&subscription_key)
                        .to_owned();
                    return Err(CommandError::CrossSlot {
                        command: command.name.clone(),
                        key: String::from_utf8_lossy(key).into_owned(),
                        key_slot: redis_keyslot(key),
                        subscription_key,
                        subscription_slot: slot,
                        tag,
                    });
                }
                command.hash_slot = Some(slot);
            }
            Mode::Pipeline => command.hash_slot = keys.first().map(|k| redis_keyslot(k)),
        }
        Ok(command)
    }
}

/// On a cluster, everything a subscription writes atomically must share the slot of its key:
/// refuse to open otherwise, with the fix.
pub(crate) fn check_cluster_slots(
    cluster: bool,
    source: &Source,
    form: &Form,
    dead_letter: Option<&str>,
) -> Result<(), SlotMismatch> {
    if !cluster {
        return Ok(());
    }
    let Some(slot) = form.slot() else {
        return Ok(());
    };
    let (key, _, _) = source.describe();
    let mut names: Vec<Bytes> = vec![form.delayed().clone()];
    if let Form::List(keys) = form {
        names.extend(keys.companions().into_iter().cloned());
    }
    if let Some(target) = dead_letter {
        names.push(Bytes::copy_from_slice(target.as_bytes()));
    }
    match names.iter().find(|name| redis_keyslot(name) != slot) {
        Some(name) => Err(SlotMismatch {
            name: String::from_utf8_lossy(name).into_owned(),
            name_slot: redis_keyslot(name),
            tag: hash_tag(&key).unwrap_or(&key).to_owned(),
            key,
            slot,
        }),
        None => Ok(()),
    }
}
