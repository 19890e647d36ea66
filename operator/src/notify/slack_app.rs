//! The events a policy's Slack app posts itself (`spec.slack.post`, `docs/slack.md#posting`),
//! through the Web API with its bot token — unlike `format: slack` targets, which only
//! reach an incoming webhook. They are deliveries like any other (target [`TARGET`]: at
//! least once, retried with backoff), and they know threads:
//! - `investigation.started` opens a thread for the investigation (the alert's message) and
//!   binds it to the session, so a question asked there continues the investigation; a
//!   later run of the same alert group says so in that thread;
//! - every other event of a session that has a Slack thread goes into that thread — the
//!   verdict (`investigation.finished`) among them;
//! - a proposal waiting for a decision is a card with Approve and Reject buttons: posted by
//!   `proposal.pending` when the app posts that event, otherwise with the verdict of the
//!   investigation that made it (and, for a conversation in a thread, by that conversation).

use crate::catalog::SlackResolved;
use crate::slack::api::Client;
use crate::slack::blocks::{clip, escape, text};
use crate::store::{Delivery, Store};
use serde_json::{Value, json};

/// The delivery target of a policy's Slack app (not a valid `notify` target name, so it
/// cannot be mistaken for one).
pub const TARGET: &str = "@slack";

/// Whether `app` posts events of type `event_type`.
pub fn posts(app: &SlackResolved, event_type: &str) -> bool {
    app.spec
        .post
        .as_ref()
        .is_some_and(|p| p.events.iter().any(|e| e.as_str() == event_type))
}

/// Sends `delivery` through `app`'s bot. The error never holds the token.
pub async fn send(
    store: &Store,
    client: &Client,
    app: &SlackResolved,
    delivery: &Delivery,
    public_url: Option<&str>,
) -> Result<(), String> {
    let Some(post) = &app.spec.post else {
        return Err("the policy's Slack app no longer posts events (spec.slack.post)".into());
    };
    let event = &delivery.event;
    let team = &app.spec.team_id;
    let session = event.data["sessionId"].as_str();
    let thread = match session {
        Some(s) => store
            .slack_thread_of(team, s)
            .await
            .map_err(|e| e.to_string())?,
        None => None,
    };
    let (channel, thread_ts) = match &thread {
        Some((c, ts)) => (c.as_str(), Some(ts.as_str())),
        None => (post.channel.as_str(), None),
    };
    if event.event_type == "proposal.pending" {
        let Some(p) = store
            .get_proposal(&event.subject)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        return card(client, channel, thread_ts, &p).await;
    }
    let (text, blocks) = if event.event_type == "investigation.started" {
        started(event, thread.is_some(), public_url)
    } else {
        // The incoming webhook's rendering: the same words in both ways to Slack.
        let body = super::slack::body(delivery, public_url);
        (
            body["text"].as_str().unwrap_or_default().to_owned(),
            body["blocks"].clone(),
        )
    };
    let ts = client
        .post_message(channel, thread_ts, &clip(&text, 3_900), Some(&blocks))
        .await
        .map_err(|e| e.to_string())?;
    if event.event_type == "investigation.started"
        && thread.is_none()
        && let Some(session) = session
    {
        // The alert's message is the investigation's thread from now on.
        store
            .bind_slack_thread(team, channel, &ts, session)
            .await
            .map_err(|e| e.to_string())?;
    }
    if event.event_type == "investigation.finished"
        && !posts(app, "proposal.pending")
        && let Some(session) = session
    {
        let thread_ts = thread_ts.unwrap_or(&ts);
        for id in event.data["proposals"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["id"].as_str())
        {
            let found = store.get_proposal(id).await.map_err(|e| e.to_string())?;
            if let Some(p) = found.filter(|p| p.session_id.as_deref() == Some(session)) {
                card(client, channel, Some(thread_ts), &p).await?;
            }
        }
    }
    Ok(())
}

/// Posts proposal `p`'s card with its buttons (if it still waits).
async fn card(
    client: &Client,
    channel: &str,
    thread_ts: Option<&str>,
    p: &crate::store::ProposalRecord,
) -> Result<(), String> {
    if p.phase != crate::crd::ProposalPhase::Pending {
        return Ok(());
    }
    let view = crate::proposals::view(p);
    let blocks = Value::Array(crate::slack::blocks::proposal_card(&view));
    client
        .post_message(
            channel,
            thread_ts,
            &format!("Proposal {} waits for a decision", p.name),
            Some(&blocks),
        )
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `investigation.started`: the alert's message (`again`: a later run in its thread).
fn started(
    event: &crate::store::NotifyEventRecord,
    again: bool,
    public_url: Option<&str>,
) -> (String, Value) {
    let p = &event.data;
    let firing = p["firing"].as_u64().unwrap_or(0);
    let headline = if again {
        format!(
            ":arrows_counterclockwise: {firing} alert(s) firing: Kortex investigates again in this thread"
        )
    } else {
        format!(
            ":rotating_light: *{}* — {firing} alert(s) firing. Kortex is investigating (trigger *{}* of {}); ask in this thread.",
            alert_names(p),
            text(p, "trigger"),
            escape(&event.policy),
        )
    };
    let lines: Vec<String> = p["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let mut line = format!("• *{}*", text(a, "alertname"));
            let tags: Vec<String> = ["severity", "namespace"]
                .iter()
                .map(|k| text(a, k))
                .filter(|v| !v.is_empty())
                .collect();
            if !tags.is_empty() {
                line.push_str(&format!(" ({})", tags.join(", ")));
            }
            let summary = text(a, "summary");
            if !summary.is_empty() {
                line.push_str(&format!(": {summary}"));
            }
            line
        })
        .collect();
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": clip(&headline, crate::slack::blocks::SECTION_MAX)}}),
    ];
    if !lines.is_empty() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
            "text": clip(&lines.join("\n"), crate::slack::blocks::SECTION_MAX)}}));
    }
    if let (Some(base), Some(id)) = (public_url, p["sessionId"].as_str()) {
        let link = format!("{}/#/chat/{id}", base.trim_end_matches('/'));
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn",
            "text": format!("<{link}|Open the investigation in Kortex>")}]}));
    }
    (headline.replace('*', ""), Value::Array(blocks))
}

/// The distinct alert names of `investigation.started`'s data, comma-separated.
fn alert_names(p: &Value) -> String {
    let mut names: Vec<String> = Vec::new();
    for a in p["alerts"].as_array().into_iter().flatten() {
        let name = text(a, "alertname");
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        "An alert".into()
    } else {
        names.join(", ")
    }
}
