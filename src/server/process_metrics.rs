//! Process metrics under the names Prometheus' own client libraries use (client_golang's process
//! collector), read from `/proc/self` on every scrape:
//!
//! | metric | source |
//! |---|---|
//! | `process_cpu_seconds_total` | `utime + stime` of `/proc/self/stat`, in clock ticks |
//! | `process_resident_memory_bytes` | `rss` of `/proc/self/stat`, in pages |
//! | `process_virtual_memory_bytes` | `vsize` of `/proc/self/stat` |
//! | `process_open_fds` | entries of `/proc/self/fd` |
//! | `process_max_fds` | the soft `RLIMIT_NOFILE` |
//! | `process_start_time_seconds` | `btime` of `/proc/stat` plus `starttime` of `/proc/self/stat` |
//!
//! No maintained crate fits: `kubert-prometheus-process` is built on an older prometheus-client
//! (its collector cannot be registered in our registry) and `metrics-process` serves the
//! `metrics` facade. Off Linux the collector exports nothing; a read that fails skips that
//! metric for the scrape rather than failing `/metrics`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// The fields of `/proc/<pid>/stat` used here (proc(5)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Clock ticks in user and kernel mode.
    pub cpu_ticks: u64,
    /// Clock ticks after boot at which the process started.
    pub start_ticks: u64,
    pub virtual_bytes: u64,
    pub resident_pages: u64,
}

impl Stat {
    /// Parses the one line of `/proc/<pid>/stat`. The command name (field 2) is in parentheses
    /// and may itself contain spaces and parentheses, so the fields are counted after its last
    /// `)`.
    pub fn parse(line: &str) -> Option<Stat> {
        let rest = &line[line.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is field 3 (state) of proc(5).
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        Some(Stat {
            cpu_ticks: field(14)? + field(15)?,
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
            resident_pages: field(24)?,
        })
    }
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Collects the process metrics of this process on each scrape.
#[derive(Debug)]
pub struct ProcessCollector {
    ticks_per_second: f64,
    page_bytes: u64,
    /// Fixed for the life of the process, so computed once.
    start_time_seconds: Option<f64>,
}

impl ProcessCollector {
    pub fn new() -> Self {
        let (ticks_per_second, page_bytes) = system_units();
        let start_time_seconds = read_self_stat().and_then(|stat| {
            let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
            Some(boot as f64 + stat.start_ticks as f64 / ticks_per_second)
        });
        ProcessCollector {
            ticks_per_second,
            page_bytes,
            start_time_seconds,
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(target_os = "linux")]
fn system_units() -> (f64, u64) {
    // SAFETY: sysconf only reads a system constant.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        if ticks > 0 { ticks as f64 } else { 100.0 },
        if page > 0 { page as u64 } else { 4096 },
    )
}

#[cfg(not(target_os = "linux"))]
fn system_units() -> (f64, u64) {
    (100.0, 4096)
}

fn read_self_stat() -> Option<Stat> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    Stat::parse(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn open_fds() -> Option<i64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as i64)
}

#[cfg(target_os = "linux")]
fn max_fds() -> Option<i64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    i64::try_from(limit.rlim_cur).ok()
}

#[cfg(not(target_os = "linux"))]
fn max_fds() -> Option<i64> {
    None
}

fn gauge<T>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: Option<T>,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<T>: EncodeMetric,
{
    let Some(value) = value else { return Ok(()) };
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, unit, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = read_self_stat();
        if let Some(stat) = stat {
            let cpu = ConstCounter::new(stat.cpu_ticks as f64 / self.ticks_per_second);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?)?;
        }
        gauge(
            &mut encoder,
            "process_resident_memory",
            "Resident memory size in bytes.",
            Some(&Unit::Bytes),
            stat.map(|s| (s.resident_pages * self.page_bytes) as i64),
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory",
            "Virtual memory size in bytes.",
            Some(&Unit::Bytes),
            stat.map(|s| s.virtual_bytes as i64),
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors.",
            None,
            open_fds(),
        )?;
        gauge(
            &mut encoder,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            None,
            max_fds(),
        )?;
        gauge(
            &mut encoder,
            "process_start_time",
            "Start time of the process since unix epoch in seconds.",
            Some(&Unit::Seconds),
            self.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and a ')' must not shift the fields.
        let line = "4242 (mg (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 7 0 \
                    123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                cpu_ticks: 325,
                start_ticks: 123456,
                virtual_bytes: 987654321,
                resident_pages: 2048,
            })
        );
        assert_eq!(Stat::parse("4242 (truncated) S 1 2"), None);
        assert_eq!(Stat::parse("no parenthesis"), None);
    }

    #[test]
    fn boot_time_from_proc_stat() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1764540000\nprocesses 9\n";
        assert_eq!(parse_boot_time(text), Some(1764540000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn exports_this_process_under_the_client_golang_names() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
        // A test binary has at least a few MiB resident and stdin/stdout/stderr open.
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "start {start}, now {now}"
        );
    }
}
