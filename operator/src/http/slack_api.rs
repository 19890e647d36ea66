//! Slack's door (`docs/slack.md`): `POST /slack/v1/events`, the
//! Events API request URL of the Slack app a ChatPolicy's `spec.slack` declares. Every
//! request is checked before anything reads it: its signature over the raw body with the
//! signing secret of one of the configured apps (`slack::verify`), then its workspace
//! against that app's `teamId`. `url_verification` is answered; an event is taken once by
//! whichever replica gets it first (Slack retries what it did not see acknowledged within
//! 3 seconds), and acknowledged at once. Nothing unverified is stored or acted on.
//!
//! A taken mention (or a message of a thread with a session) is answered in its thread
//! behind the acknowledgement (`slack_conv`), as are the proposal cards' buttons
//! (`/slack/v1/interactions`) and `/kortex` (`/slack/v1/commands`).

use super::AppState;
use super::error::ApiError;
use crate::catalog::SlackResolved;
use crate::slack::inbound::{Event, Inbound};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The Events API request URL.
pub const EVENTS_PATH: &str = "/slack/v1/events";

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn refused(state: &AppState, status: StatusCode, code: &'static str, message: String) -> ApiError {
    state.metrics.slack_request("refused");
    tracing::info!(reason = %message, "refused a request to the Slack door");
    ApiError::new(status, code, message)
}

/// The request verified with a configured app's signing secret, and parsed; or the
/// refusal to answer with.
fn verified(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(crate::catalog::ObjectKey, SlackResolved, Inbound), ApiError> {
    let config = state.config.borrow().clone();
    let apps: Vec<(&crate::catalog::ObjectKey, &SlackResolved)> = config
        .catalog
        .policies
        .iter()
        .filter_map(|(key, p)| p.slack.as_ref().map(|s| (key, s)))
        .collect();
    if apps.is_empty() {
        return Err(refused(
            state,
            StatusCode::NOT_FOUND,
            "slack_not_configured",
            "no ChatPolicy declares a Slack app (spec.slack) whose Secrets resolved".into(),
        ));
    }
    // The app whose signing secret signed this body; the refusal the apps give otherwise
    // (a stale timestamp is named as such).
    let now = jiff::Timestamp::now().as_second();
    let mut refusal = None;
    let mut signed_by = None;
    for (policy, app) in &apps {
        match crate::slack::verify(
            app.signing_secret.expose().as_bytes(),
            header(headers, "x-slack-request-timestamp"),
            header(headers, "x-slack-signature"),
            body,
            now,
        ) {
            Ok(()) => {
                signed_by = Some(((*policy).clone(), (*app).clone()));
                break;
            }
            Err(e) => refusal = Some(e),
        }
    }
    let Some((policy, app)) = signed_by else {
        let why = refusal.map(|e| e.to_string()).unwrap_or_default();
        return Err(refused(
            state,
            StatusCode::UNAUTHORIZED,
            "slack_unverified",
            why,
        ));
    };
    let content_type = header(headers, "content-type").unwrap_or_default();
    let inbound = crate::slack::parse(content_type, body)
        .map_err(|e| refused(state, StatusCode::BAD_REQUEST, "invalid_request", e))?;
    let team = match &inbound {
        Inbound::Event(e) => Some(&e.team_id),
        Inbound::Action(a) => Some(&a.team_id),
        Inbound::Submission(v) => Some(&v.team_id),
        Inbound::Command(c) => Some(&c.team_id),
        _ => None,
    };
    if let Some(team) = team.filter(|t| **t != app.spec.team_id) {
        return Err(refused(
            state,
            StatusCode::FORBIDDEN,
            "slack_wrong_workspace",
            format!(
                "the request is from workspace {team}, not {} (ChatPolicy {policy})",
                app.spec.team_id
            ),
        ));
    }
    Ok((policy, app, inbound))
}

/// `POST /slack/v1/events`.
pub async fn events(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let (policy, app, inbound) = match verified(&state, &headers, &body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    match inbound {
        Inbound::UrlVerification { challenge } => {
            state.metrics.slack_request("taken");
            tracing::info!(policy = %policy, "answered Slack's url_verification");
            axum::Json(json!({ "challenge": challenge })).into_response()
        }
        Inbound::Event(e) => {
            let message = match &e.event {
                Event::Mention(m) | Event::Message(m) => Some(m),
                Event::Other(_) => None,
            };
            let elsewhere = message.is_some_and(|m| {
                !app.spec.channels.is_empty() && !app.spec.channels.contains(&m.channel)
            });
            let own = message.is_some_and(|m| !m.from_a_person());
            if elsewhere || own || message.is_none() {
                state.metrics.slack_request("ignored");
                return StatusCode::OK.into_response();
            }
            match state.store.claim_slack_event(&e.event_id).await {
                Ok(true) => {
                    state.metrics.slack_request("taken");
                    tracing::info!(policy = %policy, event = %e.event_id, "took a Slack event");
                    // Acknowledged now (Slack waits 3 s); answered in the thread behind it.
                    if let (Some(door), Some(m)) = (state.slack.clone(), message.cloned()) {
                        let mention = matches!(e.event, Event::Mention(_));
                        tokio::spawn(super::slack_conv::converse(
                            state.clone(),
                            door,
                            policy.clone(),
                            app.clone(),
                            e.team_id.clone(),
                            m,
                            mention,
                        ));
                    }
                    StatusCode::OK.into_response()
                }
                Ok(false) => {
                    state.metrics.slack_request("duplicate");
                    tracing::debug!(event = %e.event_id, retry = ?header(&headers, "x-slack-retry-num"), "a Slack event already taken");
                    StatusCode::OK.into_response()
                }
                // Not acknowledged: Slack retries, and the retry is taken once.
                Err(e) => ApiError::from(e).into_response(),
            }
        }
        _ => {
            state.metrics.slack_request("ignored");
            StatusCode::OK.into_response()
        }
    }
}

/// The interactivity request URL.
pub const INTERACTIONS_PATH: &str = "/slack/v1/interactions";

/// `POST /slack/v1/interactions`: a click on a proposal card's Approve (decided as the
/// person who clicked) or Reject (its reason dialog opens; its submission decides).
pub async fn interactions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (policy, app, inbound) = match verified(&state, &headers, &body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(door) = state.slack.clone() else {
        state.metrics.slack_request("ignored");
        return StatusCode::OK.into_response();
    };
    let client =
        crate::slack::api::Client::new(door.http.clone(), &door.api, app.bot_token.clone());
    // Decided behind the acknowledgement (Slack waits 3 s for it).
    let decide_behind = |click, id, verdict, reason| {
        let d = super::slack_conv::Decision {
            app: app.clone(),
            policy: policy.clone(),
            click,
            id,
            verdict,
            reason,
        };
        tokio::spawn(super::slack_conv::decide(
            state.clone(),
            door.clone(),
            client.clone(),
            d,
        ));
    };
    match inbound {
        Inbound::Action(a) => {
            state.metrics.slack_request("taken");
            let Some((action, id)) = a.actions.first().cloned() else {
                return StatusCode::OK.into_response();
            };
            if action == crate::slack::blocks::REJECT {
                // The dialog must open within 3 s of the click: now, before the answer.
                let name = state
                    .store
                    .get_proposal(&id)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| p.name)
                    .unwrap_or_default();
                if let Some(trigger) = &a.trigger_id
                    && let Err(e) = client
                        .open_view(
                            trigger,
                            &crate::slack::blocks::reject_dialog(
                                &id,
                                &name,
                                &crate::slack::blocks::CardAt {
                                    channel: a.channel_id.clone(),
                                    ts: a.message_ts.clone(),
                                    thread: a.thread_ts.clone(),
                                },
                            ),
                        )
                        .await
                {
                    tracing::info!(error = %e, "cannot open the reject dialog");
                }
                return StatusCode::OK.into_response();
            }
            if action == crate::slack::blocks::APPROVE {
                let click = super::slack_conv::Click {
                    slack_user: a.user_id,
                    card: crate::slack::blocks::CardAt {
                        channel: a.channel_id,
                        ts: a.message_ts,
                        thread: a.thread_ts,
                    },
                };
                decide_behind(click, id, "Approve", None);
            }
            StatusCode::OK.into_response()
        }
        Inbound::Submission(v) if v.callback_id == crate::slack::blocks::REJECT_DIALOG => {
            state.metrics.slack_request("taken");
            let reason = v
                .values
                .get(&("reason".to_owned(), "text".to_owned()))
                .cloned()
                .filter(|r| !r.trim().is_empty());
            let Some(reason) = reason else {
                return axum::Json(json!({"response_action": "errors", "errors": {"reason": "Say why the proposal is rejected."}})).into_response();
            };
            let (id, card) = crate::slack::blocks::dialog_metadata(&v.private_metadata);
            let click = super::slack_conv::Click {
                slack_user: v.user_id,
                card,
            };
            decide_behind(click, id, "Reject", Some(reason));
            // An empty 200 closes the dialog.
            StatusCode::OK.into_response()
        }
        _ => {
            state.metrics.slack_request("ignored");
            StatusCode::OK.into_response()
        }
    }
}

/// The slash command's request URL.
pub const COMMANDS_PATH: &str = "/slack/v1/commands";

/// `POST /slack/v1/commands`: `/kortex <question>` asks in the channel: Kortex posts the
/// question there (slash commands cannot be typed in threads) and investigates in that
/// message's thread, as for a mention.
pub async fn commands(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let (policy, app, inbound) = match verified(&state, &headers, &body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Inbound::Command(c) = inbound else {
        state.metrics.slack_request("ignored");
        return StatusCode::OK.into_response();
    };
    let ephemeral = |text: &str| {
        axum::Json(json!({"response_type": "ephemeral", "text": text})).into_response()
    };
    if !app.spec.channels.is_empty() && !app.spec.channels.contains(&c.channel_id) {
        state.metrics.slack_request("ignored");
        return ephemeral(
            "Kortex does not listen in this channel (the ChatPolicy's spec.slack.channels).",
        );
    }
    let question = c.text.trim().to_owned();
    if question.is_empty() || question == "help" {
        state.metrics.slack_request("ignored");
        return ephemeral(
            "Ask Kortex: `/kortex why is checkout failing?` — the answer comes in the thread of your question. You can also mention the app in a channel it is in.",
        );
    }
    let Some(door) = state.slack.clone() else {
        state.metrics.slack_request("ignored");
        return ephemeral("Kortex cannot post in Slack from this server.");
    };
    state.metrics.slack_request("taken");
    if let Some(rest) = super::slack_conv::handover_request(&question) {
        let rest = rest.to_owned();
        tokio::spawn(async move {
            let client =
                crate::slack::api::Client::new(door.http.clone(), &door.api, app.bot_token.clone());
            if let Err(why) = handover_from_channel(&state, &door, &client, &app, &c, &rest).await {
                tracing::info!(reason = %why, "a hand-over from Slack was refused");
                if let Err(e) = client
                    .post_ephemeral(&c.channel_id, &c.user_id, None, &why)
                    .await
                {
                    tracing::info!(error = %e, "cannot tell a Slack user why nothing was handed over");
                }
            }
        });
        return ephemeral("Handing your investigation over…");
    }
    tokio::spawn(async move {
        let client =
            crate::slack::api::Client::new(door.http.clone(), &door.api, app.bot_token.clone());
        let asked = format!(
            "<@{}> asked Kortex: {}",
            c.user_id,
            crate::slack::blocks::escape(&question)
        );
        let ts = match client.post_message(&c.channel_id, None, &asked, None).await {
            Ok(ts) => ts,
            Err(e) => {
                tracing::info!(error = %e, "cannot post a /kortex question");
                return;
            }
        };
        let m = crate::slack::inbound::Message {
            channel: c.channel_id,
            user: Some(c.user_id),
            text: question,
            ts,
            thread_ts: None,
            bot_id: None,
            subtype: None,
        };
        super::slack_conv::converse(state, door, policy, app, c.team_id, m, true).await;
    });
    // Acknowledged: the question appears in the channel, the answer in its thread.
    StatusCode::OK.into_response()
}

/// `/kortex handover @person [note]` in a channel (a slash command is not typed in a
/// thread): hands over the newest investigation of the channel's threads the person may
/// continue, and says so in its thread.
async fn handover_from_channel(
    state: &AppState,
    door: &super::slack_conv::SlackDoor,
    client: &crate::slack::api::Client,
    app: &SlackResolved,
    c: &crate::slack::inbound::SlashCommand,
    rest: &str,
) -> Result<(), String> {
    let person =
        crate::slack::identity::person(&app.spec.users, client, &c.user_id, &door.user_prefix)
            .await?;
    let caller = super::slack_conv::caller_of(state, door, &person)
        .await
        .map_err(|why| format!("Nothing was handed over. {why}"))?;
    let threads = state
        .store
        .slack_threads_in(&c.team_id, &c.channel_id, 50)
        .await
        .map_err(|e| format!("Nothing was handed over: {e}"))?;
    for (ts, session) in threads {
        if super::access::reachable(state, &caller, &session, crate::store::Access::Continue)
            .await
            .is_ok()
        {
            let thread = super::slack_conv::Thread {
                channel: &c.channel_id,
                ts: &ts,
            };
            return super::slack_conv::hand_over(
                state, door, client, app, &caller, &session, thread, rest,
            )
            .await;
        }
    }
    Err(format!(
        "Nothing was handed over: none of this channel's Kortex threads is an investigation you ({person}) may continue."
    ))
}
