//! `serve`'s log formats (text and JSON), and what keeps every line safe and small whatever a
//! client or a peer sends:
//!
//! - **Escaped.** Every value is written with control characters, the Unicode line and
//!   paragraph separators (U+2028, U+2029) and the bidirectional controls (U+061C, U+200E,
//!   U+200F, U+202A–U+202E, U+2066–U+2069) escaped as Rust writes them (`\n`, `\u{2028}`,
//!   `\u{202e}`): no value can end a line, start a forged one, or reorder what a reader sees.
//! - **Cut.** A value taken from a request or a peer keeps at most [`LOG_FIELD_MAX_BYTES`],
//!   then says how many bytes it left out (`…(N more bytes)`). `serve`'s own events wrap such
//!   values in [`super::Escaped`]; every value of an event of the libraries that parse what
//!   peers send ([`PEER_LIBRARIES`]: rustls, h2, hyper…), the message included, is cut so here.
//! - **Rate-limited.** Those libraries' warnings (and info and error lines) are written at most
//!   once per [`PEER_LOG_INTERVAL`] for each place in their code that logs; the next line from
//!   that place says how many were left out (`suppressed=N`). `serve`'s own warnings about peers
//!   (failed handshakes, failed accepts) do the same through [`Throttle`].
//!
//! The text format is tracing-subscriber's default (`Full`) with these rules for the values
//! ([`SafeFields`]), and the one `info` line per admission written straight into the line
//! buffer instead of through the generic path: the bytes are the same (`tests` compare the two),
//! what is saved is the per-event work of the generic path on the request path. The JSON format
//! ([`JsonFormat`]) has the shape of tracing-subscriber's flattened JSON (`timestamp`, `level`,
//! the fields, `target`) with the same rules.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::LOG_FIELD_MAX_BYTES;

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

/// The targets (crates) that parse what peers send: every value of their events is cut, and
/// their `info`, `warn` and `error` lines are rate-limited.
pub const PEER_LIBRARIES: [&str; 6] = [
    "rustls",
    "tokio_rustls",
    "h2",
    "hyper",
    "hyper_util",
    "axum",
];

/// How often a line about peers may be written from one place: one per interval, whatever the
/// peers do (a flood of 1 000 failing handshakes a second writes one line every 10 s).
pub const PEER_LOG_INTERVAL: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Escaping and cutting

/// Whether a character is written escaped: control characters (C0, DEL, C1, among them NEL), the
/// line and paragraph separators, and the bidirectional controls.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn escape_into<W: fmt::Write>(out: &mut W, s: &str) -> fmt::Result {
    // Printable ASCII, the usual case: the whole string in one write.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(needs_escape) {
        return out.write_str(s);
    }
    for c in s.chars() {
        if needs_escape(c) {
            write!(out, "{}", c.escape_default())?;
        } else {
            out.write_char(c)?;
        }
    }
    Ok(())
}

/// The largest `i <= n` that is a character boundary of `s`.
fn floor_char_boundary(s: &str, n: usize) -> usize {
    (0..=n.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// A writer that escapes what it is given ([`needs_escape`]) and keeps at most `limit` bytes of
/// it (cut at a character boundary), counting the rest; [`Sanitizer::finish`] then says how
/// many bytes were left out.
pub struct Sanitizer<W> {
    out: W,
    limit: usize,
    kept: usize,
    dropped: usize,
    full: bool,
}

impl<W: fmt::Write> Sanitizer<W> {
    /// `limit`: the bytes kept (`usize::MAX`: all).
    pub fn new(out: W, limit: usize) -> Self {
        Sanitizer {
            out,
            limit,
            kept: 0,
            dropped: 0,
            full: false,
        }
    }

    /// Writes `…(N more bytes)` when something was left out.
    pub fn finish(mut self) -> fmt::Result {
        if self.dropped > 0 {
            write!(self.out, "…({} more bytes)", self.dropped)?;
        }
        Ok(())
    }
}

impl<W: fmt::Write> fmt::Write for Sanitizer<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.full {
            self.dropped += s.len();
            return Ok(());
        }
        let room = self.limit - self.kept;
        let kept = if s.len() <= room {
            s
        } else {
            self.full = true;
            &s[..floor_char_boundary(s, room)]
        };
        self.dropped += s.len() - kept.len();
        self.kept += kept.len();
        escape_into(&mut self.out, kept)
    }
}

/// Writes `value`'s `Debug` (for a `Display` wrapper or a message, its text) through a
/// [`Sanitizer`].
fn write_sanitized<W: fmt::Write>(out: W, value: &dyn fmt::Debug, limit: usize) -> fmt::Result {
    let mut s = Sanitizer::new(out, limit);
    write!(s, "{value:?}")?;
    s.finish()
}

// ---------------------------------------------------------------------------------------------
// Rate limits

/// Milliseconds since the first call (never 0), on the monotonic clock.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// One line per [`PEER_LOG_INTERVAL`] for one kind of warning about peers, the count of those
/// left out in between carried by the next:
///
/// ```ignore
/// static HANDSHAKE_FAILED: Throttle = Throttle::new();
/// if let Some(suppressed) = HANDSHAKE_FAILED.allow() {
///     tracing::warn!(suppressed, "TLS handshake failed");
/// }
/// ```
pub struct Throttle {
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    pub const fn new() -> Self {
        Throttle {
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines left out since the last one)` when a line may be written now.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(now_ms())
    }

    fn allow_at(&self, now: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now + PEER_LOG_INTERVAL.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

/// A place in a peer library's code that logs: its target, line and level.
type Place = (String, u32, Level);

/// The places in the peer libraries that logged, each with its [`Throttle`] state (when the
/// next line may be written, and how many were left out since the last). Bounded: past
/// [`PeerLines::MAX_PLACES`] places, the others share one.
#[derive(Default)]
struct PeerLines {
    places: Mutex<HashMap<Place, (u64, u64)>>,
}

impl PeerLines {
    const MAX_PLACES: usize = 1024;

    /// As [`Throttle::allow`], for the line logged at `target`:`line` at `level`.
    fn allow_at(&self, target: &str, line: u32, level: Level, now: u64) -> Option<u64> {
        let mut places = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = (target.to_owned(), line, level);
        if places.len() >= Self::MAX_PLACES && !places.contains_key(&key) {
            key = (String::new(), 0, Level::ERROR);
        }
        let (next, suppressed) = places.entry(key).or_insert((0, 0));
        if now >= *next {
            *next = now + PEER_LOG_INTERVAL.as_millis() as u64;
            return Some(std::mem::take(suppressed));
        }
        *suppressed += 1;
        None
    }
}

fn peer_lines() -> &'static PeerLines {
    static LINES: OnceLock<PeerLines> = OnceLock::new();
    LINES.get_or_init(PeerLines::default)
}

/// Whether `target` is one of [`PEER_LIBRARIES`] or a module of one.
pub fn is_peer_library(target: &str) -> bool {
    PEER_LIBRARIES.iter().any(|lib| {
        target
            .strip_prefix(lib)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// How an event's values are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rules {
    /// Every value cut to [`LOG_FIELD_MAX_BYTES`] (an event of a peer library).
    cut: bool,
    /// Lines of this place left out before this one.
    suppressed: u64,
}

/// The target and line an event comes from: those of the `log` record for an event bridged
/// from the `log` crate (rustls logs through it), whose own metadata say only `log`.
fn origin(event: &Event<'_>) -> (Cow<'static, str>, Option<u32>) {
    let meta = event.metadata();
    if meta.target() != "log" || meta.fields().field("log.target").is_none() {
        return (Cow::Borrowed(meta.target()), meta.line());
    }
    #[derive(Default)]
    struct LogRecord {
        target: Option<String>,
        line: Option<u32>,
    }
    impl Visit for LogRecord {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "log.target" {
                self.target = Some(value.to_owned());
            }
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "log.line" {
                self.line = u32::try_from(value).ok();
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn fmt::Debug) {}
    }
    let mut record = LogRecord::default();
    event.record(&mut record);
    (
        record.target.map_or(Cow::Borrowed("log"), Cow::Owned),
        record.line,
    )
}

/// The rules for `event` and its target, or `None` when it is left out (a peer library's line
/// within [`PEER_LOG_INTERVAL`] of the last one from the same place).
fn rules_of(event: &Event<'_>) -> Option<(Rules, Cow<'static, str>)> {
    let (target, line) = origin(event);
    if !is_peer_library(&target) {
        return Some((Rules::default(), target));
    }
    let level = *event.metadata().level();
    let suppressed = if level <= Level::INFO {
        peer_lines().allow_at(&target, line.unwrap_or(0), level, now_ms())?
    } else {
        0
    };
    Some((
        Rules {
            cut: true,
            suppressed,
        },
        target,
    ))
}

thread_local! {
    /// The rules of the event being formatted on this thread, for [`SafeFields`], which
    /// `Full` calls with the fields alone.
    static CURRENT: Cell<Rules> = const { Cell::new(Rules { cut: false, suppressed: 0 }) };
}

/// Sets [`CURRENT`] for as long as it lives.
struct CurrentRules;

impl CurrentRules {
    fn set(rules: Rules) -> Option<CurrentRules> {
        (rules != Rules::default()).then(|| {
            CURRENT.with(|c| c.set(rules));
            CurrentRules
        })
    }
}

impl Drop for CurrentRules {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(Rules::default()));
    }
}

// ---------------------------------------------------------------------------------------------
// Text

/// The text format's fields: as tracing-subscriber's `DefaultVisitor` writes them without
/// colours (separated by one space, `name=` and the value's `Debug`, the message alone, the
/// `log.*` fields of an event from the `log` crate left out), each value written through a
/// [`Sanitizer`], cut when the event's [`Rules`] say so. Strings are written as their `Debug`,
/// which escapes every character [`needs_escape`] names.
pub struct SafeVisitor<'a> {
    writer: Writer<'a>,
    first: bool,
    cut: bool,
    result: fmt::Result,
}

impl<'a> SafeVisitor<'a> {
    /// `cut`: every value is cut to [`LOG_FIELD_MAX_BYTES`].
    pub fn new(writer: Writer<'a>, cut: bool) -> Self {
        SafeVisitor {
            writer,
            first: true,
            cut,
            result: Ok(()),
        }
    }

    fn limit(&self) -> usize {
        if self.cut {
            LOG_FIELD_MAX_BYTES
        } else {
            usize::MAX
        }
    }

    /// Writes the separator and `name=` (nothing for the message); false for a field left out.
    fn start(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return false;
        }
        let result = (|| {
            if !std::mem::take(&mut self.first) {
                self.writer.write_char(' ')?;
            }
            if name != "message" {
                self.writer
                    .write_str(name.strip_prefix("r#").unwrap_or(name))?;
                self.writer.write_char('=')?;
            }
            Ok(())
        })();
        self.result = result;
        self.result.is_ok()
    }

    /// Ends the fields, with `suppressed=N` when lines of this place were left out.
    pub fn finish(mut self, suppressed: u64) -> fmt::Result {
        self.result?;
        if suppressed > 0 {
            if !self.first {
                self.writer.write_char(' ')?;
            }
            write!(self.writer, "suppressed={suppressed}")?;
        }
        Ok(())
    }
}

impl Visit for SafeVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            return self.record_debug(field, &format_args!("{value}"));
        }
        if !self.start(field) {
            return;
        }
        self.result = match self.limit() {
            limit if value.len() > limit => {
                let end = floor_char_boundary(value, limit);
                write!(
                    self.writer,
                    "{:?}…({} more bytes)",
                    &value[..end],
                    value.len() - end
                )
            }
            _ => write!(self.writer, "{value:?}"),
        };
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        struct WithSources<'e>(&'e (dyn std::error::Error + 'static), &'e str);
        impl fmt::Debug for WithSources<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)?;
                let mut source = self.0.source();
                if source.is_some() {
                    write!(f, " {}.sources=[", self.1)?;
                    let mut first = true;
                    while let Some(s) = source {
                        if !std::mem::take(&mut first) {
                            f.write_str(", ")?;
                        }
                        write!(f, "{s}")?;
                        source = s.source();
                    }
                    f.write_char(']')?;
                }
                Ok(())
            }
        }
        self.record_debug(field, &WithSources(value, field.name()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.start(field) {
            return;
        }
        let limit = self.limit();
        self.result = write_sanitized(&mut self.writer, value, limit);
    }
}

/// The text format's field formatter ([`SafeVisitor`]); give it to the subscriber with
/// `fmt_fields`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SafeFields;

impl<'writer> FormatFields<'writer> for SafeFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let rules = CURRENT.with(Cell::get);
        let mut visitor = SafeVisitor::new(writer, rules.cut);
        fields.record(&mut visitor);
        visitor.finish(rules.suppressed)
    }
}

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
        let Some((rules, _)) = rules_of(event) else {
            // Left out: nothing is written (the line buffer stays empty).
            return Ok(());
        };
        if rules.cut
            || writer.has_ansi_escapes()
            || !is_admission(event)
            || ctx.event_scope().is_some()
        {
            let _current = CurrentRules::set(rules);
            return self.full.format_event(ctx, writer, event);
        }
        // `Full` without colours: "<time> <level padded to 5> <target>: <fields>\n".
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str("  INFO ")?;
        writer.write_str(event.metadata().target())?;
        writer.write_str(": ")?;
        let mut fields = SafeVisitor::new(writer.by_ref(), false);
        event.record(&mut fields);
        fields.finish(0)?;
        writer.write_char('\n')
    }
}

// ---------------------------------------------------------------------------------------------
// JSON

/// The JSON format of `serve`: one object per line, `timestamp`, `level`, the event's fields
/// (numbers and booleans as JSON numbers and booleans, anything else as a string written through
/// a [`Sanitizer`]), `suppressed` when lines of a peer library's place were left out, and
/// `target` (the `log` record's for an event of the `log` crate). Spans are not written
/// (`serve` opens none at `info`).
pub struct JsonFormat<T = SystemTime> {
    timer: T,
}

impl Default for JsonFormat<SystemTime> {
    fn default() -> Self {
        JsonFormat { timer: SystemTime }
    }
}

impl<T: FormatTime> JsonFormat<T> {
    pub fn with_timer(timer: T) -> Self {
        JsonFormat { timer }
    }
}

/// Writes `s` as a JSON string.
fn json_string<W: fmt::Write>(out: &mut W, s: &str) -> fmt::Result {
    let quoted = serde_json::to_string(s).map_err(|_| fmt::Error)?;
    out.write_str(&quoted)
}

struct JsonVisitor<'a> {
    writer: Writer<'a>,
    cut: bool,
    result: fmt::Result,
}

impl JsonVisitor<'_> {
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return false;
        }
        self.result = self.writer.write_char(',').and_then(|()| {
            json_string(&mut self.writer, name)?;
            self.writer.write_char(':')
        });
        self.result.is_ok()
    }

    fn raw(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.key(field) {
            self.result = self.writer.write_fmt(value);
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // As serde_json writes it: the shortest form that reads back, `null` when not finite.
        let text = serde_json::to_string(&value).unwrap_or_else(|_| "null".into());
        self.raw(field, format_args!("{text}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.key(field) {
            return;
        }
        let limit = if self.cut {
            LOG_FIELD_MAX_BYTES
        } else {
            usize::MAX
        };
        let mut text = String::new();
        self.result = write_sanitized(&mut text, value, limit)
            .and_then(|()| json_string(&mut self.writer, &text));
    }
}

impl<S, N, T> FormatEvent<S, N> for JsonFormat<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((rules, target)) = rules_of(event) else {
            return Ok(());
        };
        let mut time = String::new();
        if self.timer.format_time(&mut Writer::new(&mut time)).is_err() {
            time = "<unknown time>".into();
        }
        writer.write_str("{\"timestamp\":")?;
        json_string(&mut writer, &time)?;
        write!(
            writer,
            ",\"level\":\"{}\"",
            event.metadata().level().as_str()
        )?;
        let mut fields = JsonVisitor {
            writer: writer.by_ref(),
            cut: rules.cut,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        if rules.suppressed > 0 {
            write!(writer, ",\"suppressed\":{}", rules.suppressed)?;
        }
        writer.write_str(",\"target\":")?;
        json_string(&mut writer, &target)?;
        writer.write_str("}\n")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::Value;

    use super::*;
    use crate::admission::{Summary, Webhook};
    use crate::server::Escaped;

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

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// What `log` writes through `Full` with [`SafeFields`] (the generic path), and through
    /// [`TextFormat`].
    fn both(log: impl Fn()) -> (String, String) {
        let generic = Lines::default();
        let fast = Lines::default();
        let sink = generic.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_timer(Fixed)
            .fmt_fields(SafeFields)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &log);
        let sink = fast.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(SafeFields)
            .event_format(TextFormat::with_timer(Fixed))
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &log);
        (generic.text(), fast.text())
    }

    /// What `log` writes through [`JsonFormat`].
    fn json(log: impl Fn()) -> Vec<Value> {
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(SafeFields)
            .event_format(JsonFormat::with_timer(Fixed))
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &log);
        lines
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    fn llm_summary() -> Summary {
        Summary {
            uid: "705ab4f5-6393-11e8-b7cc-42010a800002".into(),
            kind: "Pod".into(),
            namespace: "llm-serving".into(),
            name: "vllm-llama-3-8b-7f9c6d5b8-".into(),
            operation: "CREATE".into(),
            allowed: true,
            patch_operations: 9,
            ..Default::default()
        }
    }

    #[test]
    fn the_admission_line_is_the_generic_formats_byte_for_byte() {
        let summaries = [
            llm_summary(),
            Summary {
                uid: "a\nb\u{1b}[31m\"é\u{85}\u{2028}\u{202e}".into(),
                kind: "Job\r".into(),
                dry_run: true,
                error: Some("invalid_review"),
                ..Default::default()
            },
        ];
        for (summary, seconds) in summaries.iter().zip([0.000_012_3, 12.5]) {
            let (generic, fast) = both(|| {
                super::super::log_admission(Webhook::Mutate, summary, 200, seconds);
                super::super::log_admission(Webhook::Validate, summary, 400, 1e-9);
            });
            assert_eq!(fast, generic);
            assert_eq!(fast.lines().count(), 2, "{fast}");
            assert!(fast.contains(" INFO modelgate::server: admission webhook=\"mutate\" uid="));
        }
    }

    #[test]
    fn plain_values_are_written_as_tracing_subscriber_writes_them() {
        // Nothing to escape or cut: the line is the stock format's, byte for byte.
        let log = || {
            super::super::log_admission(Webhook::Mutate, &llm_summary(), 200, 0.5);
            tracing::warn!(peer = %"10.0.0.1:4242", error = %"boom", "TLS handshake failed");
        };
        let stock = Lines::default();
        let sink = stock.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_timer(Fixed)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let (generic, fast) = both(log);
        assert_eq!(generic, stock.text());
        assert_eq!(fast, stock.text());
    }

    #[test]
    fn other_events_go_through_the_generic_format() {
        let (generic, fast) = both(|| {
            tracing::info!(webhook = "mutate", latency_ms = 1.5, "admission");
            tracing::warn!(error = %"boom", "something else");
            let span = tracing::info_span!("outer", x = 1);
            let _in = span.enter();
            super::super::log_admission(Webhook::Mutate, &Summary::default(), 200, 0.5);
        });
        assert_eq!(fast, generic);
        assert!(
            fast.contains("outer{x=1}: modelgate::server: admission"),
            "{fast}"
        );
    }

    #[test]
    fn separators_and_bidirectional_controls_are_escaped_in_every_value() {
        let name = "a\u{2028}b\u{2029}c\u{202e}d\u{2066}e\u{200f}f\u{61c}g\nh";
        let escaped = r"a\u{2028}b\u{2029}c\u{202e}d\u{2066}e\u{200f}f\u{61c}g\nh";
        assert_eq!(Escaped(name).to_string(), escaped);
        let (text, _) = both(|| {
            tracing::warn!(name = %name, "refused {}", name);
            tracing::warn!(name, "a string field");
        });
        assert_eq!(text.lines().count(), 2, "{text}");
        for raw in [
            '\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}', '\u{200f}', '\r',
        ] {
            assert!(!text.contains(raw), "{raw:?} raw in {text}");
        }
        assert!(
            text.contains(&format!("refused {escaped} name={escaped}")),
            "{text}"
        );
        // A string field is its Debug, which escapes the same characters.
        assert!(text.contains(&format!("name=\"{escaped}\"")), "{text}");
        let lines = json(|| tracing::warn!(name = %name, "refused {}", name));
        assert_eq!(lines[0]["name"], escaped);
        assert_eq!(lines[0]["message"], format!("refused {escaped}"));
    }

    #[test]
    fn the_json_line_has_the_shape_of_tracing_subscribers() {
        let log = || {
            super::super::log_admission(Webhook::Mutate, &llm_summary(), 200, 0.012_3);
            tracing::warn!(
                status = 408u16,
                reason = "body_too_slow",
                "admission request refused"
            );
        };
        let stock = Lines::default();
        let sink = stock.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_timer(Fixed)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let stock: Vec<Value> = stock
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(json(log), stock);
    }

    #[test]
    fn a_peer_librarys_values_are_cut_and_its_lines_rate_limited() {
        let sni = format!("{} {}", "a".repeat(32_000), "b".repeat(32_999));
        let flood = || {
            for _ in 0..50 {
                tracing::warn!(
                    target: "rustls::msgs::handshake",
                    "Illegal SNI hostname received {:?}",
                    sni
                );
            }
            tracing::warn!(target: "rustlsx", "not rustls: {}", "c".repeat(1000));
        };
        // Through `TextFormat`, which applies the rules (the generic side of `both` is the
        // stock `Full`).
        let (_, text) = both(flood);
        let lines: Vec<&str> = text.lines().collect();
        // One line of the 50 (the others are within the interval), and the other crate's.
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].len() < 512, "{}", lines[0]);
        let cut = 32_000 + 1 + 32_999 + 2 + "Illegal SNI hostname received ".len() - 256;
        assert!(
            lines[0].ends_with(&format!("…({cut} more bytes)")),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains(&"c".repeat(1000)),
            "not cut: {}",
            lines[1]
        );
        // The JSON format, at another place of the same library: cut too.
        let lines = json(|| {
            tracing::error!(target: "h2::codec", value = %sni, "bad frame");
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["target"], "h2::codec");
        assert!(
            lines[0]["value"].as_str().unwrap().len() < 300,
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_place_writes_one_line_per_interval_and_then_the_count_left_out() {
        let lines = PeerLines::default();
        let interval = PEER_LOG_INTERVAL.as_millis() as u64;
        let at = |now| lines.allow_at("rustls::x", 12, Level::WARN, now);
        assert_eq!(at(1), Some(0));
        for t in 2..100 {
            assert_eq!(at(t), None);
        }
        // Another place is not held back by the first.
        assert_eq!(lines.allow_at("rustls::x", 13, Level::WARN, 50), Some(0));
        assert_eq!(at(1 + interval), Some(98));
        assert_eq!(at(2 + interval), None);
        assert_eq!(at(1 + 2 * interval), Some(1));

        let throttle = Throttle::new();
        assert_eq!(throttle.allow_at(1), Some(0));
        assert_eq!(throttle.allow_at(5), None);
        assert_eq!(throttle.allow_at(6), None);
        assert_eq!(throttle.allow_at(1 + interval), Some(2));
    }

    #[test]
    fn the_count_left_out_is_written_after_the_fields() {
        let mut out = String::new();
        SafeVisitor::new(Writer::new(&mut out), true)
            .finish(41)
            .unwrap();
        assert_eq!(out, "suppressed=41");
        // Through the subscriber: the thread's rules reach the field formatter.
        let (text, _) = both(|| {
            let _current = CurrentRules::set(Rules {
                cut: false,
                suppressed: 7,
            });
            tracing::warn!(peer = %"10.0.0.1:1", "TLS alert");
        });
        assert!(
            text.ends_with("TLS alert peer=10.0.0.1:1 suppressed=7\n"),
            "{text}"
        );
    }

    #[test]
    fn peer_libraries_are_told_apart_by_crate() {
        for t in [
            "rustls",
            "rustls::server::hs",
            "h2::proto",
            "hyper",
            "hyper_util::server",
        ] {
            assert!(is_peer_library(t), "{t}");
        }
        for t in [
            "modelgate::server",
            "rustlsx",
            "h2o",
            "kube_runtime::watcher",
            "log",
        ] {
            assert!(!is_peer_library(t), "{t}");
        }
    }
}
