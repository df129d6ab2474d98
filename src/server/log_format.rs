//! `serve`'s text log format: tracing-subscriber's default (`Full`) format, with the one line per
//! admission written straight into the line buffer instead of through the generic field
//! formatter. The bytes are the same (`tests` compare the two on the same events); what is saved
//! is the per-field work of the generic path on the request path (a styled field name and `=`
//! formatted through nested `fmt::Arguments`, even with colours off).
//!
//! Any other event, an admission inside a span, or a terminal with colours goes through the
//! default format unchanged.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The fields of [`super::log_admission`]'s event, in the order it records them.
const ADMISSION_FIELDS: [&str; 13] = [
    "message",
    "webhook",
    "uid",
    "kind",
    "namespace",
    "name",
    "operation",
    "dry_run",
    "allowed",
    "patch_operations",
    "status",
    "error",
    "latency_ms",
];

/// The text format of `serve` (see the module).
pub struct TextFormat<T = SystemTime> {
    timer: T,
    full: Format<Full, T>,
}

impl Default for TextFormat<SystemTime> {
    fn default() -> Self {
        TextFormat::with_timer(SystemTime)
    }
}

impl<T: FormatTime + Clone> TextFormat<T> {
    pub fn with_timer(timer: T) -> Self {
        TextFormat {
            full: Format::default().with_timer(timer.clone()),
            timer,
        }
    }
}

/// Whether `event` is the admission line: `log_admission`'s target, level and fields.
fn is_admission(event: &Event<'_>) -> bool {
    let meta = event.metadata();
    *meta.level() == Level::INFO
        && meta.target() == module_path!().trim_end_matches("::log_format")
        && meta.fields().len() == ADMISSION_FIELDS.len()
        && meta
            .fields()
            .iter()
            .zip(ADMISSION_FIELDS)
            .all(|(field, name)| field.name() == name)
}

impl<S, N, T> FormatEvent<S, N> for TextFormat<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if writer.has_ansi_escapes() || !is_admission(event) || ctx.event_scope().is_some() {
            return self.full.format_event(ctx, writer, event);
        }
        // `Full` without colours: "<time> <level padded to 5> <target>: <fields>\n".
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str("  INFO ")?;
        writer.write_str(event.metadata().target())?;
        writer.write_str(": ")?;
        let mut fields = Fields {
            writer: writer.by_ref(),
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

/// The admission's fields as tracing-subscriber's `DefaultVisitor` writes them without colours:
/// separated by one space, `name=` and the value's `Debug`, the message alone. Every value of
/// the admission line is recorded as a string, a number, a bool or a `Display` wrapper; none
/// is an error.
struct Fields<'a> {
    writer: Writer<'a>,
    first: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.write(field, value);
        }
    }

    fn write(
        &mut self,
        field: &Field,
        value: impl FnOnce(&mut Writer<'_>) -> fmt::Result,
    ) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.writer.write_char(' ')?;
        }
        if field.name() != "message" {
            self.writer.write_str(field.name())?;
            self.writer.write_char('=')?;
        }
        value(&mut self.writer)
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |w| write!(w, "{value:?}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, |w| write!(w, "{value:?}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |w| write!(w, "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::admission::{Summary, Webhook};

    /// A clock that always says the same, so that two formats can be compared byte for byte.
    #[derive(Clone)]
    struct Fixed;

    impl FormatTime for Fixed {
        fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
            w.write_str("2026-12-01T19:31:53.123456Z")
        }
    }

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `log` writes through the default format and through [`TextFormat`].
    fn both(log: impl Fn()) -> (String, String) {
        let default = Lines::default();
        let fast = Lines::default();
        let sink = default.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_timer(Fixed)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &log);
        let sink = fast.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(TextFormat::with_timer(Fixed))
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &log);
        let text = |l: Lines| String::from_utf8(l.0.lock().unwrap().clone()).unwrap();
        (text(default), text(fast))
    }

    #[test]
    fn the_admission_line_is_the_default_formats_byte_for_byte() {
        let summaries = [
            Summary {
                uid: "705ab4f5-6393-11e8-b7cc-42010a800002".into(),
                kind: "Pod".into(),
                namespace: "llm-serving".into(),
                name: "vllm-llama-3-8b-7f9c6d5b8-".into(),
                operation: "CREATE".into(),
                allowed: true,
                patch_operations: 9,
                ..Default::default()
            },
            Summary {
                uid: "a\nb\u{1b}[31m\"é\u{85}".into(),
                kind: "Job\r".into(),
                dry_run: true,
                error: Some("invalid_review"),
                ..Default::default()
            },
        ];
        for (summary, seconds) in summaries.iter().zip([0.000_012_3, 12.5]) {
            let (default, fast) = both(|| {
                super::super::log_admission(Webhook::Mutate, summary, 200, seconds);
                super::super::log_admission(Webhook::Validate, summary, 400, 1e-9);
            });
            assert_eq!(fast, default);
            assert_eq!(fast.lines().count(), 2, "{fast}");
            assert!(fast.contains(" INFO modelgate::server: admission webhook=\"mutate\" uid="));
        }
    }

    #[test]
    fn other_events_go_through_the_default_format() {
        let (default, fast) = both(|| {
            tracing::info!(webhook = "mutate", latency_ms = 1.5, "admission");
            tracing::warn!(error = %"boom", "something else");
            let span = tracing::info_span!("outer", x = 1);
            let _in = span.enter();
            super::super::log_admission(Webhook::Mutate, &Summary::default(), 200, 0.5);
        });
        assert_eq!(fast, default);
        assert!(
            fast.contains("outer{x=1}: modelgate::server: admission"),
            "{fast}"
        );
    }
}
