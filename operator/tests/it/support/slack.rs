//! A scripted Slack Web API on 127.0.0.1 speaking the documented shapes: `chat.postMessage`
//! (answers a `ts`), `chat.update`, `chat.postEphemeral` (`message_ts`), `views.open`,
//! `users.info` (a form; a profile with an e-mail). Every call is recorded with its token
//! and body; a test can make the next calls of a method answer `ok: false` with an error,
//! or 429 with a `Retry-After`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One call as Slack saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    /// The bearer token sent.
    pub token: String,
    /// The JSON body, or the form as an object.
    pub body: Value,
    /// The request's query string (tokens never belong there).
    pub query: String,
    /// The `ts` Slack answered with (a message posted).
    pub ts: Option<String>,
}

/// What the next call of a method answers instead of success.
#[derive(Clone, Debug)]
pub enum Fault {
    /// `{"ok": false, "error": …}` with HTTP 200.
    Error(&'static str),
    /// 429 with this `Retry-After`.
    RateLimited(u64),
}

#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    faults: HashMap<String, Vec<Fault>>,
    emails: HashMap<String, String>,
    next_ts: u64,
}

/// The scripted Slack.
#[derive(Clone)]
pub struct Slack {
    /// Its Web API base URL (`…/api`).
    pub api: String,
    inner: Arc<Mutex<Inner>>,
}

impl Slack {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            next_ts: 1_700_000_000,
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route("/api/{method}", axum::routing::post(call))
            .with_state(inner.clone());
        let base = crate::support::net::serve(app).await;
        Self {
            api: format!("{base}/api"),
            inner,
        }
    }

    /// `users.info` will give `user` this profile e-mail.
    pub fn person(&self, user: &str, email: &str) {
        self.inner
            .lock()
            .unwrap()
            .emails
            .insert(user.to_owned(), email.to_owned());
    }

    /// The next calls of `method` answer `faults`, in order.
    pub fn fail(&self, method: &str, faults: Vec<Fault>) {
        self.inner
            .lock()
            .unwrap()
            .faults
            .insert(method.to_owned(), faults);
    }

    /// The first call of `method` that `matches`, waiting for it (up to 30 s; the failure
    /// shows the calls of `method` seen).
    pub async fn wait_for(&self, method: &str, matches: impl Fn(&Call) -> bool) -> Call {
        crate::support::net::eventually(method, || {
            let found = self.calls(method).into_iter().find(|c| matches(c));
            let seen = || {
                format!(
                    "{:?}",
                    self.calls(method)
                        .iter()
                        .map(|c| c.body.clone())
                        .collect::<Vec<_>>()
                )
            };
            std::future::ready(found.ok_or_else(seen))
        })
        .await
    }

    /// The first call of `method` whose `text` contains `needle`, waiting for it.
    pub async fn wait_for_text(&self, method: &str, needle: &str) -> Call {
        self.wait_for(method, |c| {
            c.body["text"].as_str().is_some_and(|t| t.contains(needle))
        })
        .await
    }

    pub fn calls(&self, method: &str) -> Vec<Call> {
        self.inner
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }
}

async fn call(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(method): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned();
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let parsed: Value = if form {
        Value::Object(
            url::form_urlencoded::parse(body.as_bytes())
                .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
                .collect(),
        )
    } else {
        serde_json::from_str(&body).unwrap_or(Value::Null)
    };
    let mut inner = inner.lock().unwrap();
    inner.calls.push(Call {
        method: method.clone(),
        token: token.clone(),
        body: parsed.clone(),
        query: uri.query().unwrap_or_default().to_owned(),
        ts: None,
    });
    if token.is_empty() {
        return axum::Json(json!({"ok": false, "error": "not_authed"})).into_response();
    }
    let fault = inner.faults.get_mut(&method).and_then(|f| {
        if f.is_empty() {
            None
        } else {
            Some(f.remove(0))
        }
    });
    match fault {
        Some(Fault::Error(e)) => {
            return axum::Json(json!({"ok": false, "error": e})).into_response();
        }
        Some(Fault::RateLimited(s)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", s.to_string())],
                axum::Json(json!({"ok": false, "error": "ratelimited"})),
            )
                .into_response();
        }
        None => {}
    }
    inner.next_ts += 1;
    let ts = format!("{}.000100", inner.next_ts);
    if method == "chat.postMessage"
        && let Some(call) = inner.calls.last_mut()
    {
        call.ts = Some(ts.clone());
    }
    match method.as_str() {
        "chat.postMessage" => axum::Json(json!({"ok": true, "channel": parsed["channel"], "ts": ts,
            "message": {"type": "message", "subtype": "bot_message", "bot_id": "B0KORTEX", "text": parsed["text"], "ts": ts}}))
        .into_response(),
        "chat.update" => axum::Json(json!({"ok": true, "channel": parsed["channel"], "ts": parsed["ts"], "text": parsed["text"]})).into_response(),
        "chat.postEphemeral" => axum::Json(json!({"ok": true, "message_ts": ts})).into_response(),
        "views.open" => axum::Json(json!({"ok": true, "view": {"id": "V0KORTEX", "type": "modal"}})).into_response(),
        "users.info" => {
            if !form {
                // The method takes no JSON.
                return axum::Json(json!({"ok": false, "error": "invalid_arguments"})).into_response();
            }
            let user = parsed["user"].as_str().unwrap_or_default().to_owned();
            match inner.emails.get(&user) {
                Some(email) => axum::Json(json!({"ok": true, "user": {"id": user, "team_id": "T0KORTEX", "deleted": false,
                    "is_bot": false, "is_app_user": false, "profile": {"email": email, "real_name": user}}}))
                .into_response(),
                None => axum::Json(json!({"ok": false, "error": "user_not_found"})).into_response(),
            }
        }
        _ => axum::Json(json!({"ok": false, "error": "unknown_method"})).into_response(),
    }
}
