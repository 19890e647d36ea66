//! Budgets on both databases: reservations under concurrency (two "replicas" on one
//! database), settlement from reported usage, request counting, session caps, alerts once
//! per window, and the release of reservations whose call never finished.

use crate::support::db::all_dbs;
use kortex::crd::{Budget, ModelCost};
use kortex::govern::budget::Kind;
use kortex::govern::{Governor, Outcome, Scope};
use kortex::llm::{ChatRequest, Message, Usage};
use kortex::metrics::Metrics;
use kortex::store::Store;
use std::sync::Arc;

/// $300 per million output tokens: a call allowed 1000 output tokens reserves $0.30.
const PRICE: ModelCost = ModelCost {
    input_usd_per_m_tok: 0.0,
    output_usd_per_m_tok: 300.0,
};

fn scope(budget: Budget, user: &str, session: Option<&str>) -> Scope {
    Scope {
        policy: "ops/incidents".into(),
        budget: Some(budget),
        user: user.into(),
        session: session.map(str::to_owned),
        source: "chat",
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![Message::User {
            content: "why is checkout failing?".into(),
        }],
        ..Default::default()
    }
}

fn outcome(output_tokens: u64) -> Outcome {
    Outcome {
        usage: Usage {
            input_tokens: 100,
            output_tokens,
            ..Default::default()
        },
        model: "m".into(),
        latency_ms: 10,
        outcome: "ok".into(),
    }
}

async fn second_replica(url: &str) -> Store {
    let store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    store
}

#[tokio::test]
async fn concurrent_reservations_on_two_replicas_never_overshoot_the_daily_limit() {
    for db in all_dbs().await {
        let replicas = [
            Governor::new(db.store.clone(), Arc::new(Metrics::new())),
            Governor::new(second_replica(&db.url).await, Arc::new(Metrics::new())),
        ];
        let budget = Budget {
            daily_usd_limit: Some(1.0),
            ..Default::default()
        };
        let s = scope(budget, "alice", None);
        let r = request();
        // 16 calls at once, $0.30 reserved each: exactly three fit under $1.00.
        let attempts = (0..16).map(|i| {
            let g = replicas[i % 2].clone();
            let (s, r) = (s.clone(), r.clone());
            async move { g.reserve(&s, "claude", "m", Some(&PRICE), &r, 1000).await }
        });
        let results = futures_util::future::join_all(attempts).await;
        let mut granted = Vec::new();
        let mut refused = Vec::new();
        for result in results {
            match result.unwrap_or_else(|e| panic!("{}: {e}", db.url)) {
                Ok(reservation) => granted.push(reservation),
                Err(e) => refused.push(e),
            }
        }
        assert_eq!(granted.len(), 3, "{}", db.url);
        assert_eq!(refused.len(), 13);
        assert!(
            refused
                .iter()
                .all(|e| e.kind == Kind::DailyUsd && e.limit == 1_000_000)
        );
        assert!(
            refused[0].to_string().starts_with(
                "budget dailyUsdLimit of ChatPolicy ops/incidents is exhausted: limit $1.00"
            ),
            "{}",
            refused[0]
        );
        // Settled from reported usage: 100 output tokens = $0.03 each.
        for reservation in granted {
            replicas[0]
                .settle(reservation, &outcome(100))
                .await
                .unwrap();
        }
        let spent = replicas[1].spent_today("ops/incidents").await.unwrap();
        assert!((spent - 0.09).abs() < 1e-9, "{spent}");
        // The settled budget has room again.
        let again = replicas[1]
            .reserve(&s, "claude", "m", Some(&PRICE), &r, 1000)
            .await
            .unwrap();
        assert!(again.is_ok());
        // Usage rows and the daily roll-up were written with the settlement.
        let rows = db
            .store
            .usage_summary("1970-01-01", kortex::store::UsageGroup::Policy)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].key.as_str(), rows[0].requests),
            ("ops/incidents", 3)
        );
        assert_eq!(rows[0].output_tokens, 300);
    }
}

#[tokio::test]
async fn requests_per_user_hour_and_session_tokens_are_capped() {
    for db in all_dbs().await {
        let g = Governor::new(db.store.clone(), Arc::new(Metrics::new()));
        let budget = Budget {
            per_user_hourly_requests: Some(2),
            per_session_token_cap: Some(5_000),
            ..Default::default()
        };
        let alice = scope(budget.clone(), "alice", Some("s1"));
        for _ in 0..2 {
            let admitted = g.admit(&alice).await.unwrap();
            assert!(admitted.is_ok(), "{}", db.url);
        }
        let refused = g
            .admit(&alice)
            .await
            .unwrap()
            .expect_err("a third request in the hour was admitted");
        assert_eq!(refused.kind, Kind::UserHourlyRequests);
        assert!(
            refused.to_string().contains("limit 2 requests"),
            "{refused}"
        );
        let retry = refused.retry_after(kortex::store::now_ms()).unwrap_or(0);
        assert!((1..=3600).contains(&retry), "{retry}");
        // Another user of the same policy has their own hour.
        let bob = scope(budget.clone(), "bob", Some("s2"));
        assert!(g.admit(&bob).await.unwrap().is_ok());

        // Session tokens: a call reserves its input estimate plus its output allowance.
        let r = request();
        let first = g
            .reserve(&alice, "claude", "m", None, &r, 4000)
            .await
            .unwrap();
        let first = first.unwrap();
        // While it is in flight, a second one does not fit.
        let second = g
            .reserve(&alice, "claude", "m", None, &r, 4000)
            .await
            .unwrap();
        assert_eq!(second.err().map(|e| e.kind), Some(Kind::SessionTokens));
        g.settle(first, &outcome(900)).await.unwrap();
        // 1000 tokens used: 4000 more still fit; then the cap is reached for good.
        let third = g
            .reserve(&alice, "claude", "m", None, &r, 3900)
            .await
            .unwrap();
        let third = third.unwrap();
        g.settle(third, &outcome(3900)).await.unwrap();
        let spent = g
            .admit(&scope(
                Budget {
                    per_session_token_cap: Some(5_000),
                    ..Default::default()
                },
                "alice",
                Some("s1"),
            ))
            .await
            .unwrap()
            .expect_err("a spent session was admitted");
        assert_eq!(spent.kind, Kind::SessionTokens);
        assert!(spent.to_string().contains("start a new session"), "{spent}");
    }
}

#[tokio::test]
async fn alerts_fire_once_per_window_and_dead_reservations_are_released() {
    for db in all_dbs().await {
        let g = Governor::new(db.store.clone(), Arc::new(Metrics::new()));
        let budget = Budget {
            daily_usd_limit: Some(1.0),
            alert_at_percent: Some(50),
            ..Default::default()
        };
        let s = scope(budget, "alice", None);
        let r = request();
        let mut alerts = Vec::new();
        // Three calls of $0.24: the alert comes with the one that crosses $0.50, only then.
        for _ in 0..3 {
            let reservation = g
                .reserve(&s, "claude", "m", Some(&PRICE), &r, 1000)
                .await
                .unwrap()
                .unwrap();
            alerts.push(g.settle(reservation, &outcome(800)).await.unwrap());
        }
        assert_eq!(
            alerts,
            vec![
                Vec::<String>::new(),
                Vec::new(),
                vec!["ChatPolicy ops/incidents has used over 50% of its dailyUsdLimit ($0.72 of $1.00)".to_owned()]
            ],
            "{}",
            db.url
        );
        // A reservation dropped unsettled (a cancelled request) gives its budget back: once
        // its books are written and the replica's unused lease is given back (as at
        // shutdown), nothing is reserved any more.
        let dropped = g
            .reserve(&s, "claude", "m", Some(&PRICE), &r, 900)
            .await
            .unwrap()
            .unwrap();
        drop(dropped);
        let scope_key = kortex::govern::budget::usd_scope("ops/incidents");
        let day = kortex::govern::budget::day_start(kortex::store::now_ms());
        let mut reserved = -1;
        for _ in 0..50 {
            g.release_leases().await;
            reserved = db.store.budget_used(&scope_key, day).await.unwrap().1;
            if reserved == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(reserved, 0, "{}", db.url);
        // A replica that died mid-call: its reservation expires and any replica sweeps it.
        let hold = kortex::store::BudgetHold {
            scope: scope_key.clone(),
            window_start: day,
            expires_at: day + 10 * 86_400_000,
            amount: 250_000,
            limit: Some(1_000_000),
            settled: false,
        };
        let granted = db
            .store
            .reserve_budget("dead-replica-call", &[hold], kortex::store::now_ms() - 1)
            .await
            .unwrap();
        assert!(granted.is_ok());
        let swept = db
            .store
            .sweep_budgets(kortex::store::now_ms())
            .await
            .unwrap();
        assert_eq!(swept, 1);
        let (used, reserved) = db.store.budget_used(&scope_key, day).await.unwrap();
        assert_eq!((used, reserved), (720_000, 0));
        // And the $0.28 left today fit a $0.27 call again.
        let again = g
            .reserve(&s, "claude", "m", Some(&PRICE), &r, 900)
            .await
            .unwrap();
        assert!(again.is_ok(), "{}", db.url);
    }
}

#[tokio::test]
async fn calls_under_no_limit_reserve_nothing_and_are_counted_when_they_settle() {
    for db in all_dbs().await {
        let g = Governor::new(db.store.clone(), Arc::new(Metrics::new()));
        let s = scope(Budget::default(), "alice", Some("s9"));
        let reservation = g
            .reserve(&s, "claude", "m", Some(&PRICE), &request(), 1000)
            .await
            .unwrap()
            .unwrap();
        let day = kortex::govern::budget::day_start(kortex::store::now_ms());
        let usd = kortex::govern::budget::usd_scope("ops/incidents");
        let before = db.store.budget_used(&usd, day).await.unwrap();
        assert_eq!(
            before,
            (0, 0),
            "{}: nothing reserved without a limit",
            db.url
        );
        g.settle(reservation, &outcome(100)).await.unwrap();
        let spent = g.spent_today("ops/incidents").await.unwrap();
        assert!((spent - 0.03).abs() < 1e-9, "{}: {spent}", db.url);
    }
}

/// Budget leases: a replica reserves a chunk of a limited counter once and serves the
/// reservations of many calls from it; the database holds the lease, so a lapsed one is
/// swept like a dead call's and its calls settle without releasing it twice.
#[tokio::test]
async fn a_replica_leases_budget_in_chunks_and_a_swept_lease_is_not_released_twice() {
    for db in all_dbs().await {
        let g = Governor::new(db.store.clone(), Arc::new(Metrics::new()));
        let s = scope(
            Budget {
                daily_usd_limit: Some(100.0),
                ..Default::default()
            },
            "alice",
            None,
        );
        let r = request();
        // 40 calls of $0.03 (100 output tokens each) at once.
        let calls = (0..40).map(|_| g.reserve(&s, "claude", "m", Some(&PRICE), &r, 100));
        let mut held = Vec::new();
        for result in futures_util::future::join_all(calls).await {
            held.push(
                result
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{}: {e}", db.url)),
            );
        }
        let day = kortex::govern::budget::day_start(kortex::store::now_ms());
        let usd = kortex::govern::budget::usd_scope("ops/incidents");
        let (used, reserved) = db.store.budget_used(&usd, day).await.unwrap();
        // One lease covers them all: the calls' $1.20 plus a chunk of at most 5 % ($5).
        assert_eq!(used, 0);
        assert!(
            (1_200_000..=6_200_000).contains(&reserved),
            "{}: {reserved}",
            db.url
        );
        let leases = db.store.leases_of(&usd, day).await.unwrap();
        assert_eq!(leases, 1, "{}: one lease for 40 calls", db.url);
        // Half settle; then the lease lapses (as if this replica had stopped renewing it)
        // and is swept; then the rest settle.
        let rest = held.split_off(20);
        for reservation in held {
            g.settle(reservation, &outcome(50)).await.unwrap();
        }
        let swept = db
            .store
            .sweep_budgets(kortex::store::now_ms() + 6 * 60_000)
            .await
            .unwrap();
        assert_eq!(swept, 1, "{}", db.url);
        for reservation in rest {
            g.settle(reservation, &outcome(50)).await.unwrap();
        }
        let (used, reserved) = db.store.budget_used(&usd, day).await.unwrap();
        // 40 calls of 50 output tokens at $300/M: $0.60, and nothing reserved (not less).
        assert_eq!((used, reserved), (600_000, 0), "{}", db.url);
    }
}
