//! Exemplars: the flush and read duration histograms carry, per bucket, the trace id of the
//! last flush or read observed there (a read's span is the root of the trace its flush belongs
//! to, so both point at the flush's trace). They are written only in the OpenMetrics
//! exposition, which a scraper asks for with `Accept: application/openmetrics-text`
//! (Prometheus does; it keeps them with `--enable-feature=exemplar-storage`); other scrapers get
//! the same text without them.

use opentelemetry::trace::SpanContext;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::histogram::exponential_buckets;

/// The labels of an exemplar.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabels {
    pub trace_id: String,
}

/// A latency histogram (0.25 ms to about 4 s, as the others) that keeps exemplars.
pub(crate) fn latency_histogram() -> HistogramWithExemplars<TraceLabels> {
    HistogramWithExemplars::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// The exemplar of a span: its trace id, when the span is recorded (sampled) and so exported.
pub(crate) fn of_context(context: Option<&SpanContext>) -> Option<TraceLabels> {
    let context = context?;
    (context.is_valid() && context.is_sampled()).then(|| TraceLabels {
        trace_id: context.trace_id().to_string(),
    })
}

/// The exemplar of a span being recorded (a flush's).
pub(crate) fn of_span(span: Option<&opentelemetry::global::BoxedSpan>) -> Option<TraceLabels> {
    use opentelemetry::trace::Span;
    of_context(span.map(|span| span.span_context()))
}

/// Whether an `Accept` header asks for the OpenMetrics exposition.
pub(crate) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|part| {
            let mut params = part.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            let refused = params.any(|p| p.replace(' ', "") == "q=0");
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    })
}

/// `text` without its exemplars (the ` # {…} value [timestamp]` after a sample's value).
pub(crate) fn without_exemplars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match (line.starts_with('#'), line.find(" # {")) {
            (false, Some(at)) => out.push_str(&line[..at]),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_is_given_to_who_asks_for_it() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(wants_openmetrics(Some("application/openmetrics-text")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }

    #[test]
    fn exemplars_are_cut_from_sample_lines_only() {
        let text = "# HELP a_seconds A # {x}.\n\
                    a_seconds_bucket{le=\"0.5\"} 1 # {trace_id=\"abc\"} 0.25 1.5\n\
                    a_seconds_sum 0.25\n\
                    # EOF\n";
        assert_eq!(
            without_exemplars(text),
            "# HELP a_seconds A # {x}.\n\
             a_seconds_bucket{le=\"0.5\"} 1\n\
             a_seconds_sum 0.25\n\
             # EOF\n"
        );
    }

    #[test]
    fn an_unsampled_or_missing_span_gives_no_exemplar() {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        let context = |flags| {
            SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                flags,
                false,
                TraceState::default(),
            )
        };
        assert_eq!(
            of_context(Some(&context(TraceFlags::SAMPLED))),
            Some(TraceLabels {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into()
            })
        );
        assert_eq!(of_context(Some(&context(TraceFlags::default()))), None);
        assert_eq!(of_context(None), None);
    }
}
