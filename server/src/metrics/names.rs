//! The metric names: every series is `window_sidecar_…`, so that the sidecar's series do not
//! collide with another exporter's `window_…` in a shared Prometheus. For one release the
//! families that existed under `window_…` are exported under that name too (the same values,
//! their help marked deprecated), so dashboards and alerts can move over; the families added
//! since have only the new name.

/// Prefix of every family.
pub(crate) const PREFIX: &str = "window_sidecar_";
/// The former prefix, kept for one release.
pub(crate) const OLD_PREFIX: &str = "window_";

/// The families (names after the prefix, as registered) that had a `window_` name before.
pub(crate) const OLD_FAMILIES: &[&str] = &[
    "subscriptions_open",
    "reads",
    "read_aheads",
    "deliveries",
    "redeliveries",
    "reclaimed_entries",
    "outcomes",
    "rejections",
    "flushes",
    "flush_commands",
    "flush_settles",
    "flush_duration_seconds",
    "redis_round_trips",
    "outstanding_deliveries",
    "delay_set_entries",
    "group_pending_entries",
    "group_lag_entries",
    "list_entries",
    "list_processing_entries",
    "published_entries",
];

/// `text` (an OpenMetrics exposition ending in `# EOF`) with each family of [`OLD_FAMILIES`]
/// repeated under its former name before the end.
pub(crate) fn with_old_names(text: String) -> String {
    let body = text.strip_suffix("# EOF\n").unwrap_or(&text);
    let mut old = String::new();
    let mut copying = false;
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let family = rest.split(' ').next().unwrap_or_default();
            copying = family
                .strip_prefix(PREFIX)
                .is_some_and(|name| OLD_FAMILIES.contains(&name));
            if copying {
                let new_name = family.to_owned();
                let old_name = format!("{OLD_PREFIX}{}", &family[PREFIX.len()..]);
                let help = &rest[family.len()..];
                old.push_str(&format!(
                    "# HELP {old_name}{help} (deprecated name: use {new_name})\n"
                ));
                continue;
            }
        }
        if !copying {
            continue;
        }
        let renamed = if let Some(meta) = line.strip_prefix("# ") {
            // # TYPE name type, # UNIT name unit
            match meta.split_once(' ') {
                Some((kind, rest)) => format!(
                    "# {kind} {}",
                    rest.strip_prefix(PREFIX)
                        .map_or_else(|| rest.to_owned(), |r| format!("{OLD_PREFIX}{r}"))
                ),
                None => line.to_owned(),
            }
        } else {
            line.strip_prefix(PREFIX)
                .map_or_else(|| line.to_owned(), |r| format!("{OLD_PREFIX}{r}"))
        };
        old.push_str(&renamed);
        old.push('\n');
    }
    let mut out = String::with_capacity(text.len() + old.len());
    out.push_str(body);
    out.push_str(&old);
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_families_are_repeated_under_their_former_names_and_new_ones_are_not() {
        let text = "# HELP window_sidecar_deliveries Deliveries handed to clients.\n\
                    # TYPE window_sidecar_deliveries counter\n\
                    window_sidecar_deliveries_total{form=\"stream\"} 3\n\
                    # HELP window_sidecar_work_waiting_entries Work waiting.\n\
                    # TYPE window_sidecar_work_waiting_entries gauge\n\
                    window_sidecar_work_waiting_entries{form=\"list\",key=\"k\",group=\"\"} 2\n\
                    # HELP window_sidecar_flush_duration_seconds Time.\n\
                    # TYPE window_sidecar_flush_duration_seconds histogram\n\
                    # UNIT window_sidecar_flush_duration_seconds seconds\n\
                    window_sidecar_flush_duration_seconds_sum 0.5\n\
                    # EOF\n";
        let out = with_old_names(text.to_owned());
        assert!(
            out.starts_with(text.strip_suffix("# EOF\n").unwrap()),
            "{out}"
        );
        assert!(out.ends_with("# EOF\n"));
        assert_eq!(out.matches("# EOF").count(), 1);
        for line in [
            "# HELP window_deliveries Deliveries handed to clients. (deprecated name: use window_sidecar_deliveries)",
            "# TYPE window_deliveries counter",
            "window_deliveries_total{form=\"stream\"} 3",
            "# UNIT window_flush_duration_seconds seconds",
            "window_flush_duration_seconds_sum 0.5",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("window_work_waiting_entries"), "{out}");
    }
}
