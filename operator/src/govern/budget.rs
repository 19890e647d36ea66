//! Budget windows, scopes and refusals (SPEC §3 Budgets), as pure functions; the counters
//! themselves live in the database (`Store::reserve_budget`, leased by [`super::lease`]).

use crate::crd::Budget;
use crate::store::BudgetHold;
use jiff::Timestamp;

/// Micro-USD per USD: spend is counted in integers.
pub const MICROS: f64 = 1_000_000.0;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// Counters are kept this long after their window ends (for the policies page).
const KEEP_MS: i64 = 8 * DAY_MS;
/// A session's token counter has no window; it goes when the session has been idle long.
const SESSION_KEEP_MS: i64 = 400 * DAY_MS;

/// Which budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    /// `dailyUsdLimit`.
    #[serde(rename = "dailyUsdLimit")]
    DailyUsd,
    /// `perUserHourlyRequests`.
    #[serde(rename = "perUserHourlyRequests")]
    UserHourlyRequests,
    /// `perSessionTokenCap`.
    #[serde(rename = "perSessionTokenCap")]
    SessionTokens,
}

impl Kind {
    /// The field name in `ChatPolicy.spec.budget`.
    pub fn field(self) -> &'static str {
        match self {
            Self::DailyUsd => "dailyUsdLimit",
            Self::UserHourlyRequests => "perUserHourlyRequests",
            Self::SessionTokens => "perSessionTokenCap",
        }
    }

    /// `amount` in this budget's unit, for people.
    pub fn show(self, amount: i64) -> String {
        match self {
            Self::DailyUsd => format!("${:.2}", amount as f64 / MICROS),
            Self::UserHourlyRequests => format!("{amount} requests"),
            Self::SessionTokens => format!("{amount} tokens"),
        }
    }
}

/// The start of the UTC day of `at_ms`.
pub fn day_start(at_ms: i64) -> i64 {
    at_ms.div_euclid(DAY_MS) * DAY_MS
}

/// The start of the UTC hour of `at_ms`.
pub fn hour_start(at_ms: i64) -> i64 {
    at_ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// One budget of one call: its counter and limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Which budget.
    pub kind: Kind,
    /// Counter scope.
    pub scope: String,
    /// Window start (Unix ms; 0 for the session cap).
    pub window_start: i64,
    /// When the window ends (None: never).
    pub resets_at: Option<i64>,
    /// The limit, when the policy sets one.
    pub limit: Option<i64>,
    expires_at: i64,
}

impl Counter {
    /// The hold of `amount` on this counter.
    pub fn hold(&self, amount: i64, settled: bool) -> BudgetHold {
        BudgetHold {
            scope: self.scope.clone(),
            window_start: self.window_start,
            expires_at: self.expires_at,
            amount,
            limit: self.limit,
            settled,
        }
    }

    /// The actual `amount` used on this counter by a call that drew `lease` (if any).
    pub fn settle(
        &self,
        amount: i64,
        lease: Option<crate::store::LeaseDraw>,
    ) -> crate::store::BudgetSettle {
        crate::store::BudgetSettle {
            scope: self.scope.clone(),
            window_start: self.window_start,
            amount,
            expires_at: self.expires_at,
            lease,
        }
    }

    /// What a call asks of this counter's lease, when it has a limit.
    pub fn want(&self, amount: i64) -> Option<super::budget_lease::Want> {
        self.limit.map(|limit| super::budget_lease::Want {
            scope: self.scope.clone(),
            window_start: self.window_start,
            counter_expires_at: self.expires_at,
            limit,
            amount,
        })
    }

    /// The refusal of a call that needed `wanted` more while `used` is used or reserved.
    pub fn exceeded(&self, policy: &str, used: i64) -> Exceeded {
        Exceeded {
            kind: self.kind,
            policy: policy.to_owned(),
            limit: self.limit.unwrap_or(0),
            used,
            resets_at: self.resets_at,
        }
    }
}

/// The counters of a policy's budgets for one call: the policy's spend today (always kept,
/// for `GET /api/v1/policies`), the user's requests this hour and the session's tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters {
    /// `usd/<ns>/<policy>`, today.
    pub usd: Counter,
    /// `requests/<ns>/<policy>/<user>`, this hour.
    pub requests: Counter,
    /// `tokens/<session>`, when the call belongs to a session.
    pub tokens: Option<Counter>,
}

impl Counters {
    /// The counters of a call at `now_ms` under policy `policy` (`namespace/name`).
    pub fn new(
        policy: &str,
        budget: Option<&Budget>,
        user: &str,
        session: Option<&str>,
        now_ms: i64,
    ) -> Self {
        let day = day_start(now_ms);
        let hour = hour_start(now_ms);
        let budget = budget.cloned().unwrap_or_default();
        Self {
            usd: Counter {
                kind: Kind::DailyUsd,
                scope: usd_scope(policy),
                window_start: day,
                resets_at: Some(day + DAY_MS),
                limit: budget
                    .daily_usd_limit
                    .map(|usd| (usd * MICROS).round() as i64),
                expires_at: day + DAY_MS + KEEP_MS,
            },
            requests: Counter {
                kind: Kind::UserHourlyRequests,
                scope: format!("requests/{policy}/{user}"),
                window_start: hour,
                resets_at: Some(hour + HOUR_MS),
                limit: budget.per_user_hourly_requests.map(i64::from),
                expires_at: hour + HOUR_MS + KEEP_MS,
            },
            tokens: session.map(|s| Counter {
                kind: Kind::SessionTokens,
                scope: format!("tokens/{s}"),
                window_start: 0,
                resets_at: None,
                limit: budget
                    .per_session_token_cap
                    .map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
                expires_at: now_ms + SESSION_KEEP_MS,
            }),
        }
    }
}

/// The counter scope of a policy's daily spend.
pub fn usd_scope(policy: &str) -> String {
    format!("usd/{policy}")
}

/// A refusal: which budget, its limit, what is used, and when it resets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    /// Which budget.
    pub kind: Kind,
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The limit (budget units).
    pub limit: i64,
    /// Used or reserved (budget units).
    pub used: i64,
    /// When the window ends (Unix ms), if it does.
    pub resets_at: Option<i64>,
}

impl Exceeded {
    /// Seconds until the window resets (for `Retry-After`), if it does.
    pub fn retry_after(&self, now_ms: i64) -> Option<u64> {
        self.resets_at
            .map(|at| u64::try_from((at - now_ms).max(0).div_euclid(1000) + 1).unwrap_or(1))
    }
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "budget {} of ChatPolicy {} is exhausted: limit {}, {} used or reserved",
            self.kind.field(),
            self.policy,
            self.kind.show(self.limit),
            self.kind.show(self.used),
        )?;
        match self
            .resets_at
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        {
            Some(at) => write!(f, "; it resets at {at}"),
            None => write!(f, "; it does not reset (start a new session)"),
        }
    }
}

/// What a call is estimated to cost, in micro-USD, before it is made: the input as
/// estimated and the whole output allowance, so that a reservation covers the worst case.
pub fn estimate_micros(
    cost: Option<&crate::crd::ModelCost>,
    input_tokens: u64,
    max_output: u64,
) -> i64 {
    cost.map_or(0, |c| {
        ((input_tokens as f64 * c.input_usd_per_m_tok + max_output as f64 * c.output_usd_per_m_tok)
            / 1e6
            * MICROS)
            .ceil() as i64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-23T07:13:32.500Z
    const NOW: i64 = 1_795_418_012_500;

    #[test]
    fn windows_are_fixed_utc_days_and_hours() {
        assert_eq!(
            Timestamp::from_millisecond(day_start(NOW))
                .map(|t| t.to_string())
                .unwrap_or_default(),
            "2026-11-23T00:00:00Z"
        );
        assert_eq!(
            Timestamp::from_millisecond(hour_start(NOW))
                .map(|t| t.to_string())
                .unwrap_or_default(),
            "2026-11-23T07:00:00Z"
        );
        assert_eq!(day_start(day_start(NOW)), day_start(NOW));
    }

    #[test]
    fn counters_carry_the_policy_limits_in_integer_units() {
        let budget = Budget {
            daily_usd_limit: Some(50.25),
            per_user_hourly_requests: Some(30),
            per_session_token_cap: Some(200_000),
            alert_at_percent: Some(80),
            ..Default::default()
        };
        let c = Counters::new("ops/incidents", Some(&budget), "alice", Some("s1"), NOW);
        assert_eq!(c.usd.scope, "usd/ops/incidents");
        assert_eq!(c.usd.limit, Some(50_250_000));
        assert_eq!(c.requests.scope, "requests/ops/incidents/alice");
        assert_eq!(c.requests.limit, Some(30));
        assert_eq!(c.tokens.as_ref().and_then(|t| t.limit), Some(200_000));
        let none = Counters::new("ops/incidents", None, "alice", None, NOW);
        assert_eq!(
            (none.usd.limit, none.requests.limit, none.tokens),
            (None, None, None)
        );
    }

    #[test]
    fn refusals_name_the_budget_the_limit_and_the_reset() {
        let c = Counters::new(
            "ops/incidents",
            Some(&Budget {
                daily_usd_limit: Some(50.0),
                ..Default::default()
            }),
            "alice",
            Some("s1"),
            NOW,
        );
        let e = c.usd.exceeded("ops/incidents", 49_990_000);
        assert_eq!(
            e.to_string(),
            "budget dailyUsdLimit of ChatPolicy ops/incidents is exhausted: limit $50.00, $49.99 used or reserved; it resets at 2026-11-24T00:00:00Z"
        );
        assert_eq!(e.retry_after(NOW), Some(60_388));
        let t = c
            .tokens
            .as_ref()
            .map(|t| t.exceeded("ops/incidents", 10))
            .map(|e| e.to_string());
        assert!(t.is_some_and(|t| t.ends_with("does not reset (start a new session)")));
    }

    #[test]
    fn estimates_cover_the_whole_output_allowance() {
        let cost = crate::crd::ModelCost {
            input_usd_per_m_tok: 15.0,
            output_usd_per_m_tok: 75.0,
        };
        // 10k input tokens and 4096 output tokens: 0.15 + 0.3072 USD.
        assert_eq!(estimate_micros(Some(&cost), 10_000, 4096), 457_200);
        assert_eq!(estimate_micros(None, 10_000, 4096), 0);
    }
}
