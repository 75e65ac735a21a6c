//! What the campaign runs: its flags, and the runs they make (each a seed, a form, a mode, a
//! topology and how long its faults last).

use std::time::Duration;

use clap::Parser;

use crate::form::Form;

#[derive(Parser, Debug, Clone)]
#[command(about = "Random faults against sidecars, workers and Redis, and a history checker")]
pub(crate) struct Args {
    /// The seed of decisions and faults (default: random, printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// How long the campaign injects faults, in all (split evenly between its runs).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// pipeline, atomic or both.
    #[arg(long, default_value = "both")]
    mode: String,
    /// One form (default: every form in turn; streams also on a cluster). `partitioned`: the
    /// stream in partitions, every worker an ordered replica of the group.
    #[arg(long, value_enum)]
    pub(crate) form: Option<Form>,
    /// Against a 3-primary Redis Cluster with a replica each (streams only: `stream` or
    /// `partitioned`).
    #[arg(long)]
    pub(crate) cluster: bool,
    /// The CI configuration: fixed seeds and one random one, 25 s of faults each.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 2)]
    pub(crate) sidecars: usize,
    #[arg(long, default_value_t = 3)]
    pub(crate) workers: usize,
    /// Entries each of the two producers publishes per second.
    #[arg(long, default_value_t = 40)]
    pub(crate) rate: u64,
    /// No nemesis: the same load and checks without faults (a baseline).
    #[arg(long)]
    pub(crate) no_faults: bool,
    /// Which stream and reliable-list workers order by key: every other one (both kinds of
    /// subscription share the group or list), all or none. A partitioned stream's workers
    /// always do.
    #[arg(long, value_enum, default_value = "mixed")]
    ordered: Ordered,
    /// Where a run that found anomalies leaves its whole history and the sidecars' logs, to
    /// read what led to them (`<seed>-<form>-<mode>-<topology>.history` and `.sidecars.log`).
    #[arg(long)]
    pub(crate) keep: Option<std::path::PathBuf>,
}

/// Which workers open ordered subscriptions (where the form can be ordered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Ordered {
    /// The even-numbered workers.
    Mixed,
    All,
    None,
}

impl Ordered {
    pub(crate) fn worker(self, id: u32) -> bool {
        match self {
            Ordered::Mixed => id.is_multiple_of(2),
            Ordered::All => true,
            Ordered::None => false,
        }
    }
}

/// One run of the campaign.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) seed: u64,
    pub(crate) form: Form,
    pub(crate) atomic: bool,
    pub(crate) cluster: bool,
    pub(crate) faults_for: Duration,
    pub(crate) ordered: Ordered,
}

pub(crate) fn mode(run: Run) -> &'static str {
    if run.atomic { "atomic" } else { "pipeline" }
}

pub(crate) fn topology(run: Run) -> &'static str {
    if run.cluster {
        "cluster"
    } else {
        "single node"
    }
}

/// The runs of a campaign: every form and mode, streams also on a cluster, or what the flags
/// pick.
pub(crate) fn plan(args: &Args, random: u64) -> Vec<Run> {
    let run = |seed, form, atomic, cluster, faults_for| Run {
        seed,
        form,
        atomic,
        cluster,
        faults_for,
        ordered: args.ordered,
    };
    if args.quick {
        let each = Duration::from_secs(25);
        let forms = [Form::ReliableList, Form::SimpleList, Form::Pubsub];
        return vec![
            run(1, Form::Stream, false, false, each),
            run(2, Form::Stream, true, false, each),
            run(3, Form::Stream, true, true, each),
            run(4, Form::ReliableList, false, false, each),
            run(
                random,
                forms[(random % 3) as usize],
                random % 2 == 1,
                false,
                each,
            ),
        ];
    }
    let modes: Vec<bool> = match args.mode.as_str() {
        "pipeline" => vec![false],
        "atomic" => vec![true],
        _ => vec![false, true],
    };
    let mut runs = Vec::new();
    let forms = match args.form {
        Some(form) => vec![form],
        None => vec![
            Form::Stream,
            Form::ReliableList,
            Form::SimpleList,
            Form::Pubsub,
            Form::Partitioned,
        ],
    };
    for form in forms {
        for &atomic in &modes {
            let topologies: Vec<bool> = if args.cluster {
                vec![true]
            } else if args.form.is_none() && form == Form::Stream {
                vec![false, true]
            } else {
                vec![false]
            };
            for cluster in topologies {
                runs.push(run(random, form, atomic, cluster, Duration::ZERO));
            }
        }
    }
    let each = Duration::from_secs_f64(args.minutes * 60.0 / runs.len() as f64);
    for (i, r) in runs.iter_mut().enumerate() {
        r.faults_for = each;
        // Each run draws its own faults and decisions; the first keeps the campaign's seed,
        // so `--seed S --form F --mode M` replays the run that printed seed S.
        r.seed = random.wrapping_add(i as u64);
    }
    runs
}
