//! Retention benchmark (`cargo bench -p kortex --bench retention`): does pruning slow a
//! chat run down? The real `kortex` binary (release build, embedded SQLite unless
//! `KORTEX_BENCH_DATABASE_URL` names an empty PostgreSQL database; `--retention-every 2s
//! --retention-failed-runs 1s`) streams chat runs, 4 in flight at all times, against a
//! scripted provider (50 deltas, 20 ms apart), while:
//!
//! 1. idle: its retention passes find nothing to delete (the database holds 200 000
//!    events of completed runs), for 10 s;
//! 2. pruning: 200 000 events of 200 runs that just failed are deleted by its own retention
//!    pass, in batches of 1 000 rows; five times, seeded again in between (seeding is not
//!    measured). Each pass is found in its log line (`retention pass`, `took_ms`).
//!
//! It reports the latency of the text events (the provider writing a delta to the event
//! reaching the client), p50 and p99, over the idle window and over the passes, their
//! ratio, and how long a pass takes. Results: docs/benchmarks.md (Retention).

mod common;

use common::{Kortex, now_us, pct, stamps};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SESSIONS: usize = 200;
const EVENTS_PER_SESSION: usize = 1000;
const IN_FLIGHT: usize = 4;
const ROUNDS: usize = 5;

/// The provider: 50 deltas, 20 ms apart, each stamped with when it was written.
async fn provider() -> String {
    common::timed_provider(50, Duration::from_millis(20)).await
}

/// 200 sessions, each with a run of 1 000 events (about 200 bytes each): completed, or
/// still `running` (to fail later); `round` keeps the names apart.
async fn seed(url: &str, round: usize, running: bool) {
    use kortex::store::{NewSession, Store};
    let store = Store::connect(url).await.unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let data = format!("{{\"text\":\"{}\"}}", "x".repeat(190));
    for i in 0..SESSIONS {
        let s = store
            .create_session(&NewSession {
                name: format!("old-{round}-{i}"),
                namespace: "default".into(),
                user: "local".into(),
                policy: Some("all".into()),
                dynamic_tools: serde_json::json!([]),
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let run = format!("old-run-{round}-{i}");
        store
            .create_run(&run, &s.id, "seed", &s.user, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {EVENTS_PER_SESSION}) \
             INSERT INTO run_events (session_id, seq, run_id, event_type, data, created_at) \
             SELECT $1, i, $2, 'text.delta', $3, $4 FROM n"
        )))
        .bind(&s.id)
        .bind(&run)
        .bind(&data)
        .bind(kortex::store::now_ms())
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        if !running {
            store
                .finish_run(&run, "completed", None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    pool.close().await;
    store.close().await;
}

/// Every seeded run still running fails now, in one statement: the next retention pass
/// (1 s later at the earliest) deletes their events.
async fn fail_seeded(url: &str) {
    let pool = sqlx::AnyPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    sqlx::query("UPDATE chat_runs SET status = 'failed', finished_at = $1 WHERE owner = 'seed' AND status = 'running'")
        .bind(kortex::store::now_ms())
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    pool.close().await;
}

/// Runs one chat run after another in session `id` until `stop`, recording when every
/// text delta arrived and its latency (µs).
async fn worker(
    client: reqwest::Client,
    kortex: String,
    id: String,
    stop: Arc<AtomicBool>,
    latencies: Arc<Mutex<Vec<(u64, u64)>>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(resp) = client
            .post(format!("{kortex}/chat/v1/sessions/{id}/messages"))
            .header("accept", "text/event-stream")
            .json(&serde_json::json!({"content": "how is it going?"}))
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        common::sse_frames(resp, |frame, received| {
            if frame.contains("event: text.delta") {
                let mut lat = latencies.lock().unwrap_or_else(|e| e.into_inner());
                lat.extend(stamps(frame).map(|sent| (received, received.saturating_sub(sent))));
            }
        })
        .await;
    }
}

fn main() {
    let runtime = common::runtime();
    runtime.block_on(async move {
        now_us();
        let base = provider().await;
        let (dir, db) = common::upstream_manifests(&base, "bench");
        let backend = if db.starts_with("postgres") {
            "PostgreSQL"
        } else {
            "SQLite"
        };
        let seeding = Instant::now();
        seed(&db, 0, false).await;
        println!(
            "{backend}: seeded {} events of {SESSIONS} completed runs in {:.1} s",
            SESSIONS * EVENTS_PER_SESSION,
            seeding.elapsed().as_secs_f64()
        );
        let server = Kortex::start(
            dir.path(),
            &db,
            &["--retention-failed-runs", "1s", "--retention-every", "2s"],
        );
        let kortex = server.url.clone();
        let log = server.log.clone();
        let client = reqwest::Client::new();
        let stop = Arc::new(AtomicBool::new(false));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let mut workers = Vec::new();
        for i in 0..IN_FLIGHT {
            let id = common::create_session(&client, &kortex, &format!("live-{i}")).await;
            workers.push(tokio::spawn(worker(
                client.clone(),
                kortex.clone(),
                id,
                stop.clone(),
                latencies.clone(),
            )));
        }
        // Warm up, then the idle window.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle_from = now_us();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let idle = (idle_from, now_us());
        // The pruning windows: each pass's end is when its log line arrives.
        let mut windows = Vec::new();
        let mut deleted = 0u64;
        let mut seen = log.lock().unwrap_or_else(|e| e.into_inner()).len();
        for round in 1..=ROUNDS {
            seed(&db, round, true).await;
            fail_seeded(&db).await;
            let goal = (round * SESSIONS * EVENTS_PER_SESSION) as u64;
            let deadline = Instant::now() + Duration::from_secs(120);
            while deleted < goal && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let lines: Vec<String> = {
                    let l = log.lock().unwrap_or_else(|e| e.into_inner());
                    let new = l[seen..].to_vec();
                    seen = l.len();
                    new
                };
                let at = now_us();
                for line in lines.iter().filter(|l| l.contains("retention pass")) {
                    let field = |name: &str| {
                        line.split(name)
                            .nth(1)
                            .map(|r| {
                                r.chars()
                                    .take_while(char::is_ascii_digit)
                                    .collect::<String>()
                            })
                            .and_then(|n| n.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    let events = field(" events: ");
                    if events > 0 {
                        deleted += events;
                        windows.push((at.saturating_sub(field("took_ms=") * 1000), at));
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        server.stop();
        let all = std::mem::take(&mut *latencies.lock().unwrap_or_else(|e| e.into_inner()));
        let within = |from: u64, to: u64| -> Vec<u64> {
            all.iter()
                .filter(|(at, _)| (from..=to).contains(at))
                .map(|(_, l)| *l)
                .collect()
        };
        let mut quiet = within(idle.0, idle.1);
        let mut busy: Vec<u64> = windows.iter().flat_map(|(a, b)| within(*a, *b)).collect();
        quiet.sort_unstable();
        busy.sort_unstable();
        let pass_s: Vec<f64> = windows.iter().map(|(a, b)| (b - a) as f64 / 1e6).collect();
        println!("\n{} passes deleted {deleted} events", windows.len());
        println!();
        println!(
            "| {backend} | time measured (s) | text events | latency p50 (ms) | latency p99 (ms) |"
        );
        println!("|---|---|---|---|---|");
        println!(
            "| idle (200 000 events stored) | {:.1} | {} | {:.2} | {:.2} |",
            (idle.1 - idle.0) as f64 / 1e6,
            quiet.len(),
            pct(&quiet, 0.5),
            pct(&quiet, 0.99)
        );
        println!(
            "| pruning 200 000 events, {ROUNDS} times | {:.1} | {} | {:.2} | {:.2} |",
            pass_s.iter().sum::<f64>(),
            busy.len(),
            pct(&busy, 0.5),
            pct(&busy, 0.99)
        );
        println!();
        println!(
            "the passes took {} s; p99 while pruning / idle = {:.2}x (target ≤ 2x)",
            pass_s
                .iter()
                .map(|s| format!("{s:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            pct(&busy, 0.99) / pct(&quiet, 0.99).max(0.001)
        );
        assert_eq!(
            deleted,
            (ROUNDS * SESSIONS * EVENTS_PER_SESSION) as u64,
            "the passes did not delete every seeded event"
        );
    });
}
