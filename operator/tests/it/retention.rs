//! Retention, deletion and erasure (docs/storage.md#retention, #erasure) against real
//! SQLite and PostgreSQL databases, with time moved by the test (each pass is asked "as of"
//! days ahead), and erasure on the real binary.

use crate::support::db::{all_dbs, audit_query, message, new_session, proposal, sqlite, usage};
use crate::support::manifests::{chat_key_secret, docs, manifest_dir, policy, provider};
use crate::support::net::{eventually, http_client};
use crate::support::provider::{mock, openai, push, streamed};
use crate::support::server::{Server, kortex_cli};
use kortex::store::retention::{Governs, Scope, Windows};
use kortex::store::*;
use serde_json::json;

const DAY: i64 = 86_400_000;

/// Every `table.column` of the database at `url` whose text contains `needle`.
pub async fn columns_containing(url: &str, needle: &str) -> Vec<String> {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let columns: Vec<(String, String)> = if url.starts_with("sqlite") {
        let tables: Vec<String> = sqlx::query(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>("name"))
        .collect();
        let mut out = Vec::new();
        for t in tables {
            let cols = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT name FROM pragma_table_info('{t}')"
            )))
            .fetch_all(&pool)
            .await
            .unwrap();
            out.extend(cols.iter().map(|r| (t.clone(), r.get::<String, _>("name"))));
        }
        out
    } else {
        sqlx::query(
            "SELECT CAST(table_name AS TEXT) AS t, CAST(column_name AS TEXT) AS c \
             FROM information_schema.columns WHERE table_schema = current_schema()",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<String, _>("t"), r.get::<String, _>("c")))
        .collect()
    };
    assert!(
        columns.len() > 50,
        "{url}: only {} columns seen",
        columns.len()
    );
    let mut hits = Vec::new();
    for (t, c) in columns {
        let n: i64 = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) AS n FROM {t} WHERE CAST({c} AS TEXT) LIKE $1"
        )))
        .bind(format!("%{needle}%"))
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|e| panic!("{t}.{c}: {e}"))
        .get("n");
        if n > 0 {
            hits.push(format!("{t}.{c} ({n})"));
        }
    }
    pool.close().await;
    hits
}

/// Retention, with time moved by the test (each pass is asked "as of" days ahead): what is
/// past its window goes, in batches, with an audit row; what is inside stays; a session with
/// a run in progress or a Pending proposal is never touched.
#[tokio::test]
async fn retention_deletes_what_its_windows_no_longer_keep() {
    // Usage and audit are kept here (their windows are tested apart).
    let windows = [Scope::all(Windows {
        usage_ms: 0,
        audit_ms: 0,
        ..Windows::default()
    })];
    for db in all_dbs().await {
        let s = &db.store;
        let fail = |e: StoreError| -> ! { panic!("{}: {e}", db.url) };
        let session = |name: &'static str| async move {
            s.create_session(&new_session("alice", name))
                .await
                .unwrap_or_else(|e| fail(e))
        };
        // A session with a completed run and a failed one, a message and a stored result.
        let used = session("used").await;
        let mut events = Vec::new();
        for (run, status) in [("r-ok", "completed"), ("r-failed", "failed")] {
            s.create_run(run, &used.id, "replica", "someone", None)
                .await
                .unwrap_or_else(|e| fail(e));
            // More events than one batch, so deletion goes round.
            for i in 0..(if status == "failed" { 1100 } else { 3 }) {
                let e = s
                    .append_event(&used.id, Some(run), "text.delta", &json!({"text": i}))
                    .await
                    .unwrap_or_else(|e| fail(e));
                events.push((run, e.seq));
            }
            s.finish_run(run, status, None)
                .await
                .unwrap_or_else(|e| fail(e));
        }
        s.append_message(&used.id, &message("user", "hi"))
            .await
            .unwrap_or_else(|e| fail(e));
        s.put_tool_result(&used.id, "c1", "get_logs", "long")
            .await
            .unwrap_or_else(|e| fail(e));
        // A session whose run is still going, with a stored result it may still read.
        let busy = session("busy").await;
        s.create_run("r-busy", &busy.id, "replica", "someone", None)
            .await
            .unwrap_or_else(|e| fail(e));
        let kept_result = s
            .put_tool_result(&busy.id, "c2", "get_logs", "long")
            .await
            .unwrap_or_else(|e| fail(e));
        // A session whose proposal waits for a person.
        let waiting = session("waiting").await;
        let now = now_ms();
        s.insert_proposal(&ProposalRecord {
            session_name: "waiting".into(),
            ..proposal(Some(&waiting.id), "alice", "restart-api-r3t3n", "Pending")
        })
        .await
        .unwrap_or_else(|e| fail(e));
        s.set_mcp_owner("mcp-session-1", "alice")
            .await
            .unwrap_or_else(|e| fail(e));

        // Day 5: everything is inside its window.
        let p = s
            .prune(now + 5 * DAY, &windows)
            .await
            .unwrap_or_else(|e| fail(e));
        assert!(p.is_empty(), "{}: {p:?}", db.url);
        // Day 10: stored results go, but not the one a running run may read.
        let p = s
            .prune(now + 10 * DAY, &windows)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(p.tool_results, 1, "{}: {p:?}", db.url);
        let kept = s
            .get_tool_result(&busy.id, &kept_result)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(kept.as_deref(), Some("long"), "{}", db.url);
        // Day 40: the failed run's events go (all 1100, in batches); the completed run's stay.
        let p = s
            .prune(now + 40 * DAY, &windows)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!((p.events, p.sessions), (1100, 0), "{}: {p:?}", db.url);
        let left = s
            .events_after(&used.id, 0, 5000)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(left.len(), 3, "{}", db.url);
        assert!(left.iter().all(|e| e.run_id.as_deref() == Some("r-ok")));
        // Day 100: the idle session goes with all it holds, and the idle MCP transport
        // session; the busy session and the one with a Pending proposal stay.
        let p = s
            .prune(now + 100 * DAY, &windows)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(
            (p.sessions, p.messages, p.events, p.runs, p.mcp_sessions),
            (1, 1, 3, 2, 1),
            "{}: {p:?}",
            db.url
        );
        assert!(
            s.get_session(&used.id, "alice")
                .await
                .unwrap_or_else(|e| fail(e))
                .is_none()
        );
        for kept in [&busy.id, &waiting.id] {
            assert!(
                s.get_session(kept, "alice")
                    .await
                    .unwrap_or_else(|e| fail(e))
                    .is_some(),
                "{}",
                db.url
            );
        }
        assert_eq!(
            s.mcp_owner("mcp-session-1")
                .await
                .unwrap_or_else(|e| fail(e)),
            None
        );
        // Each pass that deleted something says so in the audit log.
        let audit = s
            .list_decisions(&audit_query(Some("deletion"), 100))
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(audit.len(), 3, "{}", db.url);
        assert!(audit.iter().all(|r| r.outcome == "retention"));
        assert_eq!(audit[0].detail["deleted"]["sessions"], 1, "{:?}", audit[0]);
        // A pass with nothing left to delete is a no-op, and writes nothing.
        assert!(
            s.prune(now + 100 * DAY, &windows)
                .await
                .unwrap_or_else(|e| fail(e))
                .is_empty()
        );
    }
}

/// Policies set their own windows (`spec.retention`); the rest follow the flags. Usage rows
/// go past their window while the daily roll-ups (spend) stay; audit rows go last, never
/// before 30 days.
#[tokio::test]
async fn each_policy_keeps_what_its_own_windows_say() {
    for db in all_dbs().await {
        let s = &db.store;
        let fail = |e: StoreError| -> ! { panic!("{}: {e}", db.url) };
        let session = |namespace: &'static str, policy: &'static str| async move {
            s.create_session(&NewSession {
                name: "incident".into(),
                namespace: namespace.into(),
                user: "alice".into(),
                policy: Some(policy.into()),
                dynamic_tools: json!([]),
            })
            .await
            .unwrap_or_else(|e| fail(e))
        };
        let short = session("shop", "short").await;
        let other = session("default", "other").await;
        let now = now_ms();
        for u in [
            usage("alice", "shop/short", now, 0.5),
            usage("alice", "default/other", now, 0.25),
        ] {
            s.record_usage(&u).await.unwrap_or_else(|e| fail(e));
        }
        for (namespace, policy) in [("shop", "short"), ("default", "other")] {
            s.record_decision(&NewDecision {
                kind: "llm_call".into(),
                namespace: Some(namespace.into()),
                policy: Some(policy.into()),
                user: Some("alice".into()),
                subject: "m1".into(),
                outcome: "ok".into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| fail(e));
        }
        let spend = || async {
            s.usage_summary("1970-01-01", UsageGroup::Policy)
                .await
                .unwrap_or_else(|e| fail(e))
        };
        let spent = spend().await;
        assert_eq!(spent.len(), 2, "{}: {spent:?}", db.url);
        let scopes = [
            Scope {
                windows: Windows {
                    sessions_ms: DAY,
                    usage_ms: 10 * DAY,
                    // Raised to 30 days.
                    audit_ms: DAY,
                    ..Windows::default()
                },
                governs: Governs::Policy {
                    namespace: "shop".into(),
                    name: "short".into(),
                },
            },
            Scope {
                windows: Windows::default(),
                governs: Governs::Rest(vec![("shop".into(), "short".into())]),
            },
        ];
        let exists = |id: String| async move {
            s.get_session(&id, "alice")
                .await
                .unwrap_or_else(|e| fail(e))
                .is_some()
        };
        // Day 2: the short policy's idle session goes; the other stays.
        let p = s
            .prune(now + 2 * DAY, &scopes)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(
            (p.sessions, p.usage_events, p.decisions),
            (1, 0, 0),
            "{}: {p:?}",
            db.url
        );
        assert!(!exists(short.id.clone()).await && exists(other.id.clone()).await);
        // Day 11: its usage rows go; spend per policy, from the roll-ups, is unchanged.
        let p = s
            .prune(now + 11 * DAY, &scopes)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!((p.usage_events, p.decisions), (1, 0), "{}: {p:?}", db.url);
        assert_eq!(spend().await, spent, "{}", db.url);
        // Day 31: its audit rows go (30 days, not the 1 asked); the other policy's stay.
        let p = s
            .prune(now + 31 * DAY, &scopes)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!((p.usage_events, p.decisions), (0, 1), "{}: {p:?}", db.url);
        let audit = s
            .list_decisions(&audit_query(Some("llm_call"), 10))
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(audit.len(), 1, "{}", db.url);
        assert_eq!(audit[0].namespace.as_deref(), Some("default"));
        // Day 401: the flags' 90, 400 and 400 days are past for the rest too: its session,
        // usage rows and audit rows (the earlier passes' own deletion rows among them) go.
        let p = s
            .prune(now + 401 * DAY, &scopes)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!((p.sessions, p.usage_events), (1, 1), "{}: {p:?}", db.url);
        assert!(p.decisions >= 4, "{}: {p:?}", db.url);
        assert_eq!(spend().await, spent, "the roll-ups stay: {}", db.url);
    }
}

/// `maxStoredBytesPerUser`: past it, that user's oldest sessions go first; other users and
/// sessions in use are untouched; it is recorded with reason `size_cap`.
#[tokio::test]
async fn past_the_size_cap_a_users_oldest_sessions_go_first() {
    for db in all_dbs().await {
        let s = &db.store;
        let fail = |e: StoreError| -> ! { panic!("{}: {e}", db.url) };
        let mut ids = Vec::new();
        for (user, name) in [
            ("alice", "oldest"),
            ("alice", "busy"),
            ("alice", "middle"),
            ("alice", "newest"),
            ("bob", "only"),
        ] {
            let session = s
                .create_session(&new_session(user, name))
                .await
                .unwrap_or_else(|e| fail(e));
            s.append_message(
                &session.id,
                &NewMessage {
                    role: "user".into(),
                    content: "é".repeat(600), // 1200 bytes
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| fail(e));
            ids.push(session.id);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        s.create_run("r-busy", &ids[1], "replica", "someone", None)
            .await
            .unwrap_or_else(|e| fail(e));
        let scopes = [Scope::all(Windows {
            max_stored_bytes_per_user: Some(3000),
            ..Windows::default()
        })];
        // alice: 4800 bytes; the oldest goes (3600), the busy one stays, the middle goes
        // (2400). bob's 1200 are within.
        let p = s.cap_sizes(&scopes).await.unwrap_or_else(|e| fail(e));
        assert_eq!((p.sessions, p.messages), (2, 2), "{}: {p:?}", db.url);
        let left: Vec<bool> = futures_util::future::join_all(
            ids.iter()
                .zip(["alice", "alice", "alice", "alice", "bob"])
                .map(|(id, user)| async move {
                    s.get_session(id, user)
                        .await
                        .unwrap_or_else(|e| fail(e))
                        .is_some()
                }),
        )
        .await;
        assert_eq!(left, [false, true, false, true, true], "{}", db.url);
        let audit = s
            .list_decisions(&audit_query(Some("deletion"), 10))
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(audit.len(), 1, "{}", db.url);
        assert_eq!(audit[0].outcome, "size_cap");
        assert_eq!(audit[0].detail["reason"], "size_cap");
        assert_eq!(audit[0].detail["deleted"]["sessions"], 2);
        assert!(
            s.cap_sizes(&scopes)
                .await
                .unwrap_or_else(|e| fail(e))
                .is_empty()
        );
    }
}

const ERIN: &str = "erin.example";

/// Erasure: the user's sessions go with all they hold; every other row naming them —
/// usage, audit, proposals they made or decided, run control and plans in others'
/// sessions, others' transcripts — names a keyed hash instead. Spend totals are identical,
/// the audit trail is whole, a Pending proposal survives, and a second erasure is a no-op.
#[tokio::test]
async fn erasure_leaves_no_row_naming_the_user_and_keeps_the_books() {
    for db in all_dbs().await {
        let s = &db.store;
        let fail = |e: StoreError| -> ! { panic!("{}: {e}", db.url) };
        let session = |user: &'static str| async move {
            s.create_session(&NewSession {
                name: format!("incident-{user}"),
                namespace: "default".into(),
                user: user.into(),
                policy: Some("ops".into()),
                dynamic_tools: json!([]),
            })
            .await
            .unwrap_or_else(|e| fail(e))
        };
        let erin = session(ERIN).await;
        let bob = session("bob").await;
        // Erin's own session: a run with events, a message, a stored result, a redirect.
        s.create_run("r-erin", &erin.id, "replica", ERIN, None)
            .await
            .unwrap_or_else(|e| fail(e));
        s.append_event(
            &erin.id,
            Some("r-erin"),
            "text.delta",
            &json!({"text": "hi"}),
        )
        .await
        .unwrap_or_else(|e| fail(e));
        s.add_redirect("r-erin", &erin.id, ERIN, "look at the logs", None)
            .await
            .unwrap_or_else(|e| fail(e));
        s.finish_run("r-erin", "completed", None)
            .await
            .unwrap_or_else(|e| fail(e));
        s.append_message(
            &erin.id,
            &NewMessage {
                role: "user".into(),
                content: "why is checkout slow?".into(),
                author: Some(ERIN.into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| fail(e));
        s.put_tool_result(&erin.id, "c1", "get_logs", "long")
            .await
            .unwrap_or_else(|e| fail(e));
        // Bob's session: Erin paused his run and decided its plan; his transcript says so.
        s.create_run("r-bob", &bob.id, "replica", "bob", None)
            .await
            .unwrap_or_else(|e| fail(e));
        s.append_event(
            &bob.id,
            Some("r-bob"),
            "run.control",
            &json!({"runId": "r-bob", "state": "paused", "by": ERIN}),
        )
        .await
        .unwrap_or_else(|e| fail(e));
        let plan = s
            .add_plan(
                "r-bob",
                &bob.id,
                "c9",
                &json!([{"tool": "get_logs"}]),
                "pending",
            )
            .await
            .unwrap_or_else(|e| fail(e));
        s.decide_plan(&plan, "approved", None, ERIN)
            .await
            .unwrap_or_else(|e| fail(e));
        s.finish_run("r-bob", "completed", None)
            .await
            .unwrap_or_else(|e| fail(e));
        s.append_message(
            &bob.id,
            &message("assistant", format!("The restart was approved by {ERIN}.")),
        )
        .await
        .unwrap_or_else(|e| fail(e));
        s.append_message(
            &bob.id,
            &NewMessage {
                role: "user".into(),
                content: "is it back?".into(),
                author: Some(ERIN.into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| fail(e));
        // Bob shared his session with Erin; Erin shared hers with Bob.
        s.share_session(&bob.id, &[ERIN.to_owned()], &[], Access::Continue, "bob")
            .await
            .unwrap_or_else(|e| fail(e));
        s.share_session(&erin.id, &["bob".to_owned()], &[], Access::Read, ERIN)
            .await
            .unwrap_or_else(|e| fail(e));
        // Erin handed Bob's session back to him with a note naming her.
        s.hand_over(
            &bob,
            ERIN,
            "bob",
            &format!("{ERIN} found the leak; yours again"),
            Some(&format!("{ERIN} traced the OOM to the cache")),
            None,
        )
        .await
        .unwrap_or_else(|e| fail(e));
        // Proposals: Erin's own, still Pending; Bob's, approved by Erin.
        let pending = proposal(Some(&erin.id), ERIN, "restart-api-e1", "Pending");
        s.insert_proposal(&pending)
            .await
            .unwrap_or_else(|e| fail(e));
        let mut decided = proposal(Some(&bob.id), "bob", "restart-api-b1", "Succeeded");
        decided.decision = Some(json!({"verdict": "Approve", "by": ERIN}));
        decided.message = Some(format!("approved by {ERIN}; executing"));
        s.insert_proposal(&decided)
            .await
            .unwrap_or_else(|e| fail(e));
        // Usage and audit rows.
        let now = now_ms();
        for u in [
            usage(ERIN, "default/ops", now, 0.5),
            usage(ERIN, "default/ops", now, 0.25),
            usage("bob", "default/ops", now, 1.0),
        ] {
            s.record_usage(&u).await.unwrap_or_else(|e| fail(e));
        }
        s.record_decision(&NewDecision {
            kind: "proposal".into(),
            namespace: Some("default".into()),
            session_id: Some(bob.id.clone()),
            user: Some(ERIN.into()),
            policy: Some("ops".into()),
            subject: "restart-api-b1".into(),
            outcome: "Approved".into(),
            detail: json!({"by": ERIN, "note": format!("approved by {ERIN}")}),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| fail(e));
        s.set_mcp_owner("mcp-erin", ERIN)
            .await
            .unwrap_or_else(|e| fail(e));
        s.reserve_budget(
            "call-1",
            &[BudgetHold {
                scope: format!("requests/default/ops/{ERIN}"),
                window_start: 0,
                expires_at: now + 3_600_000,
                amount: 1,
                limit: None,
                settled: true,
            }],
            now + 60_000,
        )
        .await
        .unwrap_or_else(|e| fail(e))
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(!columns_containing(&db.url, ERIN).await.is_empty());

        let totals = |group| async move {
            let rows = s
                .usage_summary("1970-01-01", group)
                .await
                .unwrap_or_else(|e| fail(e));
            rows.iter()
                .map(|r| (r.key.clone(), r.requests, (r.cost_usd * 1e6).round() as i64))
                .collect::<Vec<_>>()
        };
        let by_policy = totals(UsageGroup::Policy).await;

        let erased = s
            .erase_user(ERIN, b"erasure key", "admin")
            .await
            .unwrap_or_else(|e| fail(e));
        let hash = erasure::pseudonym(b"erasure key", ERIN);
        assert_eq!(erased.pseudonym, hash);
        assert_eq!(
            (
                erased.deleted.sessions,
                erased.deleted.messages,
                erased.deleted.events,
                erased.deleted.tool_results
            ),
            (1, 1, 1, 1),
            "{}: {erased:?}",
            db.url
        );
        assert_eq!(
            erased.deleted_other, 3,
            "the MCP session, the counter and Bob's share with her: {erased:?}"
        );
        assert_eq!(erased.pseudonymised["usage_events"], 2, "{erased:?}");
        assert_eq!(erased.pseudonymised["proposals"], 2, "{erased:?}");

        // Nothing names her any more, anywhere.
        assert_eq!(
            columns_containing(&db.url, ERIN).await,
            Vec::<String>::new(),
            "{}",
            db.url
        );
        // Spend is identical; per user, her rows add up under the pseudonym.
        assert_eq!(totals(UsageGroup::Policy).await, by_policy, "{}", db.url);
        let by_user = totals(UsageGroup::User).await;
        assert!(by_user.contains(&(hash.clone(), 2, 750_000)), "{by_user:?}");
        assert!(
            by_user.contains(&("bob".to_owned(), 1, 1_000_000)),
            "{by_user:?}"
        );
        // The Pending proposal survives, pseudonymised; Bob's says who approved by hash.
        let kept = s
            .get_proposal(&pending.id)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(
            kept.map(|p| (p.user, p.phase)),
            Some((hash.clone(), kortex::crd::ProposalPhase::Pending))
        );
        let bobs = s
            .get_proposal(&decided.id)
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(
            bobs.and_then(|p| p.decision).map(|d| d["by"].clone()),
            Some(json!(hash))
        );
        // Bob's transcript stays, naming the hash.
        let messages = s.list_messages(&bob.id).await.unwrap_or_else(|e| fail(e));
        assert_eq!(
            messages[0].content,
            format!("The restart was approved by {hash}.")
        );
        // The audit trail: the approval row is kept with the hash, and the erasure is recorded.
        let audit = s
            .list_decisions(&audit_query(None, 100))
            .await
            .unwrap_or_else(|e| fail(e));
        assert!(
            audit
                .iter()
                .any(|r| r.kind == "proposal" && r.user.as_deref() == Some(hash.as_str()))
        );
        let erasures: Vec<_> = audit.iter().filter(|r| r.outcome == "erasure").collect();
        assert_eq!(erasures.len(), 1, "{}", db.url);
        assert_eq!(
            (erasures[0].subject.as_str(), erasures[0].user.as_deref()),
            (hash.as_str(), Some("admin"))
        );
        assert_eq!(erasures[0].detail["deleted"]["sessions"], 1);

        // Again: nothing found, nothing written.
        let again = s
            .erase_user(ERIN, b"erasure key", "admin")
            .await
            .unwrap_or_else(|e| fail(e));
        assert!(again.is_empty(), "{}: {again:?}", db.url);
        let after = s
            .list_decisions(&audit_query(None, 100))
            .await
            .unwrap_or_else(|e| fail(e));
        assert_eq!(after.len(), audit.len());
    }
}

const ERIN_KEY: &str = "kx-erin-0123456789abcdef";
const BOB_KEY: &str = "kx-bob-0123456789abcdef";
const ADMIN_KEY: &str = "kx-admin-0123456789abcdef";

/// On the real binary, in key mode: an admin deletes another user's session and erases a
/// user with `kortex erase-user`; a non-admin may do neither; usage totals stay identical;
/// a second `kortex erase-user` says nothing was left; the database file names her nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_erases_a_user_with_one_command() {
    use serde_json::Value;

    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    let mut yaml = String::new();
    for (user, key, groups) in [
        (ERIN, ERIN_KEY, ""),
        ("bob", BOB_KEY, ""),
        ("root-admin", ADMIN_KEY, "kortex-admins"),
    ] {
        yaml.push_str(&chat_key_secret(user, key, groups));
    }
    yaml.push_str(&docs(&[
        provider(
            "model",
            &format!(
                "type: openai-compatible, baseUrl: '{base}/v1', defaultModel: m1, locality: local"
            ),
        ),
        policy(
            "all",
            "sessions: ['*'], provider: model, retention: {sessions: 30d, audit: 7d}",
        ),
    ]));
    std::fs::write(m.join("all.yaml"), yaml).unwrap();
    let url = format!("sqlite://{}", dir.path().join("k.db").display());
    let (server, api) = Server::start_keyed(
        &m,
        &url,
        &[("KORTEX_ERASURE_KEY", "a key kept in a Secret")],
    );
    let client = http_client();
    let call = |method: reqwest::Method, path: &str, key: &str| {
        client
            .request(method, format!("{api}{path}"))
            .bearer_auth(key)
    };
    let json = |r: reqwest::RequestBuilder| async move {
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or_default())
    };
    // Erin and Bob each ask one question.
    let d = openai();
    let mut sessions = Vec::new();
    for key in [ERIN_KEY, BOB_KEY] {
        push(&script, streamed(&d, (d.text_stream)(&["Noted."])));
        let (status, s) = json(
            call(reqwest::Method::POST, "/chat/v1/sessions", key)
                .json(&serde_json::json!({"name": "incident-7"})),
        )
        .await;
        assert_eq!(status, 201, "{s}");
        let id = s["id"].as_str().unwrap_or_default().to_owned();
        let r = call(
            reqwest::Method::POST,
            &format!("/chat/v1/sessions/{id}/messages"),
            key,
        )
        .header("accept", "text/event-stream")
        .json(&serde_json::json!({"content": "why is checkout slow?"}))
        .send()
        .await
        .unwrap();
        let events = r.text().await.unwrap_or_default();
        assert!(events.contains("completed"), "{events}");
        sessions.push(id);
    }
    // The policy's retention is shown as accepted, its short audit window raised.
    let (_, policies) = json(call(reqwest::Method::GET, "/api/v1/policies", ADMIN_KEY)).await;
    assert!(
        policies
            .to_string()
            .contains("retention.audit is raised to the minimum 30d"),
        "{policies}"
    );

    let totals = || async {
        let (status, u) = json(call(
            reqwest::Method::GET,
            "/api/v1/usage?by=policy",
            ADMIN_KEY,
        ))
        .await;
        assert_eq!(status, 200, "{u}");
        u["totals"].clone()
    };
    let before = totals().await;
    assert_eq!(before["requests"], 2, "{before}");

    // Not an admin: may neither erase nor delete someone else's session (which stays hidden).
    let (status, e) = json(call(
        reqwest::Method::DELETE,
        &format!("/api/v1/users/{ERIN}"),
        BOB_KEY,
    ))
    .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{e}"
    );
    let r = call(
        reqwest::Method::DELETE,
        &format!("/chat/v1/sessions/{}", sessions[0]),
        BOB_KEY,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // An admin may delete Bob's session.
    let r = call(
        reqwest::Method::DELETE,
        &format!("/chat/v1/sessions/{}", sessions[1]),
        ADMIN_KEY,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let (status, _) = json(call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{}", sessions[1]),
        BOB_KEY,
    ))
    .await;
    assert_eq!(status, 404);

    // One command erases Erin.
    let erase = || {
        kortex_cli(
            &["erase-user", ERIN, "--server", &api, "--key", ADMIN_KEY],
            "",
        )
    };
    let out = erase().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = kortex::store::erasure::pseudonym(b"a key kept in a Secret", ERIN);
    assert!(
        stdout.contains("sessions") && stdout.contains(&hash),
        "{stdout}"
    );
    // Her session is gone; usage totals are the same, hers under the pseudonym.
    let (status, _) = json(call(
        reqwest::Method::GET,
        &format!("/chat/v1/sessions/{}", sessions[0]),
        ERIN_KEY,
    ))
    .await;
    assert_eq!(status, 404);
    assert_eq!(totals().await, before);
    let (_, by_user) = json(call(
        reqwest::Method::GET,
        "/api/v1/usage?by=user",
        ADMIN_KEY,
    ))
    .await;
    assert!(
        by_user.to_string().contains(&hash) && !by_user.to_string().contains(ERIN),
        "{by_user}"
    );
    // The audit log says who erased whom (by pseudonym), with counts.
    let (_, audit) = json(call(
        reqwest::Method::GET,
        "/api/v1/audit?kind=deletion",
        ADMIN_KEY,
    ))
    .await;
    let erasure = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["outcome"] == "erasure")
        .cloned()
        .unwrap_or_else(|| panic!("{audit}"));
    assert_eq!(
        (erasure["subject"].as_str(), erasure["user"].as_str()),
        (Some(hash.as_str()), Some("root-admin")),
        "{erasure}"
    );
    assert_eq!(erasure["detail"]["deleted"]["sessions"], 1, "{erasure}");
    // Again: nothing left.
    let out = erase().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("nothing named this user"),
        "{stdout}"
    );
    // The metric counts it.
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("kortex_retention_deleted_total{kind=\"sessions\",reason=\"erasure\"} 1"),
        "{metrics}"
    );
    assert!(server.terminate().success());
    // Bob's session is gone for good too (its background removal ran before shutdown or
    // the next start removes it); Erin is named nowhere in the file.
    let hits = columns_containing(&url, ERIN).await;
    assert_eq!(hits, Vec::<String>::new());
}

/// The pruner passes only while its replica leads (cluster mode), at once when it becomes
/// the leader, and with each policy's `spec.retention` over the flags.
#[tokio::test]
async fn the_pruner_prunes_on_the_leader_only_with_each_policys_windows() {
    use kortex::catalog::{ObjectSet, compile};
    use kortex::cli::pruner;
    use std::sync::Arc;
    use tokio::sync::watch;

    let policy: kortex::crd::ChatPolicy = serde_json::from_value(json!({
        "apiVersion": "kortex.dev/v1alpha1",
        "kind": "ChatPolicy",
        "metadata": {"name": "short", "namespace": "shop"},
        "spec": {"sessions": ["*"], "provider": "p", "retention": {"failedRuns": "1s", "audit": "7d"}},
    }))
    .unwrap();
    let catalog = compile(
        &ObjectSet {
            policies: vec![policy],
            ..Default::default()
        },
        jiff::Timestamp::now(),
    );
    let defaults = Windows::default();
    let scopes = pruner::scopes(&catalog, defaults);
    assert_eq!(scopes.len(), 2);
    assert_eq!(
        (
            scopes[0].windows.failed_runs_ms,
            scopes[0].windows.audit_ms,
            scopes[0].windows.sessions_ms
        ),
        (1000, 7 * DAY, defaults.sessions_ms)
    );
    assert_eq!(
        scopes[1],
        Scope {
            windows: defaults,
            governs: Governs::Rest(vec![("shop".into(), "short".into())]),
        }
    );

    let db = sqlite().await;
    let s = db.store.clone();
    let session = s
        .create_session(&NewSession {
            name: "incident".into(),
            namespace: "shop".into(),
            user: "alice".into(),
            policy: Some("short".into()),
            dynamic_tools: json!([]),
        })
        .await
        .unwrap();
    s.create_run("r1", &session.id, "replica", "someone", None)
        .await
        .unwrap();
    s.append_event(&session.id, Some("r1"), "text.delta", &json!({"text": "x"}))
        .await
        .unwrap();
    s.finish_run("r1", "failed", None).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;

    let config = watch::channel(Arc::new(kortex::live::LiveConfig {
        catalog,
        ..Default::default()
    }));
    let (leader_tx, leader_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics = Arc::new(kortex::metrics::Metrics::new());
    let task = tokio::spawn(pruner::run(
        s.clone(),
        config.1,
        defaults,
        std::time::Duration::from_secs(900),
        metrics,
        Some(leader_rx),
        stop_rx,
    ));
    let events = || async { s.events_after(&session.id, 0, 10).await.unwrap().len() };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        events().await,
        1,
        "a replica that does not lead prunes nothing"
    );
    let _ = leader_tx.send(true);
    eventually("the new leader pruned", || async {
        match events().await {
            0 => Ok(()),
            n => Err(format!("{n} events left")),
        }
    })
    .await;
    let _ = stop_tx.send(true);
    let _ = task.await;
}
