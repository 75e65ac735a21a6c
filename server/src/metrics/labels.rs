//! The label sets of the sidecar's families, one type per shape: what a series is told apart
//! by. Apart from the families so that every part of the metrics (the subscriptions' series
//! and scaling's) and every part of the sidecar that counts names them alike.

use prometheus_client::encoding::EncodeLabelSet;

/// Labels of per-form series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FormLabels {
    pub form: &'static str,
}

/// Labels of outcome counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub form: &'static str,
    pub outcome: &'static str,
}

/// Labels of flush counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlushLabels {
    pub form: &'static str,
    pub mode: &'static str,
    pub result: &'static str,
}

/// Labels of flush durations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub form: &'static str,
    pub mode: &'static str,
}

/// Labels of Redis round trips.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoundTripLabels {
    pub form: &'static str,
    /// read, claim, pending_counts, fetch or flush.
    pub kind: &'static str,
}

/// Labels of one subscription's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SubscriptionLabels {
    pub key: String,
    pub group: String,
    pub consumer: String,
}

/// Labels of a consumer group's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    pub key: String,
    pub group: String,
}

/// Labels of a key's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub key: String,
}

/// Labels of writes Redis refused, per subscription.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// As dead letters name it: `stream/group`, or the list's key.
    pub subscription: String,
    /// The class of Redis's error (`crate::redis::flush::refusal_reason`).
    pub reason: &'static str,
}

/// Labels of rejections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}
