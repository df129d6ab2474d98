//! The time budget of one admission request.
//!
//! The API server calls `/mutate?timeout=10s` (the webhook's `timeoutSeconds`, at most 30s).
//! modelgate answers within that budget minus a margin for the trip back (a fifth of it, at
//! most one second); a request whose body has not arrived by then gets HTTP 408 with a message
//! that says so, instead of leaving the API server to time out with no explanation.

use std::time::Duration;

use crate::duration::parse_duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
