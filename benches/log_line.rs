//! What `serve`'s one `info` line per admission costs the request path: the line as `serve`
//! logs it ([`modelgate::server::log_admission`]), formatted as `serve` formats it (text and
//! JSON), written to a file as a container log is, either straight to the file (one
//! `write(2)` per line) or through `serve`'s buffered writer (a copy per line; a flusher
//! thread writes every 50 ms). Run with `cargo bench --bench log_line`; figures go to
//! docs/benchmarks.md.

use std::fs::File;
use std::hint::black_box;
use std::sync::Mutex;

use criterion::{Criterion, criterion_group, criterion_main};
use modelgate::admission::{Summary, Webhook};
use modelgate::server::log_format::TextFormat;
use modelgate::server::{log_admission, log_writer};
use tracing_subscriber::fmt::MakeWriter;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn summary() -> Summary {
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

fn bench_writer<W>(c: &mut Criterion, name: &str, writer: W, json: bool)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false);
    let dispatch = if json {
        tracing::Dispatch::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .finish(),
        )
    } else {
        tracing::Dispatch::new(builder.event_format(TextFormat::default()).finish())
    };
    let s = summary();
    tracing::dispatcher::with_default(&dispatch, || {
        c.bench_function(name, |b| {
            b.iter(|| log_admission(Webhook::Mutate, black_box(&s), 200, black_box(0.000_123)))
        });
    });
}

fn log_line(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temporary directory");
    for json in [false, true] {
        let format = if json { "json" } else { "text" };
        let file = File::create(dir.path().join(format!("direct-{format}.log"))).unwrap();
        bench_writer(
            c,
            &format!("log line {format}, write(2) per line"),
            Mutex::new(file),
            json,
        );
        let file = File::create(dir.path().join(format!("buffered-{format}.log"))).unwrap();
        let (writer, guard) = log_writer::new(file, log_writer::FLUSH_INTERVAL);
        bench_writer(c, &format!("log line {format}, buffered"), writer, json);
        drop(guard);
    }
}

criterion_group!(benches, log_line);
criterion_main!(benches);
