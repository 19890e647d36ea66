//! Faults injected from outside into the real binary and real servers (docs/reliability.md).

use crate::support::chat::{
    ask, chat_once, create_session, get_json, item_condition, post_message, read_sse, run_ended,
    session, session_json, state,
};
use crate::support::fake_api::{FakeApi, condition, phase, provider, secret, write_kubeconfig_as};
use crate::support::manifests::{docs, gateway_key, manifest_dir, tool};
use crate::support::net::{eventually, http_client};
use crate::support::plugins::upstream;
use crate::support::provider::{
    Script, json_reply, mock, openai, provider_called, push, streamed, tool_calls,
};
use crate::support::server::{Server, kubectl_kortex, pending_restarts, start_run, start_run_with};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A PostgreSQL of this test's own (Debian's binaries), so that stopping it disturbs no
/// other test.
struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

/// Runs `cmd` as the `postgres` user when we are root (PostgreSQL refuses to run as root).
fn as_postgres(cmd: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let status = if root {
        Command::new("su").args(["postgres", "-c", cmd]).status()
    } else {
        Command::new("sh").args(["-c", cmd]).status()
    };
    status.is_ok_and(|s| s.success())
}

impl Postgres {
    fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .max()?;
        let dir = tempfile::tempdir().ok()?;
        let _ = Command::new("chown")
            .args(["postgres:postgres", &dir.path().display().to_string()])
            .status();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .ok()?;
        let data = dir.path().join("data");
        let ok = as_postgres(&format!(
            "{}/initdb -D {} -A trust -U kortex --no-sync >/dev/null",
            bin.display(),
            data.display()
        ));
        assert!(ok, "initdb failed");
        let pg = Self { bin, dir, port };
        pg.up();
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn up(&self) {
        let ok = as_postgres(&format!(
            "{}/pg_ctl -D {} -w -l {}/log -o '-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off' start >/dev/null",
            self.bin.display(),
            self.data().display(),
            self.dir.path().display(),
            self.port,
            self.dir.path().display()
        ));
        assert!(ok, "PostgreSQL did not start");
    }

    fn down(&self) {
        let _ = as_postgres(&format!(
            "{}/pg_ctl -D {} -m immediate stop >/dev/null",
            self.bin.display(),
            self.data().display()
        ));
    }

    fn url(&self) -> String {
        format!("postgres://kortex@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.down();
    }
}

/// The provider `model` at `base` (with `extra` spec fields) and a policy for every session.
fn manifests(dir: &Path, base: &str, extra: &str) {
    manifests_with(dir, base, extra, "");
}

/// As [`manifests`], with `policy` (more policy spec fields, e.g. a budget).
fn manifests_with(dir: &Path, base: &str, extra: &str, policy: &str) {
    std::fs::write(
        dir.join("all.yaml"),
        format!(
            r#"apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {{name: model}}
spec: {{type: openai-compatible, baseUrl: "{base}/v1", defaultModel: m1, locality: local{extra}}}
---
apiVersion: kortex.dev/v1alpha1
kind: ChatPolicy
metadata: {{name: all}}
spec: {{sessions: ["*"], provider: model{policy}}}
"#
        ),
    )
    .unwrap();
}

/// A PostgreSQL of the test's own, or `None` (the test is skipped) without PostgreSQL's
/// binaries — a failure instead where the run requires PostgreSQL.
fn own_postgres() -> Option<Postgres> {
    let pg = Postgres::start();
    if pg.is_none() {
        assert!(
            std::env::var("KORTEX_REQUIRE_POSTGRES").is_err(),
            "no PostgreSQL binaries under /usr/lib/postgresql"
        );
        eprintln!("skipped: no PostgreSQL binaries");
    }
    pg
}

/// `kortex serve` on a PostgreSQL of the test's own, with the provider `model` (a scripted
/// mock) for every session; `None` (the test is skipped) without PostgreSQL's binaries.
async fn on_own_postgres() -> Option<(Postgres, Server, std::sync::Arc<Script>, tempfile::TempDir)>
{
    let pg = own_postgres()?;
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base, "");
    let server = Server::start_with_url(&m, &pg.url(), &[]);
    Some((pg, server, script, dir))
}

/// PostgreSQL stops and comes back: while it is down the API says so (503
/// `database_unavailable`, `/readyz` 503) instead of failing as a bug or hanging; once it is
/// back Kortex serves again without a restart, and nothing stored before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_and_started_again() {
    let Some((pg, server, script, _dir)) = on_own_postgres().await else {
        return;
    };
    let d = openai();
    push(
        &script,
        streamed(&d, (d.text_stream)(&["Before the outage."])),
    );
    let id = session(&server, "s-1").await;
    let events = ask(&server, &id, "first question").await;
    assert_eq!(state(&events), json!("completed"));

    pg.down();
    let client = http_client();
    let r = create_session(&server, &json!({"name": "s-2"})).await;
    assert_eq!(r.status().as_u16(), 503);
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    assert_eq!(server.get("/readyz").await.0, 503);
    // Liveness is not readiness: the process is fine, the pod is not restarted for this.
    assert_eq!(server.get("/healthz").await.0, 200);

    pg.up();
    eventually("PostgreSQL back", || async {
        let r = client
            .post(server.url("/chat/v1/sessions"))
            .json(&json!({"name": "s-2"}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match r.status().as_u16() {
            201 => Ok(()),
            code => Err(format!("{code}: {}", r.text().await.unwrap_or_default())),
        }
    })
    .await;
    push(
        &script,
        streamed(&d, (d.text_stream)(&["After the outage."])),
    );
    let events = ask(&server, &id, "second question").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    let stored = session_json(&server, &id).await;
    let texts: Vec<&str> = stored["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["content"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        texts,
        [
            "first question",
            "Before the outage.",
            "second question",
            "After the outage."
        ],
        "{stored}"
    );
    assert_ne!(stored["status"], "running");
    assert!(server.terminate().success());
}

/// The gateway while PostgreSQL is down: a call that must reserve budget first (a policy
/// with a daily limit, no budget leased yet) gets 503 `database_unavailable` with
/// `Retry-After`, in the vendor's error format, not a 500; once PostgreSQL is back the same
/// call goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_says_database_unavailable_while_postgres_is_down() {
    let Some(pg) = own_postgres() else {
        return;
    };
    let (base, script) = mock().await;
    let (_dir, m) = manifest_dir();
    manifests_with(
        &m,
        &base,
        ", models: [{id: m1, cost: {inputUsdPerMTok: 1, outputUsdPerMTok: 2}}]",
        ", budget: {dailyUsdLimit: 100}",
    );
    std::fs::write(
        m.join("gateway.yaml"),
        docs(&[gateway_key("gw", "shop", "all", "kgw-faults-1")]),
    )
    .unwrap();
    let server = Server::start_with_url(&m, &pg.url(), &[]);
    let client = http_client();
    let call = || {
        client
            .post(server.url("/v1/chat/completions"))
            .bearer_auth("kgw-faults-1")
            .json(&json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    pg.down();
    let r = call().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("5")
    );
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    pg.up();
    let d = openai();
    push(&script, json_reply(200, &(d.text_json)("back")));
    eventually("the gateway serving again", || async {
        let r = call().await.map_err(|e| e.to_string())?;
        match r.status().as_u16() {
            200 => Ok(()),
            code => Err(format!("{code}: {}", r.text().await.unwrap_or_default())),
        }
    })
    .await;
    assert!(server.terminate().success());
}

/// PostgreSQL stops while a run is answering and comes back 8 s later: the run waits for
/// it (its writes are retried for up to 45 s) and then finishes, so the accepted question
/// and the whole answer are in the transcript and the run is not left `running`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_during_a_run() {
    let Some((pg, server, script, _dir)) = on_own_postgres().await else {
        return;
    };
    let d = openai();
    let mut slow = streamed(
        &d,
        (d.text_stream)(&["Slow ", "and ", "steady ", "answer."]),
    );
    slow.chunk_delay = Some(Duration::from_millis(1500));
    push(&script, slow);
    let id = session(&server, "s-1").await;
    let client = http_client();
    let r = post_message(&server, &id, "a question").await;
    assert_eq!(r.status().as_u16(), 202);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    pg.down();
    // Down in the middle of the answer: requests are refused meanwhile.
    let (status, _) = server.get(&format!("/chat/v1/sessions/{id}")).await;
    assert_eq!(status, 503);
    tokio::time::sleep(Duration::from_secs(8)).await;
    pg.up();
    let stored = eventually("the run ended", || async {
        let r = client
            .get(server.url(&format!("/chat/v1/sessions/{id}")))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let s: Value = r.json().await.map_err(|e| e.to_string())?;
        match s["status"].as_str() {
            Some("idle") => Ok(s),
            _ => Err(s.to_string()),
        }
    })
    .await;
    let texts: Vec<&str> = stored["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["content"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(texts, ["a question", "Slow and steady answer."], "{stored}");
    // The run's events are all there for a client that follows it afterwards.
    let r = client
        .get(server.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, run_ended).await;
    assert_eq!(
        crate::support::chat::text(&events),
        "Slow and steady answer.",
        "{events:?}"
    );
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    assert!(
        server
            .log()
            .contains("the database is unavailable; retrying"),
        "{}",
        server.log()
    );
    assert!(server.terminate().success());
}

/// A connection of the test's own to the SQLite database at `path` (read beside Kortex).
async fn sqlite_pool(path: &Path) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// Two replicas on one PostgreSQL; the one running a run is killed (`kill -9`) in the middle
/// of the answer. The other sees the run's heartbeat stop and, after `STALE_AFTER` (60 s),
/// ends it `failed` with `run_interrupted`; the session then goes on there. (Per SPEC a run
/// is owned by the replica that runs it; it is not resumed elsewhere: what the provider was
/// saying is gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_its_run_is_ended_by_the_other() {
    let Some((pg, a, script, dir)) = on_own_postgres().await else {
        return;
    };
    let b = Server::start_with_url(&dir.path().join("m"), &pg.url(), &[]);
    let d = openai();
    let mut stalled = streamed(&d, (d.text_stream)(&["Half an ans"]));
    stalled.chunks.truncate(1);
    stalled.stall = Some(Duration::from_secs(300));
    push(&script, stalled);
    let id = session(&a, "s-1").await;
    let client = http_client();
    let r = post_message(&a, &id, "a question").await;
    assert_eq!(r.status().as_u16(), 202);
    provider_called(&script).await;
    a.kill9();
    let killed = tokio::time::Instant::now();

    let url = b.url(&format!("/chat/v1/sessions/{id}"));
    let stored = loop {
        let s = get_json(&client, url.as_str()).await;
        if s["status"] != "running" {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(100),
            "the run was never ended: {s}\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "ended by the other replica {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(stored["status"], "failed", "{stored}");
    assert_eq!(stored["messages"][0]["content"], "a question", "{stored}");
    let r = client
        .get(b.url(&format!("/chat/v1/sessions/{id}/events?after=0")))
        .send()
        .await
        .unwrap();
    let events = read_sse(r, |e| state(e) == json!("failed")).await;
    assert!(
        events
            .iter()
            .any(|e| e.event == "error" && e.data["code"] == "run_interrupted"),
        "{events:?}"
    );
    push(&script, streamed(&d, (d.text_stream)(&["Here now."])));
    assert_eq!(state(&ask(&b, &id, "again").await), json!("completed"));
    assert!(b.terminate().success());
}

/// A tmpfs of its own, unmounted when dropped: a disk this test can fill.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` where this test may not mount (not root, no `CAP_SYS_ADMIN`).
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk says it is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 16 * 1024];
        while f.write_all(&block).and_then(|()| f.flush()).is_ok() {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// SQLite's disk fills up: a request that would write gets 507 `storage_full` saying so
/// (not 500), reads and the other requests go on, nothing is half-written; once space is
/// freed Kortex writes again without a restart, and the database passes SQLite's
/// integrity check with everything stored before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk() {
    let Some(disk) = Tmpfs::mount("4m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let (base, script) = mock().await;
    let (_dir, m) = manifest_dir();
    manifests(&m, &base, "");
    let db = disk.path().join("k.db");
    let server = Server::start_with_args(&m, &db, &[]);
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["Stored before."])));
    let id = session(&server, "s-1").await;
    let events = ask(&server, &id, "before").await;
    assert_eq!(state(&events), json!("completed"));

    let filler = disk.fill();
    let client = http_client();
    let refused = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or_default();
        (status, body)
    };
    let (status, body) = refused(create_session(&server, &json!({"name": "s-2"})).await).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (507, &json!("storage_full")),
        "{body}"
    );
    let (status, body) = refused(
        client
            .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
            .json(&json!({"content": "while full"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (507, &json!("storage_full")),
        "{body}"
    );
    // Reads go on, and the session is not left running.
    let stored = session_json(&server, &id).await;
    assert_eq!(stored["status"], "idle", "{stored}");
    assert_eq!(server.get("/healthz").await.0, 200);

    std::fs::remove_file(&filler).unwrap();
    push(&script, streamed(&d, (d.text_stream)(&["Stored after."])));
    let events = ask(&server, &id, "after").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    assert!(server.terminate().success());

    let store = kortex::store::Store::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let pool = sqlite_pool(&db).await;
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(check, "ok");
    let texts: Vec<String> = store
        .list_messages(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(
        texts,
        ["before", "Stored before.", "after", "Stored after."]
    );
}

/// `kill -9` of Kortex in the middle of an answer and in the middle of a tool call, then a
/// restart on the same SQLite database: every accepted message is in the transcript, the
/// interrupted runs end `failed` with a reason (they are not resumed: what the provider was
/// saying is gone), the tool call has a result, so the session can go on, and the budget
/// the dead process had reserved is released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_answer_and_mid_tool_call_then_restart() {
    let (base, script) = mock().await;
    let (bridge, bridge_seen) = upstream().await;
    let (dir, m) = manifest_dir();
    // A priced model under a daily limit: every call reserves budget first.
    manifests_with(
        &m,
        &base,
        ", models: [{id: m1, cost: {inputUsdPerMTok: 1, outputUsdPerMTok: 2}}]",
        ", budget: {dailyUsdLimit: 100}",
    );
    std::fs::write(
        m.join("tool.yaml"),
        docs(&[tool(
            "slow",
            &format!(
                "name: slow_lookup, description: A lookup that takes a while., \
                 http: {{method: GET, url: '{bridge}/slow'}}, timeout: 30s"
            ),
        )]),
    )
    .unwrap();
    let db = dir.path().join("k.db");
    let d = openai();
    let client = http_client();
    let post = |server: &Server, id: &str, content: &str| {
        client
            .post(server.url(&format!("/chat/v1/sessions/{id}/messages")))
            .json(&json!({"content": content}))
            .send()
    };

    // Mid-answer: the provider streams a little, then stalls; Kortex dies meanwhile.
    let server = Server::start(&m, &db, &[]);
    let mut stalled = streamed(&d, (d.text_stream)(&["Half an ans"]));
    stalled.chunks.truncate(1);
    stalled.stall = Some(Duration::from_secs(60));
    push(&script, stalled);
    let answer = session(&server, "s-answer").await;
    let r = post(&server, &answer, "question one").await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    provider_called(&script).await;
    // Mid-tool-call: the model calls the slow tool; Kortex dies while it runs.
    push(&script, tool_calls(&[("c1", "slow_lookup", json!({}))]));
    let tool = session(&server, "s-tool").await;
    let r = post(&server, &tool, "question two").await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    eventually("the tool call under way", || async {
        let slow = bridge_seen
            .lock()
            .map(|s| s.iter().any(|x| x.target.starts_with("/slow")))
            .unwrap_or_default();
        if slow {
            Ok(())
        } else {
            Err("no request to /slow yet".into())
        }
    })
    .await;
    server.kill9();
    let reserved = || async {
        let pool = sqlite_pool(&db).await;
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM budget_reservations")
            .fetch_one(&pool)
            .await
            .unwrap();
        let total: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(reserved), 0) AS BIGINT) FROM budget_counters",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        (rows, total)
    };
    let (rows, total) = reserved().await;
    assert!(
        rows > 0 && total > 0,
        "the killed server held budget: {rows} rows, {total}"
    );

    // Restart on the same database: what the dead process held is released before it
    // serves (not when its lease would have run out, minutes later).
    let server = Server::start(&m, &db, &[]);
    assert_eq!(server.get("/healthz").await.0, 200);
    assert_eq!(
        reserved().await,
        (0, 0),
        "budget left reserved after the restart"
    );
    for id in [&answer, &tool] {
        let url = server.url(&format!("/chat/v1/sessions/{id}"));
        let stored = eventually("the interrupted run ended", || async {
            let s = get_json(&client, url.as_str()).await;
            if s["status"] == "running" {
                Err(s.to_string())
            } else {
                Ok(s)
            }
        })
        .await;
        assert_eq!(stored["status"], "failed", "{stored}");
        let messages = stored["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages[0]["role"], "user", "{stored}");
        // Every tool call has a result.
        let calls: Vec<String> = messages
            .iter()
            .filter_map(|m| m["toolCalls"].as_array())
            .flatten()
            .filter_map(|c| c["id"].as_str().map(str::to_owned))
            .collect();
        if id == &tool {
            assert_eq!(calls.len(), 1, "the interrupted call was stored: {stored}");
        }
        for call in &calls {
            assert!(
                messages.iter().any(|m| m["role"] == "tool"
                    && m["toolCallId"] == call.as_str()
                    && m["isError"] == true),
                "{call} has no error result: {stored}"
            );
        }
        // The session goes on.
        push(&script, streamed(&d, (d.text_stream)(&["Fine now."])));
        let events = ask(&server, id, "again").await;
        assert_eq!(state(&events), json!("completed"), "{events:?}");
    }
    let tool_session = session_json(&server, &tool).await;
    assert!(
        tool_session.to_string().contains("slow_lookup"),
        "the interrupted call is in the transcript: {tool_session}"
    );
    assert!(server.terminate().success());
}

/// The Secret holding a provider's key is deleted while the provider is in use, then put
/// back: runs meanwhile fail at once saying which Secret is missing, nothing else breaks,
/// and the provider serves again as soon as the Secret is back (no restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_deleted_while_in_use_then_restored() {
    let (base, script) = mock().await;
    let (dir, m) = manifest_dir();
    manifests(&m, &base, ", apiKeySecretRef: {name: keys, key: model}");
    let secret = m.join("secret.yaml");
    let secret_yaml =
        "apiVersion: v1\nkind: Secret\nmetadata: {name: keys}\nstringData: {model: sk-in-use-1}\n";
    std::fs::write(&secret, secret_yaml).unwrap();
    let server = Server::start(&m, &dir.path().join("k.db"), &[]);
    let client = http_client();
    let d = openai();
    let id = session(&server, "s-1").await;
    push(&script, streamed(&d, (d.text_stream)(&["ok"])));
    assert_eq!(state(&ask(&server, &id, "one").await), json!("completed"));

    let url = &server.url("/api/v1/llm/providers");
    let client = &client;
    let available = |want: bool| {
        eventually("the provider's availability", move || async move {
            let v = get_json(client, url.as_str()).await;
            let p = v["items"]
                .as_array()
                .and_then(|i| i.iter().find(|p| p["name"] == "model").cloned())
                .unwrap_or_default();
            if p["available"] == want {
                Ok(p)
            } else {
                Err(v.to_string())
            }
        })
    };
    std::fs::remove_file(&secret).unwrap();
    let p = available(false).await;
    let resolved = item_condition(&p, "SecretResolved");
    assert_eq!(resolved["status"], "False", "{p}");
    assert!(
        resolved["message"]
            .as_str()
            .unwrap_or_default()
            .contains("keys"),
        "the missing Secret is named: {p}"
    );
    let events = ask(&server, &id, "two").await;
    assert_eq!(state(&events), json!("failed"), "{events:?}");
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .map(|e| e.data.to_string())
        .unwrap_or_default();
    assert!(
        error.contains("provider_unavailable") && error.contains("model"),
        "{error}"
    );
    std::fs::write(&secret, secret_yaml).unwrap();
    available(true).await;
    push(&script, streamed(&d, (d.text_stream)(&["back"])));
    assert_eq!(state(&ask(&server, &id, "three").await), json!("completed"));
    assert!(server.terminate().success());
}

/// Cluster mode: the API server is away for 20 s (every request 503, open watches cut).
/// Chat goes on with the configuration it had; a Kubernetes tool answers the model with a
/// clear error instead of hanging; an object applied meanwhile is picked up once the
/// watches are back (they resume where they were), and its status is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_server_unreachable_then_back() {
    let fake = FakeApi::start().await;
    let (llm, script) = mock().await;
    fake.apply(
        "chatpolicies",
        json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "all", "namespace": "team-a"},
            "spec": {"sessions": ["*"], "provider": "gpt", "runToolsAsUser": false}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    let client = http_client();
    let d = openai();
    let transcript = |id: String| {
        let client = client.clone();
        let url = server.url(&format!("/chat/v1/sessions/{id}"));
        async move { get_json(&client, url).await }
    };
    push(&script, streamed(&d, (d.text_stream)(&["Before."])));
    let id = chat_once(
        &server,
        json!({"name": "before", "namespace": "team-a"}),
        "hi",
    )
    .await;
    assert_eq!(transcript(id).await["messages"][1]["content"], "Before.");

    fake.outage(true);
    let down = tokio::time::Instant::now();
    push(
        &script,
        tool_calls(&[("c1", "get_events", json!({"namespace": "shop"}))]),
    );
    push(
        &script,
        streamed(&d, (d.text_stream)(&["The cluster is unreachable."])),
    );
    let id = chat_once(
        &server,
        json!({"name": "during", "namespace": "team-a"}),
        "what happened?",
    )
    .await;
    let stored = transcript(id).await;
    let messages = stored["messages"].as_array().cloned().unwrap_or_default();
    let result = messages
        .iter()
        .find(|m| m["toolCallId"] == "c1")
        .unwrap_or_else(|| panic!("no tool result: {stored}"));
    assert_eq!(result["isError"], true, "{stored}");
    let text = result["content"].as_str().unwrap_or_default();
    assert!(
        text.contains("503") || text.contains("unavailable"),
        "{text}"
    );
    assert_eq!(
        messages.last().map(|m| m["content"].clone()),
        Some(json!("The cluster is unreachable.")),
        "{stored}"
    );
    assert_eq!(server.get("/healthz").await.0, 200);
    // Applied while Kortex cannot see it: the watch event is lost with the cut stream.
    let mut second = provider(&llm);
    second["metadata"]["name"] = json!("gpt-b");
    fake.apply("llmproviders", second);
    tokio::time::sleep_until(down + Duration::from_secs(20)).await;
    fake.outage(false);

    let back = tokio::time::Instant::now();
    loop {
        let object = fake.get("llmproviders", "team-a", "gpt-b");
        if condition(&object, "Ready").is_some_and(|(status, _)| status == "True") {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "gpt-b never got a status after the outage: {object:?}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "status written {:?} after the API server came back",
        back.elapsed()
    );
    push(&script, streamed(&d, (d.text_stream)(&["After."])));
    let id = chat_once(
        &server,
        json!({"name": "after", "namespace": "team-a"}),
        "hi",
    )
    .await;
    assert_eq!(transcript(id).await["messages"][1]["content"], "After.");
    // An outage Kortex rides out is not an error, and each thing it could not do is said
    // once, with what it was doing, not per failed call (issue 44: 54 ERROR lines from the
    // kube client in a 66 s outage, without context).
    let log = server.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(
        errors.is_empty(),
        "ERROR lines for a handled outage:\n{}",
        errors.join("\n")
    );
    let mut warnings: std::collections::BTreeMap<String, usize> = Default::default();
    for line in log.lines().filter(|l| l.contains(" WARN ")) {
        // The message without the time and the fields that vary (errors, timings).
        let message = line
            .split_once(" WARN ")
            .map_or(line, |(_, m)| m)
            .split(" error=")
            .next()
            .unwrap_or_default()
            .to_owned();
        *warnings.entry(message).or_default() += 1;
    }
    let repeated: Vec<_> = warnings.iter().filter(|(_, n)| **n > 2).collect();
    assert!(
        repeated.is_empty(),
        "the same warning over and over in a 20 s outage: {repeated:#?}\n{log}"
    );
    assert!(server.terminate().success());
}

/// Cluster mode, the API server unreachable: a Kubernetes identity that is not cached
/// cannot be checked, so it is refused with 503 `auth_unavailable`; the replica stays ready
/// and `/readyz` says why (docs/reliability.md#the-api-server-unreachable); once the API
/// server answers, the same caller gets in and `/readyz` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_server_unreachable_refuses_unreviewed_callers_and_readyz_says_why() {
    let fake = FakeApi::start().await;
    let (llm, _script) = mock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start_run_with(&fake, dir.path(), &llm, &["--auth", "kubernetes"]).await;
    let client = http_client();
    let as_bob = || async {
        let r = client
            .get(server.url("/chat/v1/sessions"))
            .bearer_auth("bob-token")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or_default())
    };
    let kubernetes_api = || async {
        let (status, body) = server.get("/readyz").await;
        let body: Value = serde_json::from_str(&body).unwrap_or_default();
        (status, body["checks"]["kubernetesApi"].clone())
    };
    assert_eq!(kubernetes_api().await, (200, json!("ok")));
    fake.outage(true);
    let (status, body) = as_bob().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "auth_unavailable", "{body}");
    let (status, check) = kubernetes_api().await;
    assert_eq!(status, 200);
    assert!(check["unreachableSince"].is_string(), "{check}");
    fake.outage(false);
    let (status, body) = as_bob().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(kubernetes_api().await, (200, json!("ok")));
    assert!(server.terminate().success());
}

/// Cluster mode: the leader dies (`kill -9`) while its execution of an approved proposal
/// hangs. Another replica takes the Lease once it expires and never starts the action
/// again: within the grace period it waits (the old leader may still be finishing), and
/// after it the proposal ends `Failed` as interrupted. The target was written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_lost_mid_execution_executes_once() {
    const STUCK: &str = "/apis/apps/v1/namespaces/shop/deployments/stuck";
    let fake = FakeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (leader, names) = pending_restarts(&fake, dir.path(), &["stuck"]).await;
    let stuck = names[0].clone();
    fake.hang(STUCK);
    let bob = write_kubeconfig_as(dir.path(), &fake.url, "bob-token", "bob");
    let (ok, out) = kubectl_kortex(&bob, &["approve", &stuck, "--no-wait"]).await;
    assert!(ok, "{out}");
    let writes = |f: &FakeApi| {
        f.seen()
            .iter()
            .filter(|s| s.method == "PATCH" && s.path == STUCK && !s.query.contains("dryRun"))
            .count()
    };
    fake.until("the hung write", |f| writes(f) == 1).await;
    assert_eq!(phase(&fake, &stuck), "Executing");
    leader.kill9();

    let other = start_run_with(
        &fake,
        dir.path(),
        "http://127.0.0.1:9",
        &["--identity", "pod-b"],
    )
    .await;
    let started = tokio::time::Instant::now();
    loop {
        let lease = fake
            .get("leases", "kortex", "kortex-leader")
            .unwrap_or_default();
        if lease["spec"]["holderIdentity"] == "pod-b" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "pod-b never led: {lease}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few turns of the new leader's loop: the proposal is left Executing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(phase(&fake, &stuck), "Executing");
    assert_eq!(writes(&fake), 1, "the action was started again");

    // Past the grace period (the Executing condition made older, as time would).
    let mut object = fake
        .get("actionproposals", "shop", &stuck)
        .unwrap_or_default();
    if let Some(conditions) = object["status"]["conditions"].as_array_mut() {
        for c in conditions.iter_mut().filter(|c| c["type"] == "Executing") {
            c["lastTransitionTime"] = json!(
                (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600))
                    .strftime("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
            );
        }
    }
    fake.apply("actionproposals", object);
    fake.until("the interrupted execution Failed", |f| {
        phase(f, &stuck) == "Failed"
    })
    .await;
    let failed = fake
        .get("actionproposals", "shop", &stuck)
        .unwrap_or_default();
    assert!(failed.to_string().contains("interrupted"), "{failed}");
    assert_eq!(writes(&fake), 1, "the action was started again");
    assert!(other.terminate().success());
}

/// Cluster mode: the Secret holding the provider's key is deleted while the provider is in
/// use, then created again: the provider's status says which Secret is missing, runs
/// meanwhile fail at once with `provider_unavailable`, and it serves again as soon as the
/// Secret is back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_secret_deleted_while_in_use_then_restored() {
    let fake = FakeApi::start().await;
    let (llm, script) = mock().await;
    fake.apply(
        "chatpolicies",
        json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "all", "namespace": "team-a"},
            "spec": {"sessions": ["*"], "provider": "gpt"}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start_run(&fake, dir.path(), &llm).await;
    let client = http_client();
    let d = openai();
    push(&script, streamed(&d, (d.text_stream)(&["Keyed."])));
    let id = chat_once(&server, json!({"name": "s", "namespace": "team-a"}), "hi").await;
    let url = server.url(&format!("/chat/v1/sessions/{id}"));
    assert_eq!(
        get_json(&client, url.as_str()).await["messages"][1]["content"],
        "Keyed."
    );

    fake.remove("secrets", Some("team-a"), "llm-keys");
    let resolved = |want: &'static str| {
        let fake = fake.clone();
        async move {
            fake.until("SecretResolved", |f| {
                condition(&f.get("llmproviders", "team-a", "gpt"), "SecretResolved")
                    .is_some_and(|(status, _)| status == want)
            })
            .await;
        }
    };
    resolved("False").await;
    let provider = fake
        .get("llmproviders", "team-a", "gpt")
        .unwrap_or_default();
    assert!(
        provider["status"].to_string().contains("llm-keys"),
        "the Secret is named: {provider}"
    );
    let events = ask(&server, &id, "still there?").await;
    assert_eq!(state(&events), json!("failed"), "{events:?}");
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .map(|e| e.data.to_string())
        .unwrap_or_default();
    assert!(error.contains("provider_unavailable"), "{error}");

    fake.apply("secrets", secret(Some("sk-cluster-456")));
    resolved("True").await;
    push(&script, streamed(&d, (d.text_stream)(&["Back."])));
    let events = ask(&server, &id, "and now?").await;
    assert_eq!(state(&events), json!("completed"), "{events:?}");
    // The new key is the one sent.
    let keys: Vec<String> = script
        .seen
        .lock()
        .map(|s| {
            s.iter()
                .filter(|x| x.path.ends_with("/chat/completions"))
                .filter_map(|x| {
                    x.headers
                        .get("authorization")?
                        .to_str()
                        .ok()
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        keys.last().map(String::as_str),
        Some("Bearer sk-cluster-456"),
        "{keys:?}"
    );
    assert!(server.terminate().success());
}
