//! The jobs scaling and alerting need beside the subscriptions: the sampler of the work-waiting
//! gauge an autoscaler scales on ([`work`]) and the keeper ([`keeper`], `--keep`: promote and
//! sample keys whether or not anything subscribes to them). Their series are registered with
//! the others, in `crate::metrics` (its `scale` part; the metric names, `window_sidecar_…` with
//! the former `window_…` kept for one release, in its `names`).

pub mod keeper;
pub mod work;
