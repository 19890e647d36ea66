//! A newcomer's first run: the README's first command on the local samples with no API key
//! and no Ollama. The start-up log says, per policy, that nothing can answer and what to do;
//! a question fails at once with `no_provider_reachable` and the fix, without a connection
//! to the provider its fresh probe found unreachable; the session's route says the same (the
//! dashboard's banner, in headless Chromium, on the first screen before any session is open
//! and in the session); `providers check` fails with the fix. Then the local model becomes
//! reachable: the banners go and the question is answered.

use crate::support::browser::{passed, run_browser};
use crate::support::chat::{ask, get_json, open_session, session_json};
use crate::support::net::{eventually, http_client};
use crate::support::provider::{mock, ollama, streamed};
use crate::support::server::{Server, kortex_cli};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A TCP port that drops every connection (counting them) until it is switched up; then
/// it carries them to `target`.
struct Toggle {
    up: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    url: String,
}

impl Toggle {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let up = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (u, c) = (up.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                if !u.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        Self {
            up,
            connections,
            url,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_without_a_reachable_model_says_what_to_do() {
    let (llm, script) = mock().await;
    *script.responder.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(|_: &Value| {
        let d = ollama();
        Some(streamed(&d, (d.text_stream)(&["Hello from Ollama."])))
    }));
    let toggle = Toggle::start(llm.trim_start_matches("http://").to_owned()).await;
    // The README's local samples, with Ollama's address on the toggle.
    let dir = tempfile::tempdir().unwrap();
    let samples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples/local");
    for f in ["policy.yaml", "providers.yaml"] {
        let text = std::fs::read_to_string(samples.join(f)).unwrap();
        std::fs::write(
            dir.path().join(f),
            text.replace("http://127.0.0.1:11434", &toggle.url),
        )
        .unwrap();
    }
    let server = Server::start(dir.path(), &dir.path().join("k.db"), &[]);

    // The start-up summary: one line per policy, with the fix.
    let log = eventually("the start-up summary", || async {
        let log = server.log();
        if log.contains("ChatPolicy default/default can answer now")
            && log.contains("ChatPolicy default/local can answer now")
        {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("ChatPolicy default/default"))
        .unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("anthropic: no API key (ANTHROPIC_API_KEY is not set)"),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "start Ollama at {} (`ollama serve`) and `ollama pull qwen3:4b`",
            toggle.url
        )),
        "{line}"
    );
    assert!(
        line.contains("docs/troubleshooting.md#no-provider-reachable"),
        "{line}"
    );
    let probed = toggle.connections.load(Ordering::SeqCst);
    assert!(probed >= 1, "the probe tried Ollama");

    // A question fails at once, saying what to do, and nothing is sent to Ollama.
    let client = http_client();
    let id = open_session(&server, json!({"name": "incident-1"})).await;
    let events = ask(&server, &id, "Why is checkout down?").await;
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .unwrap_or_else(|| panic!("no error event: {events:?}"));
    assert_eq!(
        error.data["code"], "no_provider_reachable",
        "{:?}",
        error.data
    );
    let message = error.data["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.starts_with(
            "No provider of ChatPolicy default can answer now — anthropic: no API key"
        ),
        "{message}"
    );
    assert!(
        message.contains("ollama: unreachable: no answer from"),
        "{message}"
    );
    assert!(
        message.contains("To get an answer: set ANTHROPIC_API_KEY or OPENAI_API_KEY"),
        "{message}"
    );
    assert!(
        !message.contains("error sending request"),
        "the transport error is not the headline: {message}"
    );
    assert_eq!(
        toggle.connections.load(Ordering::SeqCst),
        probed,
        "no connection to a provider its fresh probe found unreachable"
    );
    // Read back later, the session says why that run failed.
    let stored: Value = session_json(&server, &id).await;
    assert_eq!(
        stored["failedRuns"][0]["reason"].as_str(),
        Some(message.as_str()),
        "{stored}"
    );
    // The session's route (the dashboard's banner) says the same.
    let route: Value = get_json(
        &client,
        server.url(&format!("/chat/v1/sessions/{id}/route")),
    )
    .await;
    assert_eq!(route["reachable"], false, "{route}");
    assert_eq!(route["message"].as_str(), Some(message.as_str()));

    // `providers check` fails and prints the fix.
    let manifests = dir.path().display().to_string();
    let check = kortex_cli(&["providers", "check", "--manifests", &manifests], "").await;
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{said}");
    assert!(said.contains("✗ ChatPolicy local: No provider of ChatPolicy local can answer now — ollama: unreachable"), "{said}");
    assert!(said.contains("To get an answer: start Ollama at"), "{said}");

    // The banner in a browser; then Ollama comes up (and a reload re-probes at once).
    let seen = dir.path().join("banner-seen");
    let flip = async {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(45);
        while !seen.exists() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        toggle.up.store(true, Ordering::SeqCst);
        let policy = dir.path().join("policy.yaml");
        let text = std::fs::read_to_string(&policy).unwrap_or_default();
        std::fs::write(&policy, format!("{text}\n# Ollama is up\n")).unwrap();
    };
    let url = server.url("");
    let seen_path = seen.display().to_string();
    let env = [
        ("KORTEX_URL", url.trim_end_matches('/')),
        ("SESSION", id.as_str()),
        ("SEEN", seen_path.as_str()),
    ];
    let (browser, ()) = tokio::join!(run_browser("first_run.mjs", &env), flip);
    if let Some(out) = browser {
        passed(&out, &server);
    }
    eventually("the route is reachable", || async {
        let route: Value = get_json(
            &client,
            server.url(&format!("/chat/v1/sessions/{id}/route")),
        )
        .await;
        if route["reachable"] == true {
            Ok(())
        } else {
            Err(route.to_string())
        }
    })
    .await;
    let session: Value = session_json(&server, &id).await;
    if session["status"] != "idle" {
        // Without a browser, ask here.
        let events = ask(&server, &id, "Hello?").await;
        assert_eq!(
            events.last().map(|e| e.data["state"].clone()),
            Some(json!("completed")),
            "{events:?}"
        );
    }
    let session: Value = session_json(&server, &id).await;
    let answered = session["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["role"] == "assistant" && m["content"] == "Hello from Ollama.");
    assert!(answered, "{session:#}");
    assert!(server.terminate().success());
}
