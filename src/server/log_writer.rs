//! `serve`'s log output: lines are appended to a buffer on the request path and written to
//! stderr by a flusher thread every [`FLUSH_INTERVAL`], in order, with one `write(2)` for
//! all the lines of an interval.
//!
//! Why not a queue with a writer thread (`tracing-appender`): at admission rates the queue is
//! empty between lines, so every line wakes the thread, and that wake-up costs more CPU than
//! the `write(2)` it saves (docs/benchmarks.md). Here the thread wakes on a clock, whatever the
//! rate, and the request path only copies its line under an uncontended lock.
//!
//! Nothing is dropped: when the buffer holds [`MAX_BUFFERED`] bytes the line's writer writes
//! the buffer itself, synchronously, as an unbuffered writer would. A line reaches stderr at
//! most one interval late; what a crash (SIGKILL, OOM kill) can lose is that last interval.
//! [`FlushGuard`] writes what is left when `serve` ends; lines logged after that are written
//! synchronously.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How late a line may reach stderr. Below what anyone tailing a log notices, and rare enough
/// that the flusher's wake-ups cost nothing measurable.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// Past this many buffered bytes a line is written synchronously (with everything before it):
/// memory stays bounded when stderr is slower than the log.
pub const MAX_BUFFERED: usize = 1 << 20;

struct Shared<W> {
    /// Held while writing to the sink, and taken before `pending`, so that batches reach the
    /// sink in the order their lines were logged.
    sink: Mutex<W>,
    pending: Mutex<Pending>,
    stopped: Condvar,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    stopping: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain bytes behind: still fine to write.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<W: Write> Shared<W> {
    /// Writes everything buffered so far to the sink.
    fn flush(&self) -> io::Result<()> {
        self.write_through(&[])
    }

    /// Writes everything buffered so far, then `line`, to the sink.
    fn write_through(&self, line: &[u8]) -> io::Result<()> {
        let mut sink = lock(&self.sink);
        let batch = std::mem::take(&mut lock(&self.pending).bytes);
        if batch.is_empty() && line.is_empty() {
            return Ok(());
        }
        sink.write_all(&batch)?;
        sink.write_all(line)?;
        sink.flush()
    }

    fn append(&self, line: &[u8]) -> io::Result<()> {
        {
            let mut pending = lock(&self.pending);
            if !pending.stopping && pending.bytes.len() + line.len() <= MAX_BUFFERED {
                pending.bytes.extend_from_slice(line);
                return Ok(());
            }
        }
        // Over the bound, or the flusher is gone: write now, after what is already buffered.
        self.write_through(line)
    }
}

/// The [`MakeWriter`] to give `tracing_subscriber::fmt()`.
#[derive(Clone)]
pub struct BufferedLog<W> {
    shared: Arc<Shared<W>>,
}

/// Writes what is still buffered and stops the flusher when dropped: keep it alive for as long
/// as `serve` runs.
pub struct FlushGuard<W: Write> {
    shared: Arc<Shared<W>>,
    flusher: Option<thread::JoinHandle<()>>,
}

/// A buffered log over stderr, and the guard that flushes it at the end.
pub fn stderr() -> (BufferedLog<io::Stderr>, FlushGuard<io::Stderr>) {
    new(io::stderr(), FLUSH_INTERVAL)
}

/// A buffered log over `sink`, flushed every `interval`.
pub fn new<W: Write + Send + 'static>(
    sink: W,
    interval: Duration,
) -> (BufferedLog<W>, FlushGuard<W>) {
    let shared = Arc::new(Shared {
        sink: Mutex::new(sink),
        pending: Mutex::new(Pending::default()),
        stopped: Condvar::new(),
    });
    let flusher = {
        let shared = Arc::clone(&shared);
        thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || {
                loop {
                    let stopping = {
                        let pending = lock(&shared.pending);
                        let (pending, _) = shared
                            .stopped
                            .wait_timeout_while(pending, interval, |p| !p.stopping)
                            .unwrap_or_else(PoisonError::into_inner);
                        pending.stopping
                    };
                    // stderr failing (closed) is not something a log line can report.
                    let _ = shared.flush();
                    if stopping {
                        return;
                    }
                }
            })
            .ok()
    };
    (
        BufferedLog {
            shared: Arc::clone(&shared),
        },
        FlushGuard { shared, flusher },
    )
}

impl<W: Write> Drop for FlushGuard<W> {
    fn drop(&mut self) {
        lock(&self.shared.pending).stopping = true;
        self.shared.stopped.notify_all();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        // Also when the flusher could not be started: nothing logged is left behind.
        let _ = self.shared.flush();
    }
}

/// One event's writer: tracing-subscriber formats a line, then hands it over in one
/// `write_all`.
pub struct LineWriter<'a, W> {
    shared: &'a Shared<W>,
}

impl<W: Write> Write for LineWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.append(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for BufferedLog<W> {
    type Writer = LineWriter<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read while the log writes to it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(lock(&self.0).clone()).unwrap()
        }
    }

    fn log_line(log: &BufferedLog<Sink>, line: &str) {
        log.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn lines_wait_for_the_flusher_then_arrive_in_order() {
        let sink = Sink::default();
        // An interval no test run reaches: only the guard flushes.
        let (log, guard) = new(sink.clone(), Duration::from_secs(3600));
        log_line(&log, "one\n");
        log_line(&log, "two\n");
        assert_eq!(sink.text(), "", "buffered, not written per line");
        drop(guard);
        assert_eq!(sink.text(), "one\ntwo\n");
        log_line(&log, "after the guard\n");
        assert_eq!(
            sink.text(),
            "one\ntwo\nafter the guard\n",
            "written at once"
        );
    }

    #[test]
    fn the_flusher_writes_on_its_interval() {
        let sink = Sink::default();
        let (log, _guard) = new(sink.clone(), Duration::from_millis(5));
        log_line(&log, "line\n");
        let waited = std::time::Instant::now();
        while sink.text().is_empty() {
            assert!(waited.elapsed() < Duration::from_secs(30), "never flushed");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.text(), "line\n");
    }

    #[test]
    fn a_full_buffer_is_written_synchronously_and_nothing_is_lost() {
        let sink = Sink::default();
        let (log, guard) = new(sink.clone(), Duration::from_secs(3600));
        let line = format!("{}\n", "x".repeat(1023));
        let lines = MAX_BUFFERED / line.len() + 10;
        for _ in 0..lines {
            log_line(&log, &line);
        }
        let written = sink.text().len();
        assert!(written > 0, "past the bound, the writer wrote itself");
        assert!(lines * line.len() - written <= MAX_BUFFERED, "bounded");
        drop(guard);
        assert_eq!(sink.text(), line.repeat(lines));
    }

    #[test]
    fn lines_from_many_threads_are_whole_and_each_thread_in_order() {
        let sink = Sink::default();
        let (log, guard) = new(sink.clone(), Duration::from_millis(1));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                thread::spawn(move || {
                    for i in 0..2000 {
                        log_line(&log, &format!("t{t} {i:04} {}\n", "y".repeat(i % 700)));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        let mut next = [0usize; 4];
        for line in text.lines() {
            let mut parts = line.split(' ');
            let t: usize = parts.next().unwrap()[1..].parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            assert_eq!(parts.next().unwrap(), "y".repeat(i % 700));
            next[t] += 1;
        }
        assert_eq!(next, [2000; 4]);
    }
}
