//! Durations as Kubernetes writes them, and the time budget of one admission request.
//!
//! The API server calls `/mutate?timeout=10s` (the webhook's `timeoutSeconds`, at most 30s).
//! modelgate answers within that budget minus a margin for the trip back (a fifth of it, at
//! most one second); a request whose body has not arrived by then gets HTTP 408 with a message
//! that says so, instead of leaving the API server to time out with no explanation.

use std::time::Duration;

/// Used when the request names no timeout (the API server's default `timeoutSeconds`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest timeout the API server allows; larger values are clamped to it.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_MARGIN: Duration = Duration::from_secs(1);

/// The time one request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// What the caller asked for (clamped to [`MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// What modelgate allows itself: the timeout less the margin.
    pub budget: Duration,
}

impl Budget {
    pub fn new(timeout: Duration) -> Self {
        let timeout = timeout.min(MAX_TIMEOUT);
        let margin = (timeout / 5).min(MAX_MARGIN);
        Budget {
            timeout,
            budget: timeout - margin,
        }
    }

    /// From a request's query string: `timeout=<duration>`; absent or unreadable values give
    /// [`DEFAULT_TIMEOUT`].
    pub fn from_query(query: Option<&str>) -> Self {
        let timeout = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("timeout="))
            .and_then(|v| parse_duration(v).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_TIMEOUT);
        Budget::new(timeout)
    }
}

/// Parses a Go duration (`10s`, `1m30s`, `500ms`, `1.5s`, `0`): a sequence of decimal
/// numbers, each with a unit among `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`. No sign.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("`{s}` is not a duration such as 15s, 500ms or 1m30s");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (number, tail) = rest.split_at(num_len);
        if number.is_empty() || number == "." {
            return Err(err());
        }
        let value: f64 = number.parse().map_err(|_| err())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total = Duration::try_from_secs_f64(value * seconds_per_unit)
            .ok()
            .and_then(|d| total.checked_add(d))
            .ok_or_else(err)?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in [
            "",
            "10",
            "s",
            "-1s",
            "1x",
            "1.2.3s",
            ".s",
            "1e3s",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn budget_leaves_a_margin() {
        let b = Budget::from_query(Some("timeout=10s"));
        assert_eq!(b.timeout, Duration::from_secs(10));
        assert_eq!(b.budget, Duration::from_secs(9));
        let b = Budget::from_query(Some("x=1&timeout=1s"));
        assert_eq!(b.budget, Duration::from_millis(800));
        assert_eq!(Budget::from_query(None).timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            Budget::from_query(Some("timeout=soon")).timeout,
            DEFAULT_TIMEOUT
        );
        assert_eq!(
            Budget::from_query(Some("timeout=0s")).timeout,
            DEFAULT_TIMEOUT
        );
        assert_eq!(Budget::from_query(Some("timeout=5m")).timeout, MAX_TIMEOUT);
    }

    #[test]
    fn a_client_timeout_beyond_the_api_servers_maximum_is_capped_at_30s() {
        for query in [
            "timeout=31s",
            "timeout=1h",
            "timeout=2562047h",
            // Parses to more seconds than an `Instant` can add.
            "timeout=4000000000000000h",
        ] {
            let b = Budget::from_query(Some(query));
            assert_eq!(b.timeout, MAX_TIMEOUT, "{query}");
            assert_eq!(b.budget, Duration::from_secs(29), "{query}");
            // The request's deadline is computable.
            assert!(std::time::Instant::now().checked_add(b.budget).is_some());
        }
        assert_eq!(
            Budget::from_query(Some("timeout=30s")).timeout,
            Duration::from_secs(30)
        );
    }
}
