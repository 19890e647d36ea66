//! `format: slack`: a Slack incoming webhook's JSON — `text` (the fallback line) and
//! `blocks`: the headline, the proposal's action, target, rationale and preview, how to
//! decide with `kubectl kortex`, and a button linking to the dashboard (`--public-url`).

use super::{Channel, Outgoing, Rendered, proposal_link, session_link};
use crate::slack::blocks::{SECTION_MAX, clip, target, text};
use crate::store::Delivery;
use serde_json::json;

/// Slack incoming webhooks.
pub struct Slack;

impl Channel for Slack {
    fn render(&self, out: &Outgoing<'_>) -> Rendered {
        Rendered {
            body: body(out.delivery, out.public_url).to_string().into_bytes(),
            headers: vec![("X-Kortex-Delivery", out.delivery.id.clone())],
        }
    }
}

/// The message of `delivery`'s event: `text` (the fallback line) and `blocks`.
// Long because a match over the notification event types, each arm the Slack blocks of one type.
pub fn body(delivery: &Delivery, public_url: Option<&str>) -> serde_json::Value {
    let event = &delivery.event;
    let p = &event.data;
    let name = text(p, "name");
    let ns = text(p, "namespace");
    let action = text(p, "action");
    let headline = match event.event_type.as_str() {
        "proposal.pending" => format!(":hourglass: Proposal *{name}* waits for a decision"),
        "proposal.decided" => format!(
            ":ballot_box_with_check: Proposal *{name}* was {} by {}",
            text(p, "phase").to_ascii_lowercase(),
            p["decision"]["by"].as_str().unwrap_or("someone")
        ),
        "proposal.executed" => format!(":white_check_mark: Proposal *{name}* was carried out"),
        "proposal.failed" => format!(":x: Proposal *{name}* failed: {}", text(p, "message")),
        "proposal.expired" => format!(":zzz: Proposal *{name}* expired undecided"),
        "budget.alert" => format!(":warning: {}", text(p, "message")),
        "budget.exhausted" => format!(":no_entry: {}", text(p, "message")),
        "provider.unavailable" => format!(
            ":electric_plug: LLMProvider *{}* is unavailable: {}",
            text(p, "provider"),
            text(p, "message")
        ),
        "run.failed" => format!(
            ":x: A chat run of *{}* failed in session {} ({}): {}",
            text(p, "user"),
            text(p, "sessionName"),
            text(p, "namespace"),
            text(p, "reason")
        ),
        "session.handover" => format!(
            ":handshake: *{}* handed session *{}* ({}) over to *{}*",
            text(p, "from"),
            text(p, "sessionName"),
            text(p, "namespace"),
            text(p, "to")
        ),
        "investigation.started" => format!(
            ":rotating_light: Trigger *{}* of {} is investigating {} firing alert(s)",
            text(p, "trigger"),
            event.policy,
            p["firing"].as_u64().unwrap_or(0)
        ),
        "investigation.finished" => format!(
            ":mag: Trigger *{}* of {} finished its investigation ({}){}",
            text(p, "trigger"),
            event.policy,
            text(p, "status"),
            match p["proposals"].as_array().map_or(0, Vec::len) {
                0 => String::new(),
                n => format!(": {n} proposal(s) wait for a decision"),
            }
        ),
        "trigger.skipped" => format!(
            ":double_vertical_bar: Trigger *{}* of {} skipped alerts: {}",
            text(p, "trigger"),
            event.policy,
            text(p, "reason")
        ),
        other => format!("{other}: {name}"),
    };
    if !event.event_type.starts_with("proposal.") {
        let fallback = headline.replace('*', "");
        let mut blocks =
            vec![json!({"type": "section", "text": {"type": "mrkdwn", "text": headline}})];
        for (key, label) in [
            ("title", "Incident"),
            ("note", "Note"),
            ("summary", "Summary"),
            ("answer", "Verdict"),
        ] {
            let value = text(p, key);
            if !value.is_empty() {
                blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                        "text": format!("*{label}*\n{}", clip(&value, SECTION_MAX))}}));
            }
        }
        // A triggered investigation's proposals, each with the line that approves it.
        let proposals: Vec<String> = p["proposals"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|q| {
                format!(
                    "• {} `{}` — `kubectl kortex approve {} -n {}`",
                    text(q, "action"),
                    text(q, "name"),
                    text(q, "name"),
                    text(q, "namespace")
                )
            })
            .collect();
        if !proposals.is_empty() {
            blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                    "text": clip(&format!("*Proposals*\n{}", proposals.join("\n")), SECTION_MAX)}}));
        }
        let mut context = format!("Policy {}", event.policy);
        if event.event_type == "investigation.finished" {
            context = format!(
                "{context} · {} tokens in, {} out · ${:.4}",
                p["inputTokens"].as_i64().unwrap_or(0),
                p["outputTokens"].as_i64().unwrap_or(0),
                p["costUsd"].as_f64().unwrap_or(0.0)
            );
        }
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]}));
        if let Some(link) = session_link(public_url, delivery) {
            blocks.push(json!({"type": "actions", "elements": [{
                "type": "button",
                "text": {"type": "plain_text", "text": "Open session"},
                "url": link,
            }]}));
        }
        return json!({"text": fallback, "blocks": blocks});
    }
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": headline}}),
        json!({"type": "section", "fields": [
            {"type": "mrkdwn", "text": format!("*Action*\n{action}")},
            {"type": "mrkdwn", "text": format!("*Target*\n{}", target(p))},
            {"type": "mrkdwn", "text": format!("*Proposed by*\n{}", text(p, "user"))},
            {"type": "mrkdwn", "text": format!("*Policy*\n{}", event.policy)},
        ]}),
    ];
    let rationale = text(p, "rationale");
    if !rationale.is_empty() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": format!("*Why*\n{}", clip(&rationale, SECTION_MAX))}}));
    }
    if let Some(summary) = p["preview"]["summary"].as_str() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": format!("*Preview*\n{}", clip(summary, SECTION_MAX))}}));
    }
    if event.event_type == "proposal.pending" {
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": format!(
                "`kubectl kortex approve {name} -n {ns}` or `kubectl kortex reject {name} -n {ns} --reason ...`"
            )}]}));
    }
    if let Some(link) = proposal_link(public_url, delivery) {
        blocks.push(json!({"type": "actions", "elements": [{
            "type": "button",
            "text": {"type": "plain_text", "text": "Open in Kortex"},
            "url": link,
        }]}));
    }
    let fallback = headline.replace('*', "");
    json!({"text": fallback, "blocks": blocks})
}
