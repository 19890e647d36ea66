//! What Slack sends a Slack app, parsed once its signature held (`super::verify`): Events
//! API deliveries (JSON: `url_verification`, `event_callback` with `app_mention` or
//! `message`), slash commands (a form), and interactivity (a form whose `payload` is JSON:
//! `block_actions`, `view_submission`). Parsing tolerates the fields Slack adds and only
//! requires the ones Kortex acts on; whatever else Slack sends is [`Inbound::Other`],
//! acknowledged and left alone.

use serde_json::Value;
use std::collections::BTreeMap;

/// One request from Slack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// Events API setup: answer with the challenge.
    UrlVerification {
        /// The challenge to echo.
        challenge: String,
    },
    /// An Events API delivery.
    Event(EventCallback),
    /// A slash command.
    Command(SlashCommand),
    /// A click on a button of a message.
    Action(BlockAction),
    /// A modal submitted.
    Submission(ViewSubmission),
    /// Something else Slack sends (its type): acknowledged, ignored.
    Other(String),
}

/// `event_callback`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventCallback {
    /// The workspace.
    pub team_id: String,
    /// Globally unique: a retried delivery carries the same id.
    pub event_id: String,
    /// The event.
    pub event: Event,
}

/// The inner event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Someone mentioned the app (`app_mention`).
    Mention(Message),
    /// A message in a channel the app is in (`message`).
    Message(Message),
    /// Another event type.
    Other(String),
}

/// A message as an event carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The channel id.
    pub channel: String,
    /// Who wrote it (absent for some bot messages).
    pub user: Option<String>,
    /// Its text, mentions as `<@U…>`.
    pub text: String,
    /// Its id in the channel.
    pub ts: String,
    /// The thread's first message, when it is a reply.
    pub thread_ts: Option<String>,
    /// Set when a bot (this app among them) wrote it.
    pub bot_id: Option<String>,
    /// `message_changed`, `bot_message`, …
    pub subtype: Option<String>,
}

impl Message {
    /// The thread it belongs to: its parent's `ts`, or its own when it starts one.
    pub fn thread(&self) -> &str {
        self.thread_ts.as_deref().unwrap_or(&self.ts)
    }

    /// Whether a person wrote it as a plain message (not a bot, an edit, a join…).
    pub fn from_a_person(&self) -> bool {
        self.bot_id.is_none()
            && self.user.is_some()
            && self
                .subtype
                .as_deref()
                .is_none_or(|s| s == "thread_broadcast")
    }

    /// The text without the mentions it starts with (the app's `<@U…>`), trimmed.
    pub fn question(&self) -> String {
        let mut rest = self.text.trim_start();
        while let Some(after) = rest.strip_prefix("<@") {
            match after.find('>') {
                Some(end) => rest = after[end + 1..].trim_start(),
                None => break,
            }
        }
        rest.trim().to_owned()
    }
}

/// A slash command (`/kortex …`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlashCommand {
    /// The workspace.
    pub team_id: String,
    /// Where it was typed.
    pub channel_id: String,
    /// Who typed it.
    pub user_id: String,
    /// The command, `/kortex`.
    pub command: String,
    /// What follows it.
    pub text: String,
    /// Where to answer (five times within 30 minutes).
    pub response_url: Option<String>,
    /// Opens a modal within 3 seconds.
    pub trigger_id: Option<String>,
}

/// A button clicked in a message (`block_actions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockAction {
    /// The workspace.
    pub team_id: String,
    /// Who clicked.
    pub user_id: String,
    /// The message's channel.
    pub channel_id: Option<String>,
    /// The message's `ts`.
    pub message_ts: Option<String>,
    /// The message's thread, when it is in one.
    pub thread_ts: Option<String>,
    /// The buttons' `action_id` and `value`.
    pub actions: Vec<(String, String)>,
    /// Where to answer the clicker.
    pub response_url: Option<String>,
    /// Opens a modal within 3 seconds.
    pub trigger_id: Option<String>,
}

/// A modal submitted (`view_submission`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSubmission {
    /// The workspace.
    pub team_id: String,
    /// Who submitted it.
    pub user_id: String,
    /// The modal's `callback_id`.
    pub callback_id: String,
    /// What the app put in it when opening it.
    pub private_metadata: String,
    /// Each input's value, by `(block_id, action_id)`.
    pub values: BTreeMap<(String, String), String>,
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn opt(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

fn required(v: &Value, what: &str) -> Result<String, String> {
    opt(v).ok_or_else(|| format!("the Slack request has no {what}"))
}

fn message(e: &Value) -> Result<Message, String> {
    Ok(Message {
        channel: required(&e["channel"], "event.channel")?,
        user: opt(&e["user"]),
        text: text(&e["text"]),
        ts: required(&e["ts"], "event.ts")?,
        thread_ts: opt(&e["thread_ts"]),
        bot_id: opt(&e["bot_id"]),
        subtype: opt(&e["subtype"]),
    })
}

/// Parses a verified request body by its `Content-Type`.
pub fn parse(content_type: &str, body: &[u8]) -> Result<Inbound, String> {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match media.as_str() {
        "application/json" => {
            let v: Value = serde_json::from_slice(body)
                .map_err(|e| format!("the Slack request is not JSON: {e}"))?;
            json_payload(&v)
        }
        "application/x-www-form-urlencoded" => {
            let form: BTreeMap<String, String> =
                url::form_urlencoded::parse(body).into_owned().collect();
            match form.get("payload") {
                Some(payload) => {
                    let v: Value = serde_json::from_str(payload)
                        .map_err(|e| format!("the Slack interaction payload is not JSON: {e}"))?;
                    interaction(&v)
                }
                None => command(&form),
            }
        }
        other => Err(format!(
            "a Slack request is JSON or a form, not {:?}",
            if other.is_empty() {
                "no Content-Type"
            } else {
                other
            }
        )),
    }
}

fn json_payload(v: &Value) -> Result<Inbound, String> {
    match v["type"].as_str().unwrap_or_default() {
        "url_verification" => Ok(Inbound::UrlVerification {
            challenge: required(&v["challenge"], "challenge")?,
        }),
        "event_callback" => {
            let e = &v["event"];
            let event = match e["type"].as_str().unwrap_or_default() {
                "app_mention" => Event::Mention(message(e)?),
                "message" => Event::Message(message(e)?),
                other => Event::Other(other.to_owned()),
            };
            Ok(Inbound::Event(EventCallback {
                team_id: required(&v["team_id"], "team_id")?,
                event_id: required(&v["event_id"], "event_id")?,
                event,
            }))
        }
        other => Ok(Inbound::Other(other.to_owned())),
    }
}

fn command(form: &BTreeMap<String, String>) -> Result<Inbound, String> {
    let field = |name: &str| form.get(name).cloned().unwrap_or_default();
    let need = |name: &str| {
        form.get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| format!("the Slack command has no {name}"))
    };
    if form.contains_key("ssl_check") {
        return Ok(Inbound::Other("ssl_check".into()));
    }
    Ok(Inbound::Command(SlashCommand {
        team_id: need("team_id")?,
        channel_id: need("channel_id")?,
        user_id: need("user_id")?,
        command: need("command")?,
        text: field("text").trim().to_owned(),
        response_url: form.get("response_url").filter(|v| !v.is_empty()).cloned(),
        trigger_id: form.get("trigger_id").filter(|v| !v.is_empty()).cloned(),
    }))
}

fn interaction(v: &Value) -> Result<Inbound, String> {
    let team_id = opt(&v["team"]["id"])
        .or_else(|| opt(&v["user"]["team_id"]))
        .ok_or("the Slack interaction has no team")?;
    let user_id = required(&v["user"]["id"], "user.id")?;
    match v["type"].as_str().unwrap_or_default() {
        "block_actions" => {
            let actions = v["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| (text(&a["action_id"]), text(&a["value"])))
                .collect();
            Ok(Inbound::Action(BlockAction {
                team_id,
                user_id,
                channel_id: opt(&v["channel"]["id"]).or_else(|| opt(&v["container"]["channel_id"])),
                message_ts: opt(&v["container"]["message_ts"]).or_else(|| opt(&v["message"]["ts"])),
                thread_ts: opt(&v["message"]["thread_ts"]),
                actions,
                response_url: opt(&v["response_url"]),
                trigger_id: opt(&v["trigger_id"]),
            }))
        }
        "view_submission" => {
            let view = &v["view"];
            let mut values = BTreeMap::new();
            for (block, inputs) in view["state"]["values"].as_object().into_iter().flatten() {
                for (action, input) in inputs.as_object().into_iter().flatten() {
                    // A plain-text input's `value` (null when left empty), or a selected
                    // option's value.
                    let value = opt(&input["value"])
                        .or_else(|| opt(&input["selected_option"]["value"]))
                        .unwrap_or_default();
                    values.insert((block.clone(), action.clone()), value);
                }
            }
            Ok(Inbound::Submission(ViewSubmission {
                team_id,
                user_id,
                callback_id: text(&view["callback_id"]),
                private_metadata: text(&view["private_metadata"]),
                values,
            }))
        }
        other => Ok(Inbound::Other(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const JSON: &str = "application/json";
    const FORM: &str = "application/x-www-form-urlencoded";

    #[test]
    fn events_api_deliveries_parse_as_slack_documents_them() {
        let challenge = json!({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"});
        assert_eq!(
            parse(JSON, challenge.to_string().as_bytes()),
            Ok(Inbound::UrlVerification {
                challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into()
            })
        );
        // The app_mention example (with `event_time` in microseconds, as documented), in a
        // thread, with a field Slack may add.
        let mention = json!({"token": "ZZZZZZWSxiZZZ2yIvs3peJ", "team_id": "T123ABC456", "api_app_id": "A123ABC456",
            "event": {"type": "app_mention", "user": "U123ABC456", "text": "<@U0LAN0Z89> why is checkout failing?",
                "ts": "1515449522.000016", "thread_ts": "1515449500.000001", "channel": "C123ABC456", "event_ts": "1515449522000016"},
            "type": "event_callback", "event_id": "Ev123ABC456", "event_time": 1_515_449_522_000_016_i64,
            "authorizations": [{"team_id": "T123ABC456", "user_id": "U123ABC456", "is_bot": false}],
            "is_ext_shared_channel": false});
        let Ok(Inbound::Event(e)) = parse(
            "application/json; charset=utf-8",
            mention.to_string().as_bytes(),
        ) else {
            panic!("not an event");
        };
        assert_eq!(e.team_id, "T123ABC456");
        assert_eq!(e.event_id, "Ev123ABC456");
        let Event::Mention(m) = e.event else {
            panic!("not a mention")
        };
        assert_eq!(m.question(), "why is checkout failing?");
        assert_eq!(m.thread(), "1515449500.000001");
        assert!(m.from_a_person());
        // The app's own message comes back with its bot_id: not a person's.
        let own = json!({"type": "event_callback", "team_id": "T1", "event_id": "Ev2",
            "event": {"type": "message", "subtype": "bot_message", "bot_id": "B1", "channel": "C1", "text": "answer", "ts": "2.0"}});
        let Ok(Inbound::Event(EventCallback {
            event: Event::Message(m),
            ..
        })) = parse(JSON, own.to_string().as_bytes())
        else {
            panic!("not a message");
        };
        assert!(!m.from_a_person());
        assert_eq!(m.thread(), "2.0");
        // Other events and other types are acknowledged and ignored; broken ones are named.
        let other = json!({"type": "event_callback", "team_id": "T1", "event_id": "Ev3", "event": {"type": "reaction_added"}});
        assert!(matches!(
            parse(JSON, other.to_string().as_bytes()),
            Ok(Inbound::Event(EventCallback {
                event: Event::Other(_),
                ..
            }))
        ));
        assert_eq!(
            parse(JSON, br#"{"type": "app_rate_limited"}"#),
            Ok(Inbound::Other("app_rate_limited".into()))
        );
        assert!(
            parse(
                JSON,
                br#"{"type": "event_callback", "team_id": "T1", "event": {"type": "reaction_added"}}"#
            )
            .is_err_and(|e| e.contains("event_id"))
        );
        assert!(parse(JSON, b"{").is_err_and(|e| e.contains("not JSON")));
        assert!(parse("text/plain", b"x").is_err_and(|e| e.contains("JSON or a form")));
    }

    #[test]
    fn slash_commands_and_interactions_parse_from_their_forms() {
        let body = "token=gIkuvaNzQIHg97ATvDxqgjtO&team_id=T0001&team_domain=example&channel_id=C2147483705&channel_name=test&user_id=U2147483697&user_name=Steve&command=%2Fkortex&text=why+is+checkout+failing%3F&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1234%2F5678&trigger_id=13345224609.738474920.8088930838d88f008e0&api_app_id=A123456";
        assert_eq!(
            parse(FORM, body.as_bytes()),
            Ok(Inbound::Command(SlashCommand {
                team_id: "T0001".into(),
                channel_id: "C2147483705".into(),
                user_id: "U2147483697".into(),
                command: "/kortex".into(),
                text: "why is checkout failing?".into(),
                response_url: Some("https://hooks.slack.com/commands/1234/5678".into()),
                trigger_id: Some("13345224609.738474920.8088930838d88f008e0".into()),
            }))
        );
        assert!(parse(FORM, b"team_id=T1&user_id=U1").is_err_and(|e| e.contains("channel_id")));
        assert_eq!(
            parse(FORM, b"ssl_check=1&token=x"),
            Ok(Inbound::Other("ssl_check".into()))
        );

        let click = json!({"type": "block_actions", "team": {"id": "T9TK3CUKW", "domain": "example"},
            "user": {"id": "UA8RXUSPL", "username": "jtorrance", "team_id": "T9TK3CUKW"},
            "container": {"type": "message", "message_ts": "1548261231.000200", "channel_id": "CBR2V3XEX", "is_ephemeral": false},
            "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
            "channel": {"id": "CBR2V3XEX", "name": "review-updates"},
            "message": {"ts": "1548261231.000200", "thread_ts": "1548261000.000100", "text": "proposal"},
            "response_url": "https://hooks.slack.com/actions/AABA1ABCD/1232321423432/D09sSasdasdAS9091209",
            "actions": [{"action_id": "approve", "block_id": "p", "value": "01proposal", "type": "button", "action_ts": "1548426417.840180"}]});
        let form = format!(
            "payload={}",
            url::form_urlencoded::byte_serialize(click.to_string().as_bytes()).collect::<String>()
        );
        let Ok(Inbound::Action(a)) = parse(FORM, form.as_bytes()) else {
            panic!("not an action")
        };
        assert_eq!(a.user_id, "UA8RXUSPL");
        assert_eq!(a.channel_id.as_deref(), Some("CBR2V3XEX"));
        assert_eq!(a.message_ts.as_deref(), Some("1548261231.000200"));
        assert_eq!(a.thread_ts.as_deref(), Some("1548261000.000100"));
        assert_eq!(
            a.actions,
            vec![("approve".to_owned(), "01proposal".to_owned())]
        );

        let submit = json!({"type": "view_submission", "team": {"id": "T1"}, "user": {"id": "U1"},
            "view": {"callback_id": "reject", "private_metadata": "01proposal",
                "state": {"values": {"reason": {"text": {"type": "plain_text_input", "value": "not now"}},
                    "empty": {"text": {"type": "plain_text_input", "value": null}}}}}});
        let form = format!(
            "payload={}",
            url::form_urlencoded::byte_serialize(submit.to_string().as_bytes()).collect::<String>()
        );
        let Ok(Inbound::Submission(s)) = parse(FORM, form.as_bytes()) else {
            panic!("not a submission")
        };
        assert_eq!(s.callback_id, "reject");
        assert_eq!(s.private_metadata, "01proposal");
        assert_eq!(
            s.values[&("reason".to_owned(), "text".to_owned())],
            "not now"
        );
        assert_eq!(s.values[&("empty".to_owned(), "text".to_owned())], "");
        assert!(parse(FORM, b"payload=%7B").is_err_and(|e| e.contains("not JSON")));
    }
}
