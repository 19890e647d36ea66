//! Soak benchmark (`cargo bench -p kortex --bench soak`): the real `kortex` binary (release
//! build, `kortex serve`, embedded SQLite unless `KORTEX_BENCH_DATABASE_URL` names a
//! PostgreSQL) holds 1 000 chat sessions, each followed by an open SSE event stream, while
//! 100 runs are in flight at all times against a scripted streaming provider, for 10
//! minutes. Every minute it reports the runs finished, the errors, the latency of the text
//! events (from the provider writing a delta to the event reaching its SSE client, p50 and
//! p99) and the server's resident memory. Results: docs/benchmarks.md.
//!
//! The provider answers each call with 20 deltas 100 ms apart (a run lasts about 2 s); each
//! delta carries the time it was written, which the SSE clients read back. Everything runs
//! on this machine: the provider, the 1 100 clients and Kortex share its cores.
//!
//! `KORTEX_SOAK_SECONDS=N` (default 600), `KORTEX_SOAK_SESSIONS=N` (default 1000),
//! `KORTEX_SOAK_RUNS=N` runs in flight (default 100).

mod common;

use common::{Kortex, env_or, now_us, pct, rss_kib, run_end, sse_field, stamps};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The provider: 20 deltas, 100 ms apart, each stamped with when it was written.
async fn provider() -> String {
    common::timed_provider(20, Duration::from_millis(100)).await
}

/// What every client records, read and reset once a minute.
#[derive(Default)]
struct Tally {
    /// Text event latencies (µs) in this window.
    latencies: Mutex<Vec<u64>>,
    runs: AtomicU64,
    errors: AtomicU64,
    events: AtomicU64,
}

/// Follows one session's event stream for the whole benchmark: records the latency of every
/// text delta and hands each run's end state to the session's worker.
async fn follow(
    client: reqwest::Client,
    url: String,
    ends: tokio::sync::mpsc::UnboundedSender<String>,
    tally: Arc<Tally>,
    errors: Arc<Mutex<Vec<String>>>,
) {
    let resp = match client
        .get(&url)
        .header("accept", "text/event-stream")
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            tally.errors.fetch_add(1, Ordering::Relaxed);
            errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("events: {}", r.status()));
            return;
        }
        Err(e) => {
            tally.errors.fetch_add(1, Ordering::Relaxed);
            errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("events: {e}"));
            return;
        }
    };
    let whole = common::sse_frames(resp, |frame, received| {
        let event = sse_field(frame, "event: ");
        let data = sse_field(frame, "data: ");
        if event.is_empty() {
            return;
        }
        tally.events.fetch_add(1, Ordering::Relaxed);
        if event == "text.delta" {
            let mut lat = tally.latencies.lock().unwrap_or_else(|e| e.into_inner());
            lat.extend(stamps(data).map(|sent| received.saturating_sub(sent)));
        } else if event == "run.lifecycle"
            && let Some(state) = run_end(data)
        {
            let _ = ends.send(state);
        }
    })
    .await;
    if !whole {
        tally.errors.fetch_add(1, Ordering::Relaxed);
        errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push("an event stream broke".into());
    }
}

fn main() {
    let seconds = env_or("KORTEX_SOAK_SECONDS", 600);
    let sessions = env_or("KORTEX_SOAK_SESSIONS", 1000) as usize;
    let in_flight = (env_or("KORTEX_SOAK_RUNS", 100) as usize).clamp(1, sessions);
    let open_files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<usize>().ok())
        })
        .unwrap_or(usize::MAX);
    assert!(
        open_files > 2 * sessions + 1000,
        "{open_files} open files allowed: raise it (ulimit -n {}) for {sessions} streams",
        4 * sessions
    );
    let runtime = common::runtime();
    runtime.block_on(async move {
        now_us();
        let base = provider().await;
        let (dir, db) = common::upstream_manifests(&base, "soak");
        let streams = (sessions + 16).to_string();
        let server = Kortex::start(
            dir.path(),
            &db,
            &["--max-streams-per-user", &streams, "--max-sessions-per-user", &streams],
        );
        let kortex = server.url.clone();
        let pid = server.pid();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(in_flight + 16)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));

        // The sessions and their event streams.
        let tally = Arc::new(Tally::default());
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut ids = Vec::with_capacity(sessions);
        let mut ends: HashMap<String, tokio::sync::mpsc::UnboundedReceiver<String>> = HashMap::new();
        let opened = Instant::now();
        for i in 0..sessions {
            let id = common::create_session(&client, &kortex, &format!("soak-{i}")).await;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            // Each stream on a connection of its own, as 1 000 browsers would.
            let own = reqwest::Client::new();
            tokio::spawn(follow(
                own,
                format!("{kortex}/chat/v1/sessions/{id}/events"),
                tx,
                tally.clone(),
                errors.clone(),
            ));
            ends.insert(id.clone(), rx);
            ids.push(id);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss_idle = rss_kib(pid);
        println!(
            "{sessions} sessions created and followed in {:.1} s; Kortex resident memory {:.1} MiB\n",
            opened.elapsed().as_secs_f64(),
            rss_idle as f64 / 1024.0
        );

        // `in_flight` workers, each running its share of the sessions back to back.
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut shares: Vec<Vec<(String, tokio::sync::mpsc::UnboundedReceiver<String>)>> =
            (0..in_flight).map(|_| Vec::new()).collect();
        for (i, id) in ids.iter().enumerate() {
            let rx = ends.remove(id).unwrap_or_else(|| panic!("no channel"));
            shares[i % in_flight].push((id.clone(), rx));
        }
        let durations = Arc::new(Mutex::new(Vec::<u64>::new()));
        for mut share in shares {
            let client = client.clone();
            let kortex = kortex.clone();
            let tally = tally.clone();
            let errors = errors.clone();
            let durations = durations.clone();
            tokio::spawn(async move {
                let mut next = 0;
                let n = share.len();
                while Instant::now() < deadline {
                    let (id, ends) = &mut share[next % n];
                    next += 1;
                    let started = Instant::now();
                    let r = client
                        .post(format!("{kortex}/chat/v1/sessions/{id}/messages"))
                        .json(&serde_json::json!({"content": "how is it going?"}))
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status().as_u16() == 202 => {}
                        Ok(r) => {
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("post: {status} {text}"));
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                        Err(e) => {
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("post: {e}"));
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                    match tokio::time::timeout(Duration::from_secs(60), ends.recv()).await {
                        Ok(Some(state)) if state == "completed" => {
                            tally.runs.fetch_add(1, Ordering::Relaxed);
                            durations
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(started.elapsed().as_micros() as u64);
                        }
                        other => {
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("run end: {other:?}"));
                        }
                    }
                }
            });
        }

        println!("| minute | runs finished | errors | events | text event latency p50 / p99 (ms) | run p50 / p99 (s) | Kortex RSS (MiB) |");
        println!("|---|---|---|---|---|---|---|");
        let mut minute = 0;
        let mut rss_first = 0;
        let mut rss_peak = 0;
        let mut all_latencies: Vec<u64> = Vec::new();
        let (mut total_runs, mut total_errors, mut total_events) = (0, 0, 0);
        while Instant::now() < deadline + Duration::from_secs(3) {
            let window = Duration::from_secs(60).min(
                (deadline + Duration::from_secs(3)).saturating_duration_since(Instant::now()),
            );
            tokio::time::sleep(window).await;
            minute += 1;
            let mut lat = std::mem::take(&mut *tally.latencies.lock().unwrap_or_else(|e| e.into_inner()));
            let mut dur = std::mem::take(&mut *durations.lock().unwrap_or_else(|e| e.into_inner()));
            lat.sort_unstable();
            dur.sort_unstable();
            let runs = tally.runs.swap(0, Ordering::Relaxed);
            let errs = tally.errors.swap(0, Ordering::Relaxed);
            let events = tally.events.swap(0, Ordering::Relaxed);
            let rss = rss_kib(pid);
            if minute == 1 {
                rss_first = rss;
            }
            rss_peak = rss_peak.max(rss);
            println!(
                "| {minute} | {runs} | {errs} | {events} | {:.1} / {:.1} | {:.2} / {:.2} | {:.1} |",
                pct(&lat, 0.5),
                pct(&lat, 0.99),
                pct(&dur, 0.5) / 1000.0,
                pct(&dur, 0.99) / 1000.0,
                rss as f64 / 1024.0
            );
            total_runs += runs;
            total_errors += errs;
            total_events += events;
            all_latencies.extend(lat);
        }
        all_latencies.sort_unstable();
        let rss_end = rss_kib(pid);
        println!(
            "\n{seconds} s, {sessions} sessions with open event streams, {in_flight} runs in flight: \
             {total_runs} runs, {total_events} events, {total_errors} errors; text event latency \
             p50 {:.1} ms, p99 {:.1} ms; Kortex resident memory {:.1} MiB idle with the streams open, \
             {:.1} MiB after the first minute, {:.1} MiB peak, {:.1} MiB at the end (growth after \
             the first minute {:.1} MiB)",
            pct(&all_latencies, 0.5),
            pct(&all_latencies, 0.99),
            rss_idle as f64 / 1024.0,
            rss_first as f64 / 1024.0,
            rss_peak as f64 / 1024.0,
            rss_end as f64 / 1024.0,
            rss_end.saturating_sub(rss_first) as f64 / 1024.0,
        );
        let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for e in errors.iter().take(10) {
            println!("error: {e}");
        }
        let warnings = server.log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        println!("Kortex logged {} warnings or errors", warnings.len());
        for w in warnings.iter().take(10) {
            println!("  {w}");
        }
        server.stop();
    });
}
