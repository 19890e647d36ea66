//! The repository layer against real SQLite and PostgreSQL databases.

use crate::support::db::{all_dbs, audit_query, message, new_session, proposal, usage};
use kortex::store::*;
use serde_json::json;

#[tokio::test]
async fn sessions_are_private_and_soft_deleted() {
    for db in all_dbs().await {
        let s = &db.store;
        let new = |user: &str, name: &str| NewSession {
            name: name.into(),
            namespace: "default".into(),
            user: user.into(),
            policy: Some("default".into()),
            dynamic_tools: json!([{"name": "open_url"}]),
        };
        let a = s
            .create_session(&new("alice", "incident-1"))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        let _b = s.create_session(&new("bob", "incident-2")).await.unwrap();
        assert_eq!(a.status, "idle");
        let got = s.get_session(&a.id, "alice").await.unwrap();
        assert_eq!(
            got.as_ref().map(|g| &g.dynamic_tools),
            Some(&json!([{"name": "open_url"}])),
            "{}",
            db.url
        );
        assert!(
            s.get_session(&a.id, "bob").await.unwrap().is_none(),
            "other users see nothing"
        );
        let list = s.list_sessions("alice").await.unwrap();
        assert_eq!(
            list.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            vec!["incident-1"]
        );

        assert!(
            s.transition_session(
                &a.id,
                &[SessionState::Idle, SessionState::Failed],
                SessionState::Running
            )
            .await
            .unwrap()
        );
        assert!(
            !s.transition_session(&a.id, &[SessionState::Idle], SessionState::Running)
                .await
                .unwrap(),
            "compare-and-set"
        );

        assert!(!s.delete_session(&a.id, Some("bob")).await.unwrap());
        assert!(s.delete_session(&a.id, Some("alice")).await.unwrap());
        assert!(s.get_session(&a.id, "alice").await.unwrap().is_none());
        assert!(s.list_sessions("alice").await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn messages_keep_order_tool_calls_and_error_flags() {
    for db in all_dbs().await {
        let s = &db.store;
        let session = s.create_session(&new_session("u", "x")).await.unwrap();
        let msgs = [
            message("user", "why is api down?"),
            NewMessage {
                role: "assistant".into(),
                content: "".into(),
                tool_calls: Some(
                    json!([{"id": "c1", "name": "get_logs", "input": {"namespace": "shop"}}]),
                ),
                run_id: Some("r1".into()),
                ..Default::default()
            },
            NewMessage {
                role: "tool".into(),
                content: "forbidden".into(),
                tool_call_id: Some("c1".into()),
                is_error: true,
                ..Default::default()
            },
        ];
        for m in &msgs {
            s.append_message(&session.id, m)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        let stored = s.list_messages(&session.id).await.unwrap();
        assert_eq!(
            stored.iter().map(|m| m.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(
            stored[1]
                .tool_calls
                .as_ref()
                .and_then(|t| t[0]["name"].as_str()),
            Some("get_logs")
        );
        assert!(stored[2].is_error && !stored[0].is_error, "{}", db.url);
        assert_eq!(stored[2].tool_call_id.as_deref(), Some("c1"));
    }
}

/// A page of events stops at about a MiB of data (at least one event), and the next page
/// goes on where it stopped: a follower holds a bounded page however large the events are.
#[tokio::test]
async fn event_pages_are_bounded_by_size() {
    for db in all_dbs().await {
        let s = db.store.clone();
        let session = s.create_session(&new_session("u", "big")).await.unwrap();
        let text = "y".repeat(300 << 10);
        for _ in 0..6 {
            s.append_event(
                &session.id,
                Some("r1"),
                "text.delta",
                &json!({"text": text}),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        s.append_event(
            &session.id,
            Some("r1"),
            "text.delta",
            &json!({"text": "z".repeat(3 << 20)}),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        let seqs =
            |page: &[kortex::store::EventRecord]| page.iter().map(|e| e.seq).collect::<Vec<_>>();
        let page = |after| {
            let s = s.clone();
            let id = session.id.clone();
            async move { s.events_after(&id, after, 500).await.unwrap() }
        };
        let first = page(0).await;
        assert_eq!(seqs(&first), vec![1, 2, 3, 4], "{}", db.url);
        assert_eq!(
            first[3].data["text"].as_str().map(str::len),
            Some(300 << 10)
        );
        assert_eq!(seqs(&page(4).await), vec![5, 6, 7], "{}", db.url);
        // One event larger than a page is a page of its own.
        assert_eq!(seqs(&page(6).await), vec![7], "{}", db.url);
        assert!(page(7).await.is_empty());
    }
}

#[tokio::test]
async fn event_sequence_numbers_are_gapless_under_concurrency() {
    for db in all_dbs().await {
        let s = db.store.clone();
        let session = s.create_session(&new_session("u", "x")).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let s = s.clone();
            let id = session.id.clone();
            tasks.push(tokio::spawn(async move {
                s.append_event(&id, Some("r1"), "text.delta", &json!({"text": i}))
                    .await
                    .map(|e| e.seq)
            }));
        }
        let mut seqs = Vec::new();
        for t in tasks {
            seqs.push(
                t.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{}: {e}", db.url)),
            );
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=20).collect::<Vec<i64>>(), "{}", db.url);
        let replay = s.events_after(&session.id, 15, 100).await.unwrap();
        assert_eq!(
            replay.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![16, 17, 18, 19, 20]
        );
        assert_eq!(replay[0].event_type, "text.delta");
        assert!(
            s.append_event("no-such-session", None, "x", &json!({}))
                .await
                .is_err()
        );
    }
}

/// Many runs appending messages at once (each append reads the next sequence number, then
/// writes, in one transaction): none fails with "database is locked". On SQLite a deferred
/// transaction cannot wait for another writer when it upgrades from reading to writing; the
/// soak benchmark met that as 500s until write transactions began `IMMEDIATE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_never_see_a_locked_database() {
    for db in all_dbs().await {
        let mut tasks = Vec::new();
        for w in 0..16 {
            let s = db.store.clone();
            tasks.push(tokio::spawn(async move {
                let session = s.create_session(&new_session("u", format!("w{w}"))).await?;
                for i in 0..40 {
                    s.append_message(&session.id, &message("user", format!("message {i}")))
                        .await?;
                }
                s.list_messages(&session.id).await.map(|m| m.len())
            }));
        }
        for t in tasks {
            let n = t
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{}: {e}", db.url));
            assert_eq!(n, 40);
        }
    }
}

#[tokio::test]
async fn audit_rows_filter_and_page() {
    for db in all_dbs().await {
        let s = &db.store;
        for i in 0..5 {
            s.record_decision(&NewDecision {
                kind: if i % 2 == 0 {
                    "llm_call".into()
                } else {
                    "tool_call".into()
                },
                session_id: Some("s1".into()),
                subject: format!("call-{i}"),
                outcome: "ok".into(),
                detail: json!({"i": i}),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        let all = s
            .list_decisions(&audit_query(None, 100))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(all.len(), 5);
        let tools = s
            .list_decisions(&audit_query(Some("tool_call"), 100))
            .await
            .unwrap();
        assert_eq!(tools.len(), 2);
        // Paging with the last row's (at, id) returns the rest without overlap.
        let page1 = s.list_decisions(&audit_query(None, 3)).await.unwrap();
        let last = &page1[2];
        let page2 = s
            .list_decisions(&DecisionQuery {
                before: Some((last.at, last.id.clone())),
                ..audit_query(None, 3)
            })
            .await
            .unwrap();
        let mut ids: Vec<String> = page1.iter().chain(&page2).map(|d| d.id.clone()).collect();
        assert_eq!(ids.len(), 5);
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 5, "pages overlap on {}", db.url);
        let none = s
            .list_decisions(&DecisionQuery {
                session_id: Some("other".into()),
                ..audit_query(None, 10)
            })
            .await
            .unwrap();
        assert!(none.is_empty());
    }
}

#[tokio::test]
async fn usage_rolls_up_per_day() {
    for db in all_dbs().await {
        let s = &db.store;
        let day1 = 1_779_408_000_000; // 2026-05-22T00:00:00Z
        let call = |at: i64, provider: &str, model: &str, cost: f64| UsageEvent {
            provider: provider.into(),
            model: model.into(),
            input_tokens: 1000,
            output_tokens: 100,
            latency_ms: 900,
            ..usage("alice", "default", at, cost)
        };
        for u in [
            call(day1 + 10, "anthropic", "claude-opus-4-6", 0.5),
            call(day1 + 20, "anthropic", "claude-haiku-4-6", 0.25),
            call(day1 + 86_400_000, "openai", "gpt-5", 1.0),
        ] {
            s.record_usage(&u)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        let by_provider = s
            .usage_summary("2026-05-22", UsageGroup::Provider)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(by_provider.len(), 2);
        assert_eq!(by_provider[0].key, "openai");
        let anthropic = &by_provider[1];
        assert_eq!(
            (
                anthropic.requests,
                anthropic.input_tokens,
                anthropic.output_tokens
            ),
            (2, 2000, 200)
        );
        assert!((anthropic.cost_usd - 0.75).abs() < 1e-9);
        let by_day = s
            .usage_summary("2026-05-23", UsageGroup::Day)
            .await
            .unwrap();
        assert_eq!(
            by_day.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            vec!["2026-05-23"]
        );
    }
}

#[tokio::test]
async fn proposals_are_decided_once_and_versioned() {
    for db in all_dbs().await {
        let s = &db.store;
        let now = now_ms();
        let p = ProposalRecord {
            namespace: "shop".into(),
            session_name: "incident-42".into(),
            policy: Some("default".into()),
            target: Some(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"}),
            ),
            rationale: "pods stuck".into(),
            blast_radius: Some("one service".into()),
            provider: Some("anthropic".into()),
            model: Some("claude-opus-4-6".into()),
            preview: Some(json!({"before": 1})),
            expires_at: now + 600_000,
            created_at: now,
            updated_at: now,
            ..proposal(Some("s1"), "alice", "restart-api-x7k2p", "Pending")
        };
        s.insert_proposal(&p)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        let stored = s
            .get_proposal(&p.id)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(
            stored.as_ref().map(|r| (r.reversible, r.version)),
            Some((Some(true), 1))
        );
        let decision = json!({"verdict": "Approve", "by": "bob"});
        let decided = s
            .decide_proposal(
                &p.id,
                1,
                &decision,
                kortex::crd::ProposalPhase::Approved,
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            (decided.phase, decided.version),
            (kortex::crd::ProposalPhase::Approved, 2)
        );
        // A second decision (even with the right version) is refused.
        let again = s
            .decide_proposal(
                &p.id,
                2,
                &json!({"verdict": "Reject", "by": "carol"}),
                kortex::crd::ProposalPhase::Rejected,
                None,
            )
            .await;
        assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
        // Stale versions lose.
        assert!(
            s.update_proposal_phase(
                &p.id,
                1,
                kortex::crd::ProposalPhase::Executing,
                None,
                None,
                None
            )
            .await
            .is_err()
        );
        let exec = s
            .update_proposal_phase(
                &p.id,
                2,
                kortex::crd::ProposalPhase::Succeeded,
                Some("restarted"),
                None,
                Some(&json!({"revision": 3})),
            )
            .await
            .unwrap();
        assert_eq!(
            exec.preview,
            Some(json!({"before": 1})),
            "preview kept when not given"
        );
        assert_eq!(exec.undo, Some(json!({"revision": 3})));
        let pending = s.list_proposals(Some("Pending"), 10).await.unwrap();
        assert!(pending.is_empty());
        assert_eq!(s.list_proposals(None, 10).await.unwrap().len(), 1);
    }
}

/// A standalone execution whose process stopped is failed once its time limit and grace
/// are past (never run again); one still within them is left to finish.
#[tokio::test]
async fn an_execution_outliving_its_time_limit_is_failed_as_interrupted() {
    for db in all_dbs().await {
        let s = &db.store;
        let now = now_ms();
        let executing = |id: &str, since: i64| ProposalRecord {
            id: id.into(),
            namespace: "shop".into(),
            session_name: "incident-1".into(),
            policy: Some("default/ops".into()),
            reversible: None,
            decision: Some(json!({"verdict": "Approve", "by": "bob"})),
            message: Some("approved by bob; executing".into()),
            expires_at: since + 600_000,
            created_at: since,
            updated_at: since,
            version: 2,
            ..proposal(None, "alice", &format!("restart-{id}"), "Executing")
        };
        let stopped = new_id();
        let running = new_id();
        for p in [
            executing(&stopped, now - 5 * 60_000),
            executing(&running, now - 60_000),
        ] {
            s.insert_proposal(&p)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        let engine = bare_engine(s);
        let ended = kortex::chat::proposals::expire(&engine)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(ended, 1, "{}", db.url);
        let phase = |id: String| async move {
            s.get_proposal(&id)
                .await
                .unwrap()
                .map(|p| (p.phase, p.message.unwrap_or_default()))
                .unwrap_or_default()
        };
        let (p, message) = phase(stopped).await;
        assert_eq!(p, "Failed", "{}", db.url);
        assert!(message.starts_with("interrupted"), "{message}");
        assert_eq!(
            phase(running).await.0,
            kortex::crd::ProposalPhase::Executing,
            "{}",
            db.url
        );
    }
}

#[tokio::test]
async fn migrations_are_idempotent_and_the_database_file_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let url = format!("sqlite://{}", path.display());
    let store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.expect("second run");
    assert!(path.exists());
    assert!(store.ping().await);
    let err = Store::connect("mysql://x")
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("unsupported database URL"), "{err}");
}

#[tokio::test]
async fn runs_of_a_dead_replica_are_failed_and_their_tool_calls_answered() {
    for db in all_dbs().await {
        let s = &db.store;
        let session = s.create_session(&new_session("u", "x")).await.unwrap();
        // A replica started a run, the model called a tool, then the replica died.
        assert!(
            s.transition_session(&session.id, &[SessionState::Idle], SessionState::Running)
                .await
                .unwrap()
        );
        s.create_run("run-1", &session.id, "dead-replica", "someone", None)
            .await
            .unwrap();
        s.append_message(&session.id, &message("user", "q"))
            .await
            .unwrap();
        s.append_message(
            &session.id,
            &NewMessage {
                role: "assistant".into(),
                run_id: Some("run-1".into()),
                tool_calls: Some(json!([{"id": "c1", "name": "get_logs", "input": {}}])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let engine = bare_engine(s);

        // A live run (fresh heartbeat) is never touched.
        assert_eq!(
            engine.recover(now_ms() - 60_000).await.unwrap(),
            0,
            "{}",
            db.url
        );
        // Stale: recovered once, by whoever notices first.
        assert_eq!(engine.recover(now_ms() + 1).await.unwrap(), 1, "{}", db.url);
        assert_eq!(engine.recover(now_ms() + 1).await.unwrap(), 0);
        let got = s
            .get_session(&session.id, "u")
            .await
            .unwrap()
            .expect("gone");
        assert_eq!(got.status, "failed");
        let messages = s.list_messages(&session.id).await.unwrap();
        let last = messages.last().expect("no messages");
        assert_eq!(
            (
                last.role.as_str(),
                last.tool_call_id.as_deref(),
                last.is_error
            ),
            ("tool", Some("c1"), true)
        );
        let events = s.events_after(&session.id, 0, 10).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(kinds, vec!["error", "run.lifecycle"]);
        assert_eq!(events[1].data["state"], "failed");
    }
}

#[tokio::test]
async fn past_incidents_are_found_by_every_word() {
    for db in all_dbs().await {
        let s = &db.store;
        let session = |name: &str| NewSession {
            name: name.into(),
            namespace: "shop".into(),
            user: "alice".into(),
            policy: None,
            dynamic_tools: json!([]),
        };
        let old = s
            .create_session(&session("incident-17"))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        for (role, content) in [
            ("user", "checkout pods are OOMKilled after the 2.3 rollout"),
            (
                "assistant",
                "The new image raised memory use; rolling back fixed it.",
            ),
        ] {
            s.append_message(&old.id, &message(role, content))
                .await
                .unwrap();
        }
        let unrelated = s.create_session(&session("capacity-review")).await.unwrap();
        s.append_message(
            &unrelated.id,
            &message("user", "how much memory does search use? 100%_of it"),
        )
        .await
        .unwrap();
        let now = now_ms();
        let proposal = ProposalRecord {
            namespace: "shop".into(),
            session_name: "incident-17".into(),
            action: "rollback".into(),
            target: Some(json!({"kind": "Deployment", "namespace": "shop", "name": "checkout"})),
            params: Some(json!({"toRevision": 6})),
            rationale: "Pods OOMKilled since revision 7".into(),
            decision: Some(json!({"approved": true, "by": "bob"})),
            message: Some("rolled back to revision 6".into()),
            expires_at: now + 600_000,
            created_at: now,
            updated_at: now,
            ..proposal(
                Some(&old.id),
                "alice",
                "rollback-checkout-a1b2c",
                "Succeeded",
            )
        };
        s.insert_proposal(&proposal).await.unwrap();
        let query = |words: &[&str]| IncidentQuery {
            words: words.iter().map(|w| (*w).to_owned()).collect(),
            since: now - 3_600_000,
            until: now + 3_600_000,
            limit: 10,
            ..Default::default()
        };
        // Case-insensitive, every word, across questions and answers.
        let (sessions, proposals) = s
            .search_incidents(&query(&["oomkilled", "CHECKOUT"]))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(
            sessions.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["incident-17"],
            "{}",
            db.url
        );
        assert_eq!(
            sessions[0].last_answer.as_deref(),
            Some("The new image raised memory use; rolling back fixed it.")
        );
        assert_eq!(proposals.len(), 1, "{}", db.url);
        assert_eq!(
            proposals[0].message.as_deref(),
            Some("rolled back to revision 6")
        );
        // A word that does not occur anywhere rules a row out.
        let (sessions, proposals) = s
            .search_incidents(&query(&["checkout", "postgres"]))
            .await
            .unwrap();
        assert!(sessions.is_empty() && proposals.is_empty(), "{}", db.url);
        // LIKE wildcards in the query are literal.
        let (sessions, _) = s.search_incidents(&query(&["100%_of"])).await.unwrap();
        assert_eq!(sessions.len(), 1, "{}", db.url);
        let (sessions, _) = s.search_incidents(&query(&["1%f"])).await.unwrap();
        assert!(sessions.is_empty(), "{}", db.url);
        // Target, namespace, window and the asking session narrow the search.
        let mut q = query(&["rollback"]);
        q.target = Some("checkout".into());
        let (_, proposals) = s.search_incidents(&q).await.unwrap();
        assert_eq!(proposals.len(), 1);
        q.target = Some("payments".into());
        let (_, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(proposals.is_empty());
        let mut q = query(&["checkout"]);
        q.namespace = Some("other".into());
        let (_, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(proposals.is_empty());
        // Sessions are private to their user and their namespace; proposals are shared
        // within the namespace of the sessions that raised them.
        let mut q = query(&["checkout"]);
        (q.user, q.session_namespace) = (Some("bob".into()), Some("shop".into()));
        let (sessions, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(sessions.is_empty(), "{}: {sessions:?}", db.url);
        assert_eq!(proposals.len(), 1, "{}", db.url);
        (q.user, q.session_namespace) = (Some("alice".into()), Some("elsewhere".into()));
        let (sessions, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(sessions.is_empty() && proposals.is_empty(), "{}", db.url);
        (q.user, q.session_namespace) = (Some("alice".into()), Some("shop".into()));
        let (sessions, proposals) = s.search_incidents(&q).await.unwrap();
        assert_eq!((sessions.len(), proposals.len()), (1, 1), "{}", db.url);
        let mut q = query(&["checkout"]);
        q.since = now + 1_000;
        let (sessions, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(sessions.is_empty() && proposals.is_empty());
        let mut q = query(&["checkout"]);
        q.exclude_session = Some(old.id.clone());
        let (sessions, proposals) = s.search_incidents(&q).await.unwrap();
        assert!(sessions.is_empty() && proposals.is_empty());
    }
}

#[tokio::test]
async fn sessions_are_found_by_name_title_and_text_and_renamed_by_their_owner() {
    for db in all_dbs().await {
        let s = &db.store;
        let oom = s
            .create_session(&new_session("alice", "incident-checkout"))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        let disk = s
            .create_session(&new_session("alice", "incident-disk"))
            .await
            .unwrap();
        let bobs = s
            .create_session(&new_session("bob", "incident-checkout-bob"))
            .await
            .unwrap();
        for (session, text) in [
            (&oom, "Pods were OOMKilled after the 2.3 deploy"),
            (&disk, "the volume is 100% full"),
            (&bobs, "OOMKilled here too"),
        ] {
            s.append_message(&session.id, &message("user", text))
                .await
                .unwrap();
        }
        let names = |found: Vec<kortex::store::SessionRecord>| -> Vec<String> {
            found.into_iter().map(|x| x.name).collect()
        };
        let search = |text: &'static str| s.search_sessions("alice", text);
        // By message text, any case; never another user's.
        assert_eq!(
            names(search("oomkilled").await.unwrap()),
            ["incident-checkout"],
            "{}",
            db.url
        );
        // By name.
        assert_eq!(names(search("DISK").await.unwrap()), ["incident-disk"]);
        // `%` and `_` are the text searched, not wildcards.
        assert_eq!(names(search("100%").await.unwrap()), ["incident-disk"]);
        assert!(search("1_0").await.unwrap().is_empty());
        // Renamed by its owner, then found by the new title; nobody else may rename it.
        assert!(
            s.rename_session(&oom.id, "alice", "Checkout OOM after 2.3")
                .await
                .unwrap()
        );
        assert!(!s.rename_session(&oom.id, "bob", "mine now").await.unwrap());
        assert_eq!(
            names(search("after 2.3").await.unwrap()),
            ["incident-checkout"]
        );
        let renamed = s
            .get_session(&oom.id, "alice")
            .await
            .unwrap()
            .and_then(|x| x.title);
        assert_eq!(renamed.as_deref(), Some("Checkout OOM after 2.3"));
    }
}

/// Eval results: stored with an id and time, listed oldest first, by label, with or
/// without their reports; a session's usage summed.
#[tokio::test]
async fn eval_results_are_kept_and_listed() {
    use kortex::store::EvalRun;
    for db in all_dbs().await {
        let s = &db.store;
        for (label, passed) in [
            ("kortex/default", 3),
            ("ollama/qwen", 1),
            ("kortex/default", 4),
        ] {
            s.record_eval(&EvalRun {
                id: String::new(),
                at: 0,
                label: label.into(),
                kind: "policy".into(),
                suite: "evals".into(),
                scenarios: 5,
                attempts: 5,
                passed,
                input_tokens: 1000,
                output_tokens: 100,
                cost_usd: 0.25,
                report: json!({"label": label, "results": [{"name": "a"}]}),
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        }
        let all = s
            .list_evals(0, None, false, 100)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(
            all.iter().map(|r| r.passed).collect::<Vec<_>>(),
            vec![3, 1, 4],
            "{}",
            db.url
        );
        assert!(
            all.iter()
                .all(|r| r.report.is_null() && !r.id.is_empty() && r.at > 0)
        );
        assert!((all[0].cost_usd - 0.25).abs() < 1e-9);
        let one = s
            .list_evals(0, Some("kortex/default"), true, 100)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(one.len(), 2, "{}", db.url);
        assert_eq!(one[1].report["results"][0]["name"], "a");
        let none = s
            .list_evals(kortex::store::now_ms() + 60_000, None, false, 100)
            .await
            .unwrap();
        assert!(none.is_empty());
        assert_eq!(
            s.session_usage("no-such-session")
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", db.url))
                .calls,
            0
        );
    }
}

/// Trigger events on both databases: recorded all at once; per group only the oldest
/// pending one is offered, and only while no live claim holds it; settling needs the
/// claim; a schedule slot and the hourly skip notice are each claimed once.
#[tokio::test]
async fn trigger_events_are_claimed_in_order_and_settled_once() {
    for db in all_dbs().await {
        let s = &db.store;
        let event = |group: &str, n: i64| NewTriggerEvent {
            policy: "default/incidents".into(),
            trigger: "crashloops".into(),
            kind: "alert",
            group_key: group.into(),
            caller: "alertmanager".into(),
            payload: json!({"n": n}),
        };
        let ids = s
            .record_trigger_events(&[event("g1", 1), event("g1", 2), event("g2", 1)])
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.url));
        assert_eq!(ids.len(), 3);
        let now = now_ms();
        let offered =
            |list: Vec<TriggerEvent>| list.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        let pending = s.pending_trigger_events(now, 10).await.unwrap();
        assert_eq!(
            offered(pending),
            vec![ids[0].clone(), ids[2].clone()],
            "{}: the oldest of each group",
            db.url
        );
        // Replica A claims g1's first event; B cannot, and is not offered it.
        assert!(
            s.claim_trigger_event(&ids[0], "a", now + 60_000)
                .await
                .unwrap()
        );
        assert!(
            !s.claim_trigger_event(&ids[0], "b", now + 60_000)
                .await
                .unwrap()
        );
        let pending = s.pending_trigger_events(now_ms(), 10).await.unwrap();
        assert_eq!(offered(pending), vec![ids[2].clone()], "{}", db.url);
        // Only the holder settles it.
        assert!(
            !s.settle_trigger_event(&ids[0], "b", "run", None, None, None)
                .await
                .unwrap()
        );
        assert!(
            s.settle_trigger_event(&ids[0], "a", "unchanged", None, Some("s1"), None)
                .await
                .unwrap()
        );
        assert!(
            !s.settle_trigger_event(&ids[0], "a", "run", None, None, None)
                .await
                .unwrap(),
            "settled once"
        );
        let pending = s.pending_trigger_events(now_ms(), 10).await.unwrap();
        assert_eq!(
            offered(pending),
            vec![ids[1].clone(), ids[2].clone()],
            "{}: g1's next",
            db.url
        );
        // A claim that ran out is taken over.
        assert!(
            s.claim_trigger_event(&ids[1], "a", now_ms() - 1)
                .await
                .unwrap()
        );
        assert!(
            s.claim_trigger_event(&ids[1], "b", now_ms() + 60_000)
                .await
                .unwrap()
        );
        assert!(
            !s.settle_trigger_event(&ids[1], "a", "run", None, None, None)
                .await
                .unwrap()
        );
        // A slot, and the skip notice of an hour, once each.
        let slot = NewTriggerEvent {
            kind: "schedule",
            group_key: "schedule:60".into(),
            ..event("", 0)
        };
        assert!(s.claim_trigger_slot(&slot, 60, "a").await.unwrap());
        assert!(!s.claim_trigger_slot(&slot, 60, "b").await.unwrap());
        let data = json!({"reason": "rate limited"});
        assert!(
            s.note_trigger_skipped("default/incidents", "crashloops", &data)
                .await
                .unwrap()
        );
        assert!(
            !s.note_trigger_skipped("default/incidents", "crashloops", &data)
                .await
                .unwrap()
        );
        let events = s
            .trigger_events("default/incidents", "crashloops", 10)
            .await
            .unwrap();
        assert_eq!(events.len(), 4, "{}", db.url);
        let settled = events
            .iter()
            .find(|e| e.id == ids[0])
            .map(|e| (e.state.clone(), e.session_id.clone()));
        assert_eq!(settled, Some(("unchanged".into(), Some("s1".into()))));
    }
}

/// A chat engine on `store` with no configuration and no tools: for what it does with the
/// database alone (recovery, expiry).
fn bare_engine(store: &Store) -> std::sync::Arc<kortex::chat::Engine> {
    let (_tx, rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(kortex::live::LiveConfig::default()));
    kortex::chat::Engine::new(
        store.clone(),
        rx,
        kortex::tools::Router::new(std::sync::Arc::new(kortex::metrics::Metrics::new())),
    )
}

/// A Slack event retried (or delivered to two replicas at once) is taken once; sign-ins
/// under way are taken once too (a replayed `state` finds nothing).
#[tokio::test]
async fn slack_events_and_sign_ins_are_taken_once() {
    for db in all_dbs().await {
        let s = &db.store;
        let (a, b) = tokio::join!(s.claim_slack_event("Ev1"), s.claim_slack_event("Ev1"));
        assert!(
            a.unwrap() ^ b.unwrap(),
            "{}: exactly one replica takes it",
            db.url
        );
        assert!(!s.claim_slack_event("Ev1").await.unwrap(), "a retry");
        assert!(s.claim_slack_event("Ev2").await.unwrap());
        let later = kortex::store::now_ms() + 60_000;
        s.put_sign_in("state-hash", "sealed", later).await.unwrap();
        let (a, b) = tokio::join!(s.take_sign_in("state-hash"), s.take_sign_in("state-hash"));
        let taken: Vec<_> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
        assert_eq!(taken, vec!["sealed".to_owned()], "{}", db.url);
        s.put_sign_in("expired", "sealed", kortex::store::now_ms() - 1)
            .await
            .unwrap();
        assert_eq!(s.take_sign_in("expired").await.unwrap(), None);
    }
}
