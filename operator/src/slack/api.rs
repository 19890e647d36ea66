//! Slack's Web API as Kortex calls it with an app's bot token: `chat.postMessage`,
//! `chat.update`, `chat.postEphemeral` and `views.open` (JSON bodies), `users.info` (a
//! form, as Slack asks). The token travels in `Authorization: Bearer`, never in a URL. A
//! failure comes back as HTTP 200 with `{"ok": false, "error": …}` and is a typed error
//! naming Slack's code; a 429 is waited out as its `Retry-After` says (a few times, then
//! given up as [`ApiError::RateLimited`]).

use crate::catalog::SecretValue;
use serde_json::{Value, json};
use std::time::Duration;

/// The Web API's base URL.
pub const SLACK_API: &str = "https://slack.com/api";
/// How many 429s one call waits out before giving up.
const RATE_LIMIT_TRIES: u32 = 3;
/// The longest `Retry-After` waited out (longer ones give up at once).
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// Why a call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    /// Slack answered `ok: false`.
    #[error("Slack refused {method}: {error}")]
    Refused {
        /// The method.
        method: &'static str,
        /// Slack's error code (`channel_not_found`, `not_in_channel`, `invalid_auth`, …).
        error: String,
    },
    /// Still rate limited after waiting.
    #[error("Slack rate limits {method}: retry after {retry_after} s")]
    RateLimited {
        /// The method.
        method: &'static str,
        /// Seconds Slack asked to wait.
        retry_after: u64,
    },
    /// Slack could not be reached, or answered something that is not the Web API's.
    #[error("Slack's {method} could not be called: {detail}")]
    Transport {
        /// The method.
        method: &'static str,
        /// What happened.
        detail: String,
    },
}

/// A person as `users.info` describes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlackPerson {
    /// The Slack user id.
    pub id: String,
    /// Their profile's e-mail, when the app may read it (`users:read.email`).
    pub email: Option<String>,
    /// A bot, an app user, or a deactivated account: nobody who decides anything.
    pub not_a_person: bool,
}

/// A client of one app's Web API.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: SecretValue,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "slack::Client({})", self.base)
    }
}

impl Client {
    /// A client calling `base` (normally [`SLACK_API`]) with `token`.
    pub fn new(http: reqwest::Client, base: &str, token: SecretValue) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        }
    }

    async fn call(
        &self,
        method: &'static str,
        body: Option<&Value>,
        form: Option<&[(&str, &str)]>,
    ) -> Result<Value, ApiError> {
        let transport = |detail: String| ApiError::Transport { method, detail };
        let mut waited = 0;
        loop {
            let url = format!("{}/{method}", self.base);
            let mut request = self.http.post(&url).bearer_auth(self.token.expose());
            if let Some(body) = body {
                request = request
                    .header("content-type", "application/json; charset=utf-8")
                    .body(body.to_string());
            }
            if let Some(form) = form {
                let encoded = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(form.iter().copied())
                    .finish();
                request = request
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(encoded);
            }
            let response = request
                .send()
                .await
                .map_err(|e| transport(crate::egress::error_chain(&e)))?;
            if response.status().as_u16() == 429 {
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(1);
                waited += 1;
                if waited > RATE_LIMIT_TRIES || Duration::from_secs(retry_after) > LONGEST_WAIT {
                    return Err(ApiError::RateLimited {
                        method,
                        retry_after,
                    });
                }
                tracing::debug!(method, retry_after, "Slack rate limits a call: waiting");
                tokio::time::sleep(Duration::from_secs(retry_after)).await;
                continue;
            }
            let status = response.status();
            let (bytes, _) = crate::egress::read_capped(response, 1 << 20)
                .await
                .map_err(|e| transport(e.to_string()))?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
                transport(format!(
                    "HTTP {} without the Web API's JSON",
                    status.as_u16()
                ))
            })?;
            if v["ok"] == true {
                return Ok(v);
            }
            return Err(ApiError::Refused {
                method,
                error: v["error"].as_str().unwrap_or("unknown_error").to_owned(),
            });
        }
    }

    /// `chat.postMessage`: a message in `channel` (in the thread of `thread_ts`); its `ts`.
    pub async fn post_message(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        text: &str,
        blocks: Option<&Value>,
    ) -> Result<String, ApiError> {
        let mut body = json!({"channel": channel, "text": text, "unfurl_links": false});
        if let Some(t) = thread_ts {
            body["thread_ts"] = json!(t);
        }
        if let Some(b) = blocks {
            body["blocks"] = b.clone();
        }
        let v = self.call("chat.postMessage", Some(&body), None).await?;
        Ok(v["ts"].as_str().unwrap_or_default().to_owned())
    }

    /// `chat.update`: the message `ts` of `channel` now says `text` (and `blocks`).
    pub async fn update(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
        blocks: Option<&Value>,
    ) -> Result<(), ApiError> {
        let mut body = json!({"channel": channel, "ts": ts, "text": text});
        if let Some(b) = blocks {
            body["blocks"] = b.clone();
        }
        self.call("chat.update", Some(&body), None).await.map(drop)
    }

    /// `chat.postEphemeral`: a message only `user` sees in `channel`.
    pub async fn post_ephemeral(
        &self,
        channel: &str,
        user: &str,
        thread_ts: Option<&str>,
        text: &str,
    ) -> Result<(), ApiError> {
        let mut body = json!({"channel": channel, "user": user, "text": text});
        if let Some(t) = thread_ts {
            body["thread_ts"] = json!(t);
        }
        self.call("chat.postEphemeral", Some(&body), None)
            .await
            .map(drop)
    }

    /// `views.open`: a modal for the click `trigger_id` came with.
    pub async fn open_view(&self, trigger_id: &str, view: &Value) -> Result<(), ApiError> {
        let body = json!({"trigger_id": trigger_id, "view": view});
        self.call("views.open", Some(&body), None).await.map(drop)
    }

    /// `users.info` (a form: the method takes no JSON).
    pub async fn user(&self, id: &str) -> Result<SlackPerson, ApiError> {
        let v = self.call("users.info", None, Some(&[("user", id)])).await?;
        let u = &v["user"];
        Ok(SlackPerson {
            id: u["id"].as_str().unwrap_or(id).to_owned(),
            email: u["profile"]["email"]
                .as_str()
                .filter(|e| !e.is_empty())
                .map(str::to_owned),
            not_a_person: u["is_bot"] == true || u["is_app_user"] == true || u["deleted"] == true,
        })
    }
}
