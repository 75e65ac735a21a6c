//! The flush plan of a read, for every form: what the window decided (kept segments, settles
//! and their outcomes) turned into the exact commands to send. The forms supply their settle
//! and requeue commands through [`Settling`]; the shape is the same for all:
//!
//! Pipeline mode: the kept segments in commit order; then, when the read has retries, one
//! atomic step holding the requeue writes (copies, delay-set members, dead letters) and the
//! settles, so an entry is never settled without its copy: a script that writes and settles
//! only the entries still this consumer's where the form can tell ([`Settling::settle_owned`]:
//! streams and reliable lists), else a MULTI; without retries, the settles alone.
//!
//! Atomic mode: the kept segments with commands go to one script ([`SEGMENTS`]) that runs each
//! segment's commands and settles its entry only if none of them failed; the rest of the read
//! settles as in pipeline mode.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::bytes_utils::Str;
use parking_lot::RwLock;

use crate::domain::{Entry, Mode};
use crate::engine::exhausted;
use crate::window::{FlushBatch, Outcome};

/// What a planned command is for; decides what its failure means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A client's queued command.
    SideEffect,
    /// A write that makes a retry durable (a copy, a delay-set member).
    Requeue,
    /// The settle of one or more entries (XACK, LREM).
    Settle,
    /// The settle of the entries still this consumer's with their requeue writes, in one
    /// script ([`Settling::settle_owned`]): an error reply means it ran nothing; its reply
    /// says which writes failed and which entries were another consumer's.
    SettleOwned,
    /// Housekeeping whose failure loses nothing (forgetting delivery counts).
    Bookkeeping,
    /// A stream's retry kept in place ([`Settling::keep_in_place`]): its reply 0 says the entry
    /// is another consumer's now, not to be delivered again here. Refused, it loses nothing:
    /// the entry stays pending as it was.
    KeepInPlace,
    /// MULTI.
    Begin,
    /// EXEC; `settles` when the transaction carries a settle.
    Commit { settles: bool },
    /// Atomic-mode segments ([`SEGMENTS`]): each one's commands, then its entry's settle when
    /// they all succeeded. `settles` when they carry settles.
    Segments { settles: bool },
    /// The next read, sent after everything else (see [`FlushPlan::read_ahead`]).
    ReadAhead,
}

/// One command of a flush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    /// fred's string: static for the sidecar's own commands and interned for a client's (see
    /// [`command_name`]), so handing it to fred copies nothing.
    pub name: Str,
    pub args: Vec<Bytes>,
    pub role: Role,
    /// On a cluster, the hash slot whose node runs it; `None`: its first argument decides.
    pub hash_slot: Option<u16>,
}

impl Planned {
    pub(crate) fn new(name: &'static str, args: Vec<Bytes>, role: Role) -> Self {
        Self::named(Str::from_static(name), args, role)
    }

    /// The same, run on the node of `hash_slot`.
    pub(crate) fn routed(self, hash_slot: Option<u16>) -> Self {
        Self { hash_slot, ..self }
    }

    fn named(name: Str, args: Vec<Bytes>, role: Role) -> Self {
        Self {
            name,
            args,
            role,
            hash_slot: None,
        }
    }
}

/// Distinct client command names kept as static strings. Only names the Redis server's command
/// table knows get this far (admission refuses the others), a few hundred at most; the bound
/// keeps a server with an unusual table (or a module registering commands) from growing it
/// without end.
const INTERNED_NAMES: usize = 1024;

static NAMES: LazyLock<RwLock<HashSet<&'static str>>> =
    LazyLock::new(|| RwLock::new(HashSet::new()));

/// A client command's name as a fred string that costs nothing to clone: the interned static
/// copy of the name, made once per distinct name; past [`INTERNED_NAMES`] the name itself.
pub(crate) fn command_name(name: String) -> Str {
    if let Some(&known) = NAMES.read().get(name.as_str()) {
        return Str::from_static(known);
    }
    let mut names = NAMES.write();
    if let Some(&known) = names.get(name.as_str()) {
        return Str::from_static(known);
    }
    if names.len() >= INTERNED_NAMES {
        return Str::from(name);
    }
    // Leaked on purpose: at most INTERNED_NAMES names of at most 64 bytes, kept for the life
    // of the process like any static string.
    let known: &'static str = Box::leak(name.into_boxed_str());
    names.insert(known);
    Str::from_static(known)
}

/// The exact commands of one flush, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlushPlan {
    pub commands: Vec<Planned>,
    /// Side-effect commands in the plan.
    pub side_effects: usize,
    /// Entries the plan settles.
    pub settles: usize,
    /// Entries the plan moves to the dead letter.
    pub dead_lettered: usize,
    /// A read sent after the flush's commands, in the same pipeline: the subscription's next
    /// read without a round trip of its own. Not part of the flush: its reply is returned apart.
    pub read_ahead: Option<Planned>,
    /// The entries of the plan's requeue step ([`owned_step`]), in its order: how its reply's
    /// positions name the entries a refusal left pending.
    pub requeue_step: Vec<StepEntry>,
    /// The kept segments with commands, in order: whose a failed side effect was.
    pub segments: Vec<SegmentSpan>,
    /// The entries its [`Role::KeepInPlace`] commands keep, in their order: each one's slot
    /// and stream id.
    pub in_place: Vec<(u64, Bytes)>,
}

/// Where a kept segment's commands are in a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegmentSpan {
    /// The slot it was delivered in.
    pub slot: u64,
    /// Its stream entry id; empty for a list value or a message.
    pub id: Bytes,
    /// Its first command's index in [`FlushPlan::commands`]: the [`SEGMENTS`] script in atomic
    /// mode, the first of its commands in pipeline mode.
    pub first: usize,
    /// Atomic mode: its place (1-based) among the segments of that script; 0 in pipeline mode.
    pub nth: usize,
    /// What the entry is known by when it comes back: its id, or a list value as stored.
    pub key: Bytes,
}

/// An entry of a requeue step, as a refusal names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StepEntry {
    /// The slot it was delivered in; 0 for an entry dead-lettered unread.
    pub slot: u64,
    /// Its stream entry id; empty for a list value.
    pub id: Bytes,
    /// Whether it has requeue writes (a retry, a delay, a dead letter), which Redis may refuse.
    pub requeues: bool,
}

impl FlushPlan {
    pub(crate) fn push(
        &mut self,
        name: &'static str,
        args: Vec<Bytes>,
        role: Role,
        hash_slot: Option<u16>,
    ) {
        self.push_named(Str::from_static(name), args, role, hash_slot);
    }

    fn push_named(&mut self, name: Str, args: Vec<Bytes>, role: Role, hash_slot: Option<u16>) {
        if role == Role::SideEffect {
            self.side_effects += 1;
        }
        self.commands.push(Planned {
            hash_slot,
            ..Planned::named(name, args, role)
        });
    }

    /// Commands as `NAME arg arg` lines, for tests; a requeue step ([`owned_step`]) as
    /// `OWNED keys | header` and a line `ID d?: WRITE; WRITE` per entry.
    #[cfg(test)]
    pub(crate) fn render(&self) -> Vec<String> {
        let text = |a: &Bytes| String::from_utf8_lossy(a).into_owned();
        let words = |args: &[Bytes]| args.iter().map(text).collect::<Vec<_>>().join(" ");
        let line = |c: &Planned| match &c.args[..] {
            [] => c.name.to_string(),
            args => format!("{} {}", c.name, words(args)),
        };
        let mut lines = Vec::new();
        for command in &self.commands {
            if let Role::Segments { .. } = command.role {
                lines.extend(render_segments(command));
                continue;
            }
            if command.role != Role::SettleOwned {
                lines.push(line(command));
                continue;
            }
            let step = OwnedStep::decode(command);
            lines.push(format!(
                "OWNED {} | {}",
                words(&step.keys),
                words(&step.header)
            ));
            for (id, dead_letter, writes) in &step.entries {
                let mut entry = text(id);
                if *dead_letter {
                    entry += " d";
                }
                if !writes.is_empty() {
                    let writes: Vec<String> = writes.iter().map(line).collect();
                    entry = format!("{entry}: {}", writes.join("; "));
                }
                lines.push(entry);
            }
        }
        lines
    }

    /// The commands, with each requeue step's writes in its place, for tests.
    #[cfg(test)]
    pub(crate) fn writes(&self) -> Vec<Planned> {
        self.commands
            .iter()
            .flat_map(|c| match c.role {
                Role::SettleOwned => OwnedStep::decode(c)
                    .entries
                    .into_iter()
                    .flat_map(|(_, _, writes)| writes)
                    .collect(),
                _ => vec![c.clone()],
            })
            .collect()
    }
}

/// What a form writes for settles and requeues.
pub(crate) trait Settling {
    /// The hash slot of the subscription's key, where its settles and transactions run.
    fn slot(&self) -> Option<u16>;
    /// Whether entries are settled in Redis at all (streams and reliable lists).
    fn settles_in_redis(&self) -> bool;
    /// Appends the settles of `entries` (one XACK for all, one LREM each, or nothing).
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan);
    /// Appends what makes the entry come back as soon as possible.
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan);
    /// Appends what makes the entry come back at `due_ms` (Unix ms).
    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan);
    /// Appends the write of the entry to the dead-letter target.
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan);
    /// Appends housekeeping for entries settled for good (acked, dropped, dead-lettered).
    fn finished(&self, _entries: &[&Entry], _plan: &mut FlushPlan) {}
    /// Appends what counts the next delivery of an entry retried in place (it stays pending,
    /// unsettled and uncopied: every retry on a stream, an ordered list's of a keyed entry),
    /// and, for a `retry_after`, what keeps its due time, `delay` from now, where it is kept.
    fn keep_in_place(&self, _entry: &Entry, _delay: Option<Duration>, _plan: &mut FlushPlan) {}
    /// Appends, as one atomic command, each entry's requeue writes and the settle of the
    /// entries still this consumer's, leaving alone those another consumer claimed meanwhile
    /// (theirs now: a copy or dead letter written for them here would be a second one).
    /// `false` when the form cannot tell whose an entry is: the plan wraps the writes and the
    /// settles in MULTI/EXEC instead.
    fn settle_owned(&self, _requeues: &[Requeued<'_>], _plan: &mut FlushPlan) -> bool {
        false
    }
}

/// The command of a form's requeue step ([`Settling::settle_owned`]): `EVAL script` with the
/// keys (then every write's target, declared for the cluster) and, in ARGV, the length of
/// `header`, the header, then per entry its id (or value), `d` for a dead letter or `-`, its
/// number of writes, and per write `r` (the requeue itself) or `b` (bookkeeping), its length
/// and its command. The forms put an entry's bookkeeping after its requeue writes, so a
/// refused requeue write leaves the entry as it was.
pub(crate) fn owned_step(
    script: &'static str,
    slot: u16,
    mut keys: Vec<Bytes>,
    header: Vec<Bytes>,
    entries: Vec<(Bytes, bool, Vec<Planned>)>,
) -> Planned {
    for write in entries.iter().flat_map(|(_, _, writes)| writes) {
        if let Some(target) = write.args.first()
            && !keys.contains(target)
        {
            keys.push(target.clone());
        }
    }
    let mut args = vec![
        Bytes::from_static(script.as_bytes()),
        Bytes::from(keys.len().to_string()),
    ];
    args.append(&mut keys);
    args.push(Bytes::from(header.len().to_string()));
    args.extend(header);
    for (id, dead_letter, writes) in entries {
        args.extend([
            id,
            Bytes::from_static(if dead_letter { b"d" } else { b"-" }),
            Bytes::from(writes.len().to_string()),
        ]);
        for write in writes {
            let flag: &'static [u8] = if write.role == Role::Bookkeeping {
                b"b"
            } else {
                b"r"
            };
            args.push(Bytes::from_static(flag));
            args.push(Bytes::from((write.args.len() + 1).to_string()));
            args.push(Bytes::copy_from_slice(write.name.as_bytes()));
            args.extend(write.args);
        }
    }
    Planned {
        hash_slot: Some(slot),
        ..Planned::new("EVAL", args, Role::SettleOwned)
    }
}

/// The Lua half every form's requeue step script starts with. The script is declared with a
/// shebang and no flags, so Redis refuses it whole, before any of it runs, when it is out of
/// memory (`OOM`, as it does not say `allow-oom`), on a replica (`READONLY`) or while writes
/// are paused (it waits): then nothing is written and nothing settled, and every entry stays
/// this consumer's, to be read again.
///
/// `owned_step(mine, settle)` walks the entries as [`owned_step`] lays them out. For each it
/// asks `mine(id)` whether it is still this consumer's (without changing anything), runs the
/// writes of those only (`pcall`), and calls `settle(id)` for an entry whose requeue writes all
/// took effect (a form that settles them together collects them there). A refused requeue write
/// (`NOPERM`, `WRONGTYPE`, …) leaves its entry unsettled, and every later entry with requeue
/// writes untouched and unsettled too: each stays pending (or on the processing list) as it
/// was, and is delivered again. A refused bookkeeping write (a delivery count, after the
/// requeue writes it follows) loses nothing: its entry settles.
/// Entries without requeue writes (acked or dropped beside the retries) depend on no write and
/// are settled in any case.
///
/// It returns the step's reply, `{skipped, skipped dead letters, the first write error or
/// false, {the 1-based positions of the entries a refusal left unsettled}}` (see
/// [`super::FlushResult`]). A macro so that each form's script is one literal.
macro_rules! owned_step_lua {
    () => {
        r#"#!lua
local function owned_step(mine, settle)
  local skipped, skipped_dead, failure, refused, stopped = 0, 0, false, {}, false
  local i, position = 2 + ARGV[1], 0
  while i <= #ARGV do
    local id, dead, writes = ARGV[i], ARGV[i + 1] == 'd', tonumber(ARGV[i + 2])
    position = position + 1
    i = i + 3
    local first, requeues = i, 0
    for _ = 1, writes do
      if ARGV[i] == 'r' then requeues = requeues + 1 end
      i = i + 2 + tonumber(ARGV[i + 1])
    end
    if not mine(id) then
      skipped = skipped + 1
      if dead then skipped_dead = skipped_dead + 1 end
    elseif stopped and requeues > 0 then
      refused[#refused + 1] = position
    else
      local j, ok = first, true
      for _ = 1, writes do
        local required, n = ARGV[j] == 'r', tonumber(ARGV[j + 1])
        local reply = redis.pcall(unpack(ARGV, j + 2, j + 1 + n))
        if type(reply) == 'table' and reply.err then
          if not failure then failure = reply.err end
          if required then
            ok = false
            break
          end
        end
        j = j + 2 + n
      end
      if ok then
        settle(id)
      else
        stopped = true
        refused[#refused + 1] = position
      end
    end
  end
  return {skipped, skipped_dead, failure, refused}
end
"#
    };
}
pub(crate) use owned_step_lua;

/// A requeue step ([`owned_step`]) read back: its keys, its header, and per entry its id, whether
/// it is a dead letter and its writes.
#[cfg(test)]
pub(crate) struct OwnedStep {
    pub keys: Vec<Bytes>,
    pub header: Vec<Bytes>,
    pub entries: Vec<(Bytes, bool, Vec<Planned>)>,
}

#[cfg(test)]
impl OwnedStep {
    pub(crate) fn decode(planned: &Planned) -> Self {
        assert_eq!((&*planned.name, planned.role), ("EVAL", Role::SettleOwned));
        let mut args = planned.args[1..].iter().cloned();
        let number = |args: &mut dyn Iterator<Item = Bytes>| -> usize {
            std::str::from_utf8(&args.next().unwrap())
                .unwrap()
                .parse()
                .unwrap()
        };
        let n = number(&mut args);
        let keys = args.by_ref().take(n).collect();
        let n = number(&mut args);
        let header = args.by_ref().take(n).collect();
        let mut entries = Vec::new();
        while let Some(id) = args.next() {
            let dead_letter = &args.next().unwrap()[..] == b"d";
            let writes = (0..number(&mut args))
                .map(|_| {
                    let role = match &args.next().unwrap()[..] {
                        b"r" => Role::Requeue,
                        b"b" => Role::Bookkeeping,
                        flag => panic!("a write's flag is r or b, not {flag:?}"),
                    };
                    let n = number(&mut args);
                    let name = String::from_utf8(args.next().unwrap().to_vec()).unwrap();
                    let command_args = args.by_ref().take(n - 1).collect();
                    Planned::named(Str::from(name), command_args, role)
                })
                .collect();
            entries.push((id, dead_letter, writes));
        }
        Self {
            keys,
            header,
            entries,
        }
    }
}

/// An entry settled in a flush's requeue step, with the writes that requeue it (none for an
/// acked or dropped entry settled beside the retries).
#[derive(Debug)]
pub(crate) struct Requeued<'a> {
    /// The slot it was delivered in; 0 for an entry dead-lettered unread.
    pub slot: u64,
    pub entry: &'a Entry,
    pub writes: Vec<Planned>,
    pub dead_letter: bool,
}

/// What else a plan depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanContext {
    pub mode: Mode,
    /// Now, in Unix ms, for retry_after due times.
    pub now_ms: u64,
    /// Deliveries at which a retry becomes a dead letter; 0: no cap.
    pub max_deliveries: u32,
}

/// What a settle does besides settling.
enum Requeue<'a> {
    None,
    Retry(Option<&'a str>),
    RetryAfter(Option<&'a str>, Duration),
    DeadLetter(Option<&'a str>),
}

fn requeue<'a>(
    entry: &Entry,
    outcome: Outcome,
    reason: Option<&'a str>,
    ctx: &PlanContext,
) -> Requeue<'a> {
    let capped = exhausted(entry.delivery_count, ctx.max_deliveries);
    match outcome {
        Outcome::Ack | Outcome::Drop => Requeue::None,
        Outcome::DeadLetter => Requeue::DeadLetter(reason),
        Outcome::Retry | Outcome::RetryAfter(_) if capped => Requeue::DeadLetter(reason),
        Outcome::Retry => Requeue::Retry(reason),
        Outcome::RetryAfter(delay) => Requeue::RetryAfter(reason, delay),
    }
}

/// Builds the exact commands of one flush. The client's commands move from the batch into
/// the plan (its kept segments are left without commands), so a flush copies no argument.
pub(crate) fn plan_flush<E: Borrow<Entry>>(
    form: &impl Settling,
    batch: &mut FlushBatch<E>,
    ctx: &PlanContext,
) -> FlushPlan {
    let mut plan = FlushPlan::default();
    let slot = form.slot();
    let mut settled_inside = vec![false; batch.settles.len()];
    // Room for the usual: the commands (one script per kept segment in atomic mode), a settle
    // per entry (LREM), the MULTI and EXEC of the requeues.
    plan.commands
        .reserve(batch.command_count() + batch.settles.len() + 2);
    let mut segments = Segments::default();
    for segment in &mut batch.kept {
        if segment.commands.is_empty() {
            continue;
        }
        let settle = &batch.settles[segment.settle];
        let entry: &Entry = settle.entry.borrow();
        let commands = std::mem::take(&mut segment.commands);
        if ctx.mode == Mode::Atomic {
            plan.side_effects += commands.len();
            let mut settles = FlushPlan::default();
            form.settle(&[entry], &mut settles);
            form.finished(&[entry], &mut settles);
            segments.add(
                form,
                slot,
                &mut plan,
                settle.slot,
                entry,
                settles.commands,
                commands,
            );
            settled_inside[segment.settle] = true;
            continue;
        }
        plan.segments.push(SegmentSpan {
            slot: settle.slot,
            id: entry.id.clone(),
            first: plan.commands.len(),
            nth: 0,
            key: entry_key(entry),
        });
        for command in commands {
            plan.push_named(
                command_name(command.name),
                command.args,
                Role::SideEffect,
                command.hash_slot,
            );
        }
    }

    segments.close(&mut plan);
    let rest: Vec<_> = batch
        .settles
        .iter()
        .enumerate()
        .zip(&settled_inside)
        .filter(|((index, _), inside)| !**inside && !batch.in_place.contains(index))
        .map(|((_, settle), _)| {
            (
                settle.slot,
                settle.entry.borrow(),
                requeue(
                    settle.entry.borrow(),
                    settle.outcome,
                    settle.reason.as_deref(),
                    ctx,
                ),
            )
        })
        .collect();
    let requeues = rest.iter().any(|(_, _, r)| !matches!(r, Requeue::None));
    let requeued: Vec<Requeued<'_>> = rest
        .iter()
        .map(|&(slot, entry, ref action)| Requeued {
            slot,
            entry,
            writes: requeue_writes(form, entry, action, ctx),
            dead_letter: matches!(action, Requeue::DeadLetter(_)),
        })
        .collect();
    plan.dead_lettered = requeued.iter().filter(|r| r.dead_letter).count();
    if !(requeues && settle_owned(form, &requeued, &mut plan)) {
        if requeues {
            plan.push("MULTI", vec![], Role::Begin, slot);
        }
        let mut entries = Vec::with_capacity(requeued.len());
        for requeue in requeued {
            plan.commands.extend(requeue.writes);
            entries.push(requeue.entry);
        }
        if !entries.is_empty() {
            form.settle(&entries, &mut plan);
            let done: Vec<&Entry> = rest
                .iter()
                .filter(|(_, _, r)| matches!(r, Requeue::None | Requeue::DeadLetter(_)))
                .map(|(_, entry, _)| *entry)
                .collect();
            form.finished(&done, &mut plan);
        }
        if requeues {
            let settles = form.settles_in_redis();
            plan.push("EXEC", vec![], Role::Commit { settles }, slot);
        }
    }
    for &index in &batch.in_place {
        let settle = &batch.settles[index];
        let delay = match settle.outcome {
            Outcome::RetryAfter(delay) => Some(delay),
            _ => None,
        };
        let planned = plan.commands.len();
        form.keep_in_place(settle.entry.borrow(), delay, &mut plan);
        if plan.commands[planned..]
            .iter()
            .any(|c| c.role == Role::KeepInPlace)
        {
            plan.in_place
                .push((settle.slot, settle.entry.borrow().id.clone()));
        }
    }
    plan.settles = if form.settles_in_redis() {
        batch.settles.len() - batch.in_place.len()
    } else {
        0
    };
    plan
}

/// The most segments one [`SEGMENTS`] call carries: a bound on how long Redis runs one script
/// (a read of 1,000 acked deliveries is 8 calls, still in the flush's one pipeline).
const SEGMENTS_PER_SCRIPT: usize = 128;

/// The atomic-mode segments of a flush, gathered into [`SEGMENTS`] calls: `EVAL` with the
/// form's settle key (if any) and, on a cluster, every key the commands touch as its KEYS
/// (the script reads none of them: declared, they make Redis refuse the call whole while the
/// slot migrates, `ASK` or `TRYAGAIN`, which the flush follows, instead of failing a command
/// midway), and in ARGV the number of segments, then per segment the number of its settle
/// commands, each settle command, the number of its side-effect commands and each of them,
/// every command as its length and its words.
#[derive(Default)]
struct Segments {
    keys: Vec<Bytes>,
    args: Vec<Bytes>,
    count: usize,
    settles_in_redis: bool,
    slot: Option<u16>,
}

impl Segments {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        form: &impl Settling,
        slot: Option<u16>,
        plan: &mut FlushPlan,
        delivered_in: u64,
        entry: &Entry,
        settles: Vec<Planned>,
        commands: Vec<crate::window::Command>,
    ) {
        if self.count == SEGMENTS_PER_SCRIPT {
            self.close(plan);
        }
        if self.count == 0 {
            self.settles_in_redis = form.settles_in_redis();
            self.keys
                .extend(settles.first().and_then(|c| c.args.first()).cloned());
        }
        for key in commands.iter().flat_map(|c| &c.keys) {
            if !self.keys.contains(key) {
                self.keys.push(key.clone());
            }
        }
        self.count += 1;
        plan.segments.push(SegmentSpan {
            slot: delivered_in,
            id: entry.id.clone(),
            first: plan.commands.len(),
            nth: self.count,
            key: entry_key(entry),
        });
        self.args.push(Bytes::from(settles.len().to_string()));
        for settle in settles {
            self.args
                .push(Bytes::from((settle.args.len() + 1).to_string()));
            self.args
                .push(Bytes::copy_from_slice(settle.name.as_bytes()));
            self.args.extend(settle.args);
        }
        self.args.push(Bytes::from(commands.len().to_string()));
        for command in commands {
            self.args
                .push(Bytes::from((command.args.len() + 1).to_string()));
            self.args.push(Bytes::from(command.name));
            self.args.extend(command.args);
        }
        self.slot = slot;
    }

    /// Appends the call of the segments gathered so far, if any.
    fn close(&mut self, plan: &mut FlushPlan) {
        if self.count == 0 {
            return;
        }
        let keys = std::mem::take(&mut self.keys);
        let body = std::mem::take(&mut self.args);
        let mut args = Vec::with_capacity(3 + keys.len() + body.len());
        args.push(Bytes::from_static(SEGMENTS.as_bytes()));
        args.push(Bytes::from(keys.len().to_string()));
        args.extend(keys);
        args.push(Bytes::from(self.count.to_string()));
        args.extend(body);
        let role = Role::Segments {
            settles: self.settles_in_redis,
        };
        plan.commands
            .push(Planned::new("EVAL", args, role).routed(self.slot));
        self.count = 0;
    }
}

/// The script of a flush's atomic-mode segments ([`Segments`]). For each segment, first it
/// asks the ACL whether the sidecar's user may run each of its commands
/// (`redis.acl_check_cmd`): if not, it runs none of them, as a `MULTI` refused while queuing
/// would. Then it runs them in order and stops at the first that fails; only when none failed
/// does it run the segment's settle commands (its entry's `XACK` or `LREM`, its bookkeeping).
/// It replies with one `{segment, the failed command's position, Redis's error, how many of
/// its commands ran before it}` per segment that failed (positions 1-based): commands that ran
/// before a failed one stay applied (Redis has no rollback); the entry stays pending and comes
/// back with its count raised. One script for many segments: Redis pays its call (and hashing
/// its text: it is sent as `EVAL`, so a node that never ran it, after a failover or a restart,
/// needs nothing loaded first) once, not once per segment.
///
/// When Redis refuses: no shebang, so that the client's commands may name keys it does not
/// declare. Out of memory, each segment's first command that would grow memory is refused
/// inside it (`OOM`) and nothing is settled; refused whole (`NOPERM` for `EVALSHA`, `BUSY`, a
/// slot that moved), nothing ran; a settle refused after its commands (an ACL without `XACK`)
/// fails the script there, with the segments before it settled and that one's commands
/// applied, as a refused `XACK` inside `EXEC` would.
pub(crate) const SEGMENTS: &str = r#"
local i, failures = 2, {}
local function command()
  local n = tonumber(ARGV[i])
  i = i + 1 + n
  return {i - n, i - 1}
end
for segment = 1, tonumber(ARGV[1]) do
  local settles, commands, failed = {}, {}, nil
  i = i + 1
  for k = 1, tonumber(ARGV[i - 1]) do settles[k] = command() end
  i = i + 1
  for k = 1, tonumber(ARGV[i - 1]) do
    commands[k] = command()
    if not failed and not redis.acl_check_cmd(unpack(ARGV, commands[k][1], commands[k][2])) then
      failed = {segment, k, "NOPERM the sidecar's Redis user may not run " ..
        ARGV[commands[k][1]] .. " on these keys", 0}
    end
  end
  if not failed then
    for k, c in ipairs(commands) do
      local reply = redis.pcall(unpack(ARGV, c[1], c[2]))
      if type(reply) == 'table' and reply.err then
        failed = {segment, k, reply.err, k - 1}
        break
      end
    end
  end
  if failed then
    failures[#failures + 1] = failed
  else
    for _, c in ipairs(settles) do redis.call(unpack(ARGV, c[1], c[2])) end
  end
end
return failures
"#;

/// The name of the `position`th (1-based) command of the `nth` segment of a [`SEGMENTS`] call.
pub(crate) fn segment_command(planned: &Planned, nth: usize, position: usize) -> Option<String> {
    segments_of(planned)?
        .into_iter()
        .nth(nth.checked_sub(1)?)?
        .1
        .into_iter()
        .nth(position.checked_sub(1)?)
        .and_then(|words| words.into_iter().next())
        .map(|name| String::from_utf8_lossy(&name).into_owned())
}

/// Each segment of a [`SEGMENTS`] call: its settle commands and its side-effect commands, each
/// as its words.
type Words = Vec<Vec<Bytes>>;
fn segments_of(planned: &Planned) -> Option<Vec<(Words, Words)>> {
    let mut args = planned.args.iter().skip(1);
    let number =
        |arg: Option<&Bytes>| -> Option<usize> { std::str::from_utf8(arg?).ok()?.parse().ok() };
    let keys = number(args.next())?;
    let mut args = args.skip(keys);
    let commands = |args: &mut dyn Iterator<Item = &Bytes>| -> Option<Words> {
        let count = number(args.next())?;
        (0..count)
            .map(|_| {
                let n = number(args.next())?;
                Some(args.take(n).cloned().collect())
            })
            .collect()
    };
    let count = number(args.next())?;
    (0..count)
        .map(|_| Some((commands(&mut args)?, commands(&mut args)?)))
        .collect()
}

/// A [`SEGMENTS`] call as one `SEGMENT keys | command; command | settle; settle` line per
/// segment, for tests.
#[cfg(test)]
fn render_segments(planned: &Planned) -> Vec<String> {
    assert_eq!(
        (&*planned.name, planned.args[0].as_ref()),
        ("EVAL", SEGMENTS.as_bytes())
    );
    let text = |words: &Vec<Bytes>| {
        let words: Vec<_> = words.iter().map(|w| String::from_utf8_lossy(w)).collect();
        words.join(" ")
    };
    let lines = |commands: &Words| commands.iter().map(text).collect::<Vec<_>>().join("; ");
    let keys: usize = std::str::from_utf8(&planned.args[1])
        .unwrap()
        .parse()
        .unwrap();
    let keys = text(&planned.args[2..2 + keys].to_vec());
    segments_of(planned)
        .unwrap()
        .iter()
        .map(|(settles, commands)| {
            format!("SEGMENT {keys} | {} | {}", lines(commands), lines(settles))
        })
        .collect()
}

/// What an entry is known by when it comes back: its stream id, or its value as stored (a list
/// value has no id; identical values are interchangeable).
pub(crate) fn entry_key(entry: &Entry) -> Bytes {
    if entry.id.is_empty() {
        entry.value().clone()
    } else {
        entry.id.clone()
    }
}

/// The writes that requeue one entry (a copy, a delay-set member, a dead letter), in the form's
/// commands.
fn requeue_writes(
    form: &impl Settling,
    entry: &Entry,
    action: &Requeue<'_>,
    ctx: &PlanContext,
) -> Vec<Planned> {
    let mut writes = FlushPlan::default();
    match *action {
        Requeue::None => {}
        Requeue::Retry(reason) => form.retry(entry, reason, &mut writes),
        Requeue::RetryAfter(reason, delay) => {
            let due = ctx.now_ms.saturating_add(delay.as_millis() as u64);
            form.retry_after(entry, reason, due, &mut writes);
        }
        Requeue::DeadLetter(reason) => form.dead_letter(entry, reason, &mut writes),
    }
    writes.commands
}

/// The form's requeue step ([`Settling::settle_owned`]), with its entries recorded for its
/// reply; `false` when the form has none.
fn settle_owned(form: &impl Settling, requeued: &[Requeued<'_>], plan: &mut FlushPlan) -> bool {
    if !form.settle_owned(requeued, plan) {
        return false;
    }
    plan.requeue_step = requeued
        .iter()
        .map(|r| StepEntry {
            slot: r.slot,
            id: r.entry.id.clone(),
            requeues: r.writes.iter().any(|w| w.role != Role::Bookkeeping),
        })
        .collect();
    true
}

/// The plan that moves entries read beyond the delivery cap to the dead letter, without
/// delivering them: in the form's requeue step, so that an entry is settled only once its dead
/// letter is written; a form without one (pub/sub has no dead letter) in a MULTI. The read
/// that found them counted a delivery that never happened: their dead letters say how often
/// they were delivered, one less.
pub(crate) fn plan_dead_letters(
    form: &impl Settling,
    entries: &[&Entry],
    mut reason: impl FnMut(&Entry) -> String,
) -> FlushPlan {
    let mut plan = FlushPlan::default();
    let slot = form.slot();
    let requeued: Vec<Requeued<'_>> = entries
        .iter()
        .map(|&entry| {
            let mut writes = FlushPlan::default();
            let delivered = Entry {
                delivery_count: entry.delivery_count.saturating_sub(1),
                ..entry.clone()
            };
            form.dead_letter(&delivered, Some(&reason(entry)), &mut writes);
            Requeued {
                slot: 0,
                entry,
                writes: writes.commands,
                dead_letter: true,
            }
        })
        .collect();
    if !settle_owned(form, &requeued, &mut plan) {
        plan.push("MULTI", vec![], Role::Begin, slot);
        for requeue in requeued {
            plan.commands.extend(requeue.writes);
        }
        form.settle(entries, &mut plan);
        form.finished(entries, &mut plan);
        plan.push(
            "EXEC",
            vec![],
            Role::Commit {
                settles: form.settles_in_redis(),
            },
            slot,
        );
    }
    plan.dead_lettered = entries.len();
    plan.settles = if form.settles_in_redis() {
        entries.len()
    } else {
        0
    };
    plan
}
