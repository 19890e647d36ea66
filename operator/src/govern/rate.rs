//! Rate limits of gateway calls (`docs/gateway.md#rate-limits`): requests and tokens per
//! clock minute, per ChatPolicy (all its keys) and per key (its Secret's annotations).
//! Counted like budgets — each replica leases a share of a minute's allowance from the
//! database and draws calls from it in memory — so replicas share one limit without a
//! database round trip per call, and never let more through together than the limit.

use super::Governor;
use super::budget_lease::{NoRoom, Want};
use crate::store::{StoreError, now_ms};

/// One minute.
const WINDOW_MS: i64 = 60_000;

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Calls.
    Requests,
    /// Tokens.
    Tokens,
}

impl Unit {
    /// As in the `x-ratelimit-*-{requests,tokens}` headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
        }
    }

    /// The `x-ratelimit-limit-*`, `-remaining-*` and `-reset-*` header names of this unit.
    pub fn headers(self) -> [&'static str; 3] {
        match self {
            Unit::Requests => [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
            Unit::Tokens => [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        }
    }
}

/// One limit a call counts against.
#[derive(Clone, Debug)]
pub struct Limit {
    /// What is limited: `policy/NS/NAME` or `key/NS/SECRET/TEAM`.
    pub scope: String,
    /// Requests or tokens.
    pub unit: Unit,
    /// Per minute.
    pub per_minute: i64,
}

/// A call refused by a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// Requests or tokens.
    pub unit: Unit,
    /// The limit.
    pub per_minute: i64,
    /// Seconds until the window that refused it ends.
    pub reset_secs: u64,
    /// What is limited (for the message).
    pub scope: String,
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rate limit of {} {} per minute reached ({}); retry in {} s",
            self.per_minute,
            self.unit.as_str(),
            self.scope,
            self.reset_secs
        )
    }
}

fn want(limit: &Limit, amount: i64, now: i64) -> Want {
    let window_start = now - now.rem_euclid(WINDOW_MS);
    Want {
        scope: format!("rate/{}/{}", limit.unit.as_str(), limit.scope),
        window_start,
        counter_expires_at: window_start + 2 * WINDOW_MS,
        limit: limit.per_minute,
        amount,
    }
}

impl Governor {
    /// Counts a call against `limits`: one request on each request limit, `tokens` on each
    /// token limit. All or none: a limit without room refuses the call.
    pub async fn rate_limit(
        &self,
        limits: &[Limit],
        tokens: u64,
    ) -> Result<Result<(), Limited>, StoreError> {
        if limits.is_empty() {
            return Ok(Ok(()));
        }
        let now = now_ms();
        let wants: Vec<Want> = limits
            .iter()
            .map(|l| {
                let amount = match l.unit {
                    Unit::Requests => 1,
                    Unit::Tokens => i64::try_from(tokens).unwrap_or(i64::MAX).max(1),
                };
                want(l, amount, now)
            })
            .collect();
        match self.leases.draw(&self.store, &wants, now).await? {
            Ok(_) => {
                // Nothing is given back: what a call drew stays counted in its minute.
                for w in &wants {
                    self.leases.settled(&w.scope, w.window_start);
                }
                Ok(Ok(()))
            }
            Err(NoRoom { index, .. }) => {
                self.metrics.refused(match limits[index].unit {
                    Unit::Requests => "rate_requests",
                    Unit::Tokens => "rate_tokens",
                });
                let w = &wants[index];
                let left = (w.window_start + WINDOW_MS - now).max(0);
                Ok(Err(Limited {
                    unit: limits[index].unit,
                    per_minute: limits[index].per_minute,
                    reset_secs: u64::try_from((left + 999) / 1000).unwrap_or(60).max(1),
                    scope: limits[index].scope.clone(),
                }))
            }
        }
    }

    /// Counts a finished call's output tokens on `limits` (its token limits), as far as
    /// they have room: the call is over, so nothing is refused — the next calls wait.
    pub async fn rate_count_output(&self, limits: &[Limit], tokens: u64) {
        let token_limits: Vec<Limit> = limits
            .iter()
            .filter(|l| l.unit == Unit::Tokens)
            .cloned()
            .collect();
        if token_limits.is_empty() || tokens == 0 {
            return;
        }
        let now = now_ms();
        for l in &token_limits {
            // Whatever fits of it (a full window refuses nothing more anyway).
            let mut amount = i64::try_from(tokens).unwrap_or(i64::MAX).min(l.per_minute);
            while amount > 0 {
                let w = want(l, amount, now);
                match self
                    .leases
                    .draw(&self.store, std::slice::from_ref(&w), now)
                    .await
                {
                    Ok(Ok(_)) => {
                        self.leases.settled(&w.scope, w.window_start);
                        break;
                    }
                    Ok(Err(_)) => amount /= 2,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot count a call's output tokens on its rate limit");
                        break;
                    }
                }
            }
        }
    }
}

/// The limits of a gateway call: its policy's `rateLimits` and its key's annotations.
pub fn limits_of(
    namespace: &str,
    policy: &str,
    policy_limits: Option<&crate::crd::RateLimits>,
    key: &str,
    key_limits: &crate::crd::RateLimits,
) -> Vec<Limit> {
    let mut out = Vec::new();
    let mut add = |scope: String, limits: &crate::crd::RateLimits| {
        if let Some(n) = limits.requests_per_minute {
            out.push(Limit {
                scope: scope.clone(),
                unit: Unit::Requests,
                per_minute: i64::from(n),
            });
        }
        if let Some(n) = limits.tokens_per_minute {
            out.push(Limit {
                scope,
                unit: Unit::Tokens,
                per_minute: i64::try_from(n).unwrap_or(i64::MAX),
            });
        }
    };
    if let Some(l) = policy_limits {
        add(format!("policy {namespace}/{policy}"), l);
    }
    add(format!("key {key}"), key_limits);
    out
}
