//! Durations as Kubernetes and Go write them (`10s`, `1m30s`, `500ms`): the API server's
//! `?timeout=`, and the flags of `serve` and its watches.

use std::time::Duration;

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
}
