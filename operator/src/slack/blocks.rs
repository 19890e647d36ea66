//! Block Kit as Kortex writes it, shared by the notifications' Slack format
//! (`notify::slack`) and the Slack app: mrkdwn escaping (text from models, alerts or people
//! can neither ping `<!channel>` nor disguise a link), Slack's length limits, and a pending
//! proposal as a card with Approve and Reject buttons (a click decides as the person who
//! clicked, `docs/slack.md`) and Reject's reason dialog.

use serde_json::{Value, json};

/// A string of `v`, escaped for Slack's mrkdwn (`&`, `<`, `>`): text from models, alerts
/// or people can neither ping `<!channel>` nor disguise a link.
pub fn text(v: &Value, key: &str) -> String {
    escape(v.get(key).and_then(Value::as_str).unwrap_or_default())
}

/// Slack refuses a section's text longer than 3000 characters.
pub const SECTION_MAX: usize = 2_900;

/// `s` cut to at most `max` characters, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// A target object (`{kind, namespace, name}`) as `Kind namespace/name`.
pub fn target(v: &Value) -> String {
    let t = &v["target"];
    match (t["kind"].as_str(), t["name"].as_str()) {
        (Some(kind), Some(name)) => match t["namespace"].as_str() {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        },
        _ => "-".into(),
    }
}

/// The `action_id` of a card's Approve button (its `value`: the proposal's id).
pub const APPROVE: &str = "kortex_approve";
/// The `action_id` of a card's Reject button.
pub const REJECT: &str = "kortex_reject";
/// The `callback_id` of Reject's reason dialog (its `private_metadata`: the proposal's id).
pub const REJECT_DIALOG: &str = "kortex_reject_reason";

/// A pending proposal (`p`: as the API lists it, with `id`, `name`, `namespace`, `spec` and
/// `status.preview`) as a card: what, on what, why, the blast radius, the preview's
/// warnings, and Approve (with a confirmation) and Reject.
pub fn proposal_card(p: &Value) -> Vec<Value> {
    let spec = &p["spec"];
    let id = p["id"].as_str().unwrap_or_default();
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": format!(
            ":hourglass: Proposal *{}* waits for a decision", text(p, "name"))}}),
        json!({"type": "section", "fields": [
            {"type": "mrkdwn", "text": format!("*Action*\n{}", text(spec, "action"))},
            {"type": "mrkdwn", "text": format!("*Target*\n{}", target(spec))},
        ]}),
    ];
    for (key, label) in [("rationale", "Why"), ("blastRadius", "Blast radius")] {
        let value = text(spec, key);
        if !value.is_empty() {
            blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                "text": format!("*{label}*\n{}", clip(&value, SECTION_MAX))}}));
        }
    }
    let preview = &p["status"]["preview"];
    let code = |v: &Value| -> String {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        escape(&text).replace("```", "'''")
    };
    if let Some(diff) = preview["diff"].as_str().filter(|d| !d.trim().is_empty()) {
        // A change through Git: the diff of the pull/merge request to be.
        let title = format!("*Change* in `{}`", code(&preview["path"]));
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
            "text": clip(&format!("{title}\n```{}```", code(&json!(diff))), SECTION_MAX)}}));
    } else if !preview["before"].is_null() || !preview["after"].is_null() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
            "text": clip(&format!("*Preview* (server-side dry run)\n```before: {}\nafter:  {}```",
                code(&preview["before"]), code(&preview["after"])), SECTION_MAX)}}));
    }
    let warnings: Vec<String> = p["status"]["preview"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|w| format!(":warning: {}", escape(w)))
        .collect();
    if !warnings.is_empty() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
            "text": clip(&warnings.join("\n"), SECTION_MAX)}}));
    }
    blocks.push(json!({"type": "actions", "block_id": "kortex_decide", "elements": [
        {"type": "button", "action_id": APPROVE, "value": id, "style": "primary",
         "text": {"type": "plain_text", "text": "Approve"},
         "confirm": {"title": {"type": "plain_text", "text": "Approve the proposal?"},
            "text": {"type": "mrkdwn", "text": format!("{} {} — decided as you, under your rights in the cluster.",
                text(spec, "action"), target(spec))},
            "confirm": {"type": "plain_text", "text": "Approve"},
            "deny": {"type": "plain_text", "text": "Cancel"}}},
        {"type": "button", "action_id": REJECT, "value": id, "style": "danger",
         "text": {"type": "plain_text", "text": "Reject"}},
    ]}));
    blocks
}

/// Reject's dialog: the reason (required), for proposal `id` named `name`.
pub fn reject_dialog(id: &str, name: &str, card: &CardAt) -> Value {
    let meta = json!({"id": id, "channel": card.channel, "ts": card.ts, "thread": card.thread});
    json!({"type": "modal", "callback_id": REJECT_DIALOG, "private_metadata": meta.to_string(),
    "title": {"type": "plain_text", "text": "Reject the proposal"},
    "submit": {"type": "plain_text", "text": "Reject"},
    "close": {"type": "plain_text", "text": "Cancel"},
    "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": format!("Reject *{}*: say why.", escape(name))}},
        {"type": "input", "block_id": "reason", "label": {"type": "plain_text", "text": "Reason"},
         "element": {"type": "plain_text_input", "action_id": "text", "multiline": true, "max_length": 1000}},
    ]})
}

/// Where a proposal's card is (so that Reject's dialog, once submitted, updates it).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CardAt {
    /// Its channel.
    pub channel: Option<String>,
    /// Its `ts`.
    pub ts: Option<String>,
    /// Its thread.
    pub thread: Option<String>,
}

/// The proposal and its card of a Reject dialog's `private_metadata` (Slack returns it as
/// Kortex set it, in the signed submission).
pub fn dialog_metadata(meta: &str) -> (String, CardAt) {
    #[derive(serde::Deserialize)]
    struct Meta {
        id: String,
        #[serde(flatten)]
        card: CardAt,
    }
    match serde_json::from_str::<Meta>(meta) {
        Ok(m) => (m.id, m.card),
        // A dialog opened before its card was remembered: the proposal alone.
        Err(_) => (meta.to_owned(), CardAt::default()),
    }
}

/// `s` escaped for mrkdwn.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_proposal_is_a_card_with_buttons_that_name_it_and_escape_what_models_wrote() {
        let p = json!({"id": "01prop", "name": "restart-api-x1", "namespace": "shop",
            "spec": {"action": "restart", "rationale": "stuck <!channel> & co",
                "blastRadius": "api pods restart one at a time",
                "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"}},
            "status": {"preview": {"warnings": ["managed by Argo CD: <https://evil|click>"],
                "before": {"replicas": 2}, "after": {"replicas": 3}}}});
        let blocks = proposal_card(&p);
        let text = serde_json::to_string(&blocks).unwrap_or_default();
        assert!(text.contains("Deployment shop/api"), "{text}");
        assert!(
            text.contains(r#"before: {\"replicas\":2}\nafter:  {\"replicas\":3}"#),
            "the dry run's before and after: {text}"
        );
        assert!(text.contains("stuck &lt;!channel&gt; &amp; co"), "{text}");
        assert!(
            !text.contains("<!channel>") && !text.contains("<https://evil"),
            "{text}"
        );
        let actions = blocks.last().cloned().unwrap_or_default();
        let buttons = actions["elements"].as_array().cloned().unwrap_or_default();
        assert_eq!(buttons[0]["action_id"], APPROVE);
        assert_eq!(buttons[0]["value"], "01prop");
        assert!(buttons[0]["confirm"].is_object(), "Approve asks first");
        assert_eq!(buttons[1]["action_id"], REJECT);
        let card = CardAt {
            channel: Some("C1".into()),
            ts: Some("1.2".into()),
            thread: None,
        };
        let dialog = reject_dialog("01prop", "restart-api-x1", &card);
        let meta = dialog["private_metadata"].as_str().unwrap_or_default();
        assert_eq!(dialog_metadata(meta), ("01prop".to_owned(), card));
        assert_eq!(
            dialog_metadata("01old"),
            ("01old".to_owned(), CardAt::default())
        );
        assert_eq!(dialog["callback_id"], REJECT_DIALOG);
        assert_eq!(dialog["blocks"][1]["block_id"], "reason");
        // Slack's limits: a modal's title at most 24 characters.
        assert!(dialog["title"]["text"].as_str().unwrap_or_default().len() <= 24);
    }
}
