//! Time windows as the model writes them: `last 30m`, `2h`, `7d`, `1h 30m`, an ISO 8601
//! duration (`PT1H`), an ISO 8601 interval (`2026-11-22T10:00:00Z/2026-11-22T11:00:00Z`,
//! `2026-11-22T10:00:00Z/PT1H`, `PT1H/2026-11-22T11:00:00Z`) or a start time alone.

use jiff::{SignedDuration, Timestamp};

/// A half-open window `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Inclusive.
    pub start: Timestamp,
    /// Exclusive.
    pub end: Timestamp,
}

/// How the window syntax is described to models.
pub const WINDOW_HELP: &str = "a time window: 'last 30m', '2h', '7d', an ISO 8601 duration like 'PT1H', or an ISO 8601 interval like '2026-11-22T10:00:00Z/2026-11-22T11:00:00Z' or '2026-11-22T10:00:00Z/PT1H'";

/// Parses `text` relative to `now`.
pub fn parse(text: &str, now: Timestamp) -> Result<Window, String> {
    let text = text.trim();
    let bad = |why: String| format!("invalid time window {text:?}: {why}; use {WINDOW_HELP}");
    let window = if let Some((a, b)) = text.split_once('/') {
        let (a, b) = (a.trim(), b.trim());
        match (a.parse::<Timestamp>(), b.parse::<Timestamp>()) {
            (Ok(start), Ok(end)) => Window { start, end },
            (Ok(start), Err(_)) => {
                let d = duration(b).map_err(bad)?;
                Window {
                    start,
                    end: start.checked_add(d).map_err(|e| bad(e.to_string()))?,
                }
            }
            (Err(_), Ok(end)) => {
                let d = duration(a).map_err(bad)?;
                Window {
                    start: end.checked_sub(d).map_err(|e| bad(e.to_string()))?,
                    end,
                }
            }
            (Err(e), Err(_)) => return Err(bad(e.to_string())),
        }
    } else if let Ok(start) = text.parse::<Timestamp>() {
        Window { start, end: now }
    } else {
        let d = duration(text.strip_prefix("last").unwrap_or(text).trim()).map_err(bad)?;
        Window {
            start: now.checked_sub(d).map_err(|e| bad(e.to_string()))?,
            end: now,
        }
    };
    if window.start >= window.end {
        return Err(bad("the start is not before the end".into()));
    }
    Ok(window)
}

/// A positive duration: friendly (`30m`, `1h 30m`, `2 hours`, `7d`) or ISO 8601 (`PT1H`).
pub fn duration(text: &str) -> Result<SignedDuration, String> {
    let text = text.trim();
    // Days are 24 hours here (SignedDuration refuses calendar units).
    let parsed = match text.parse::<SignedDuration>() {
        Ok(d) => d,
        Err(first) => {
            let span = text
                .parse::<jiff::Span>()
                .map_err(|_| format!("{text:?} is not a duration ({first})"))?;
            let hours = i64::from(span.get_weeks()) * 168 + i64::from(span.get_days()) * 24;
            let rest = span
                .weeks(0)
                .days(0)
                .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
                .map_err(|e| e.to_string())?;
            SignedDuration::from_hours(hours)
                .checked_add(rest)
                .ok_or_else(|| format!("{text:?} is too long"))?
        }
    };
    if parsed.is_positive() {
        Ok(parsed)
    } else {
        Err(format!("{text:?} is not a positive duration"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn relative_and_iso_windows() {
        let now = ts("2026-11-22T12:00:00Z");
        let cases = [
            ("last 30m", "2026-11-22T11:30:00Z", "2026-11-22T12:00:00Z"),
            ("2h", "2026-11-22T10:00:00Z", "2026-11-22T12:00:00Z"),
            ("7d", "2026-11-15T12:00:00Z", "2026-11-22T12:00:00Z"),
            (
                "last 1h 30m",
                "2026-11-22T10:30:00Z",
                "2026-11-22T12:00:00Z",
            ),
            ("PT15M", "2026-11-22T11:45:00Z", "2026-11-22T12:00:00Z"),
            (
                "2026-11-22T10:00:00Z/2026-11-22T11:00:00Z",
                "2026-11-22T10:00:00Z",
                "2026-11-22T11:00:00Z",
            ),
            (
                "2026-11-22T10:00:00Z/PT1H",
                "2026-11-22T10:00:00Z",
                "2026-11-22T11:00:00Z",
            ),
            (
                "PT1H/2026-11-22T11:00:00Z",
                "2026-11-22T10:00:00Z",
                "2026-11-22T11:00:00Z",
            ),
            (
                "2026-11-22T09:00:00Z",
                "2026-11-22T09:00:00Z",
                "2026-11-22T12:00:00Z",
            ),
        ];
        for (text, start, end) in cases {
            assert_eq!(
                parse(text, now),
                Ok(Window {
                    start: ts(start),
                    end: ts(end)
                }),
                "{text}"
            );
        }
        for bad in [
            "",
            "yesterday",
            "-5m",
            "0s",
            "2026-11-22T11:00:00Z/2026-11-22T10:00:00Z",
        ] {
            let err = match parse(bad, now) {
                Err(e) => e,
                Ok(w) => panic!("{bad:?} parsed as {w:?}"),
            };
            assert!(err.contains("ISO 8601"), "{bad}: {err}");
        }
    }
}
