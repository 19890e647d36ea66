//! Cron expressions of scheduled triggers, read in an IANA time zone: five fields (minute
//! hour day-of-month month day-of-week), six with seconds first, or `@hourly`, `@daily`
//! (`@midnight`), `@weekly`, `@monthly`, `@yearly` (`@annually`). Each field takes `*`,
//! values, ranges `a-b`, steps `*/n` and `a-b/n`, and lists; months and weekdays also by
//! name (`jan`, `mon`); weekday 7 is Sunday. As in cron, when both day fields are
//! restricted a day matching either fires. Pure: no I/O.

use jiff::civil::{Date, DateTime, DateTimeRound};
use jiff::tz::TimeZone;
use jiff::{RoundMode, Span, Timestamp, ToSpan, Unit};

/// A parsed expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    days_star: bool,
    weekdays_star: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field: the set of values as a bit mask, and whether it was `*`.
fn field(
    text: &str,
    what: &str,
    min: u32,
    max: u32,
    names: &[&str],
) -> Result<(u64, bool), String> {
    let value = |s: &str| -> Result<u32, String> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            // Months are named from 1, weekdays from 0.
            return Ok(i as u32 + if names.len() == 12 { 1 } else { 0 });
        }
        let n: u32 = s
            .parse()
            .map_err(|_| format!("{what}: {s:?} is not a number or a name"))?;
        if n < min || n > max {
            return Err(format!("{what}: {n} is outside {min}-{max}"));
        }
        Ok(n)
    };
    let mut mask = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 =
                    s.parse()
                        .ok()
                        .filter(|s| *s > 0 && *s <= max)
                        .ok_or_else(|| {
                            format!("{what}: step {s:?} must be a number from 1 to {max}")
                        })?;
                (r, step)
            }
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(format!("{what}: range {range:?} runs backwards"));
            }
            (a, b)
        } else {
            let a = value(range)?;
            // `5/15`: from 5 to the end, every 15.
            (a, if part.contains('/') { max } else { a })
        };
        let mut v = lo;
        while v <= hi {
            mask |= 1 << v;
            v += step;
        }
    }
    // Weekday 7 is Sunday, as in most crons (`1-7`, `sun`, `0` and `7` alike).
    if names.len() == 7 && mask & (1 << 7) != 0 {
        mask = (mask & !(1 << 7)) | 1;
    }
    if mask == 0 {
        return Err(format!("{what}: {text:?} selects nothing"));
    }
    Ok((mask, text == "*" || text == "?"))
}

impl std::str::FromStr for Cron {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => {
                return Err(format!(
                    "{t:?}: known shortcuts are @hourly, @daily, @weekly, @monthly and @yearly"
                ));
            }
            t => t,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match parts.len() {
            5 => ("0", &parts[..]),
            6 => (parts[0], &parts[1..]),
            n => {
                return Err(format!(
                    "{text:?} has {n} fields; write minute hour day-of-month month day-of-week (five), or seconds first (six)"
                ));
            }
        };
        let day_of_week = if rest[4] == "?" { "*" } else { rest[4] };
        let day_of_month = if rest[2] == "?" { "*" } else { rest[2] };
        let (seconds, _) = field(seconds, "seconds", 0, 59, &[])?;
        let (minutes, _) = field(rest[0], "minutes", 0, 59, &[])?;
        let (hours, _) = field(rest[1], "hours", 0, 23, &[])?;
        let (days, days_star) = field(day_of_month, "day of month", 1, 31, &[])?;
        let (months, _) = field(rest[3], "month", 1, 12, &MONTHS)?;
        let (weekdays, weekdays_star) = field(day_of_week, "day of week", 0, 7, &WEEKDAYS)?;
        Ok(Self {
            seconds,
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: weekdays as u8,
            days_star,
            weekdays_star,
        })
    }
}

impl Cron {
    fn day_matches(&self, date: Date) -> bool {
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_star, self.weekdays_star) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        }
    }

    /// The first time after `after` the expression selects, read in `tz` (a civil time a
    /// daylight-saving change skips fires at the first instant after the gap); `None`
    /// when none comes within five years (e.g. `0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = after.to_zoned(tz.clone()).datetime();
        let mut dt = start
            .checked_add(1.second())
            .ok()?
            .with()
            .subsec_nanosecond(0)
            .build()
            .ok()?;
        let limit = start.date().checked_add(5.years()).ok()?;
        let midnight = |d: Date| DateTime::from_parts(d, jiff::civil::Time::midnight());
        let start_of_next = |dt: DateTime, unit: Unit, one: Span| -> Option<DateTime> {
            let truncated = dt.round(DateTimeRound::new().smallest(unit).mode(RoundMode::Trunc));
            truncated.ok()?.checked_add(one).ok()
        };
        while dt.date() <= limit {
            if self.months & (1 << dt.month()) == 0 {
                dt = midnight(dt.date().first_of_month().checked_add(1.month()).ok()?);
                continue;
            }
            if !self.day_matches(dt.date()) {
                dt = midnight(dt.date().tomorrow().ok()?);
                continue;
            }
            if self.hours & (1 << dt.hour()) == 0 {
                dt = start_of_next(dt, Unit::Hour, 1.hour())?;
                continue;
            }
            if self.minutes & (1 << dt.minute()) == 0 {
                dt = start_of_next(dt, Unit::Minute, 1.minute())?;
                continue;
            }
            if self.seconds & (1 << dt.second()) == 0 {
                dt = dt.checked_add(1.second()).ok()?;
                continue;
            }
            let at = tz.to_ambiguous_zoned(dt).compatible().ok()?.timestamp();
            if at > after {
                return Some(at);
            }
            // Repeated civil time after a fall-back change: already past.
            dt = dt.checked_add(1.second()).ok()?;
        }
        None
    }

    /// The latest slot in `(from, now]`, if any (a scheduler that last looked at `from`
    /// fires only the latest slot it missed, as a CronJob does). Looks at most at 100 000
    /// slots.
    pub fn latest_between(
        &self,
        from: Timestamp,
        now: Timestamp,
        tz: &TimeZone,
    ) -> Option<Timestamp> {
        let mut latest = None;
        let mut at = from;
        for _ in 0..100_000 {
            match self.next_after(at, tz) {
                Some(next) if next <= now => {
                    latest = Some(next);
                    at = next;
                }
                _ => break,
            }
        }
        latest
    }
}

/// A time zone by IANA name (`UTC` when unset).
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name {
        None | Some("UTC") => Ok(TimeZone::UTC),
        Some(name) => TimeZone::get(name).map_err(|_| {
            format!("timeZone {name:?} is not an IANA time zone (e.g. Europe/Berlin)")
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str, tz: &TimeZone) -> Timestamp {
        s.parse::<DateTime>()
            .unwrap_or_else(|e| panic!("{e}"))
            .to_zoned(tz.clone())
            .unwrap_or_else(|e| panic!("{e}"))
            .timestamp()
    }

    fn cron(s: &str) -> Cron {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Asserts that `c`, read in UTC, first fires after `after` at `want`.
    fn assert_next_utc(c: &Cron, after: &str, want: &str) {
        let tz = TimeZone::UTC;
        assert_eq!(
            c.next_after(at(after, &tz), &tz),
            Some(at(want, &tz)),
            "after {after}"
        );
    }

    #[test]
    fn weekday_mornings_in_berlin() {
        let tz = time_zone(Some("Europe/Berlin")).unwrap_or_else(|e| panic!("{e}"));
        let c = cron("0 7 * * 1-5");
        // Friday 2026-11-27 08:00 → Monday 07:00.
        let next = c.next_after(at("2026-11-27T08:00", &tz), &tz);
        assert_eq!(next, Some(at("2026-11-30T07:00", &tz)));
        // 07:00 Berlin in winter is 06:00 UTC.
        assert_eq!(
            next.map(|t| t.to_string()),
            Some("2026-11-30T06:00:00Z".into())
        );
    }

    #[test]
    fn steps_lists_names_and_seconds() {
        let c = cron("*/15 9-17 * jan,jul mon");
        assert_next_utc(&c, "2027-01-04T09:05", "2027-01-04T09:15");
        let every_2s = cron("*/2 * * * * *");
        assert_next_utc(&every_2s, "2027-01-04T09:05:01", "2027-01-04T09:05:02");
        assert_eq!(cron("@daily"), cron("0 0 * * *"));
        assert_eq!(cron("0 0 * * 7"), cron("0 0 * * sun"));
        assert_eq!(cron("0 0 * * 1-7"), cron("0 0 * * 0-6"));
        assert_eq!(cron("0 0 * * 5-7"), cron("0 0 * * fri,sat,sun"));
    }

    #[test]
    fn either_day_field_fires_when_both_are_set() {
        // The 13th, or any Friday.
        let c = cron("0 0 13 * 5");
        assert_next_utc(&c, "2026-11-01T00:00", "2026-11-06T00:00");
        assert_next_utc(&c, "2026-11-06T00:00", "2026-11-13T00:00");
    }

    #[test]
    fn a_skipped_hour_fires_after_the_gap() {
        let tz = time_zone(Some("Europe/Berlin")).unwrap_or_else(|e| panic!("{e}"));
        // 2027-03-28 02:30 does not exist in Berlin (02:00 → 03:00).
        let c = cron("30 2 * * *");
        let next = c
            .next_after(at("2027-03-28T01:00", &tz), &tz)
            .unwrap_or_else(|| panic!("no slot"));
        assert_eq!(next.to_string(), "2027-03-28T01:30:00Z");
    }

    #[test]
    fn latest_missed_slot_only() {
        let tz = TimeZone::UTC;
        let c = cron("0 * * * *");
        let latest = c.latest_between(
            at("2026-11-27T01:10", &tz),
            at("2026-11-27T04:20", &tz),
            &tz,
        );
        assert_eq!(latest, Some(at("2026-11-27T04:00", &tz)));
        assert_eq!(
            c.latest_between(
                at("2026-11-27T04:10", &tz),
                at("2026-11-27T04:20", &tz),
                &tz
            ),
            None
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Cron>().err().unwrap_or_default();
        assert!(
            err("0 7 * *").contains("has 4 fields"),
            "{}",
            err("0 7 * *")
        );
        assert!(err("61 * * * *").contains("minutes: 61 is outside 0-59"));
        assert!(err("0 0 * foo *").contains("month: \"foo\""));
        assert!(err("*/0 * * * *").contains("step"));
        assert!(err("1/4294967295 * * * *").contains("step"));
        assert!(err("0 5-1 * * *").contains("backwards"));
        assert!(err("@often").contains("shortcuts"));
        assert!(time_zone(Some("Mars/Olympus")).is_err());
        // A date that never comes.
        assert_eq!(
            cron("0 0 30 2 *").next_after(Timestamp::UNIX_EPOCH, &TimeZone::UTC),
            None
        );
    }
}
