//! The Slack phase (docs/slack.md) on the real API server: a scripted Slack Web API on
//! 127.0.0.1, and Events API and interactivity requests signed exactly as Slack signs them.
//! pat asks in a thread and the model proposes restarting ticker; the card's Approve is
//! clicked by three people, each decided **as that person** by impersonation (Kortex's
//! ServiceAccount granted config/rbac/slack_impersonate.yaml, scoped to them):
//! - kim may use the policy but has no `patch` on ActionProposals: the API server refuses;
//! - pat may approve, but proposed it: the admission policy refuses (four-eyes);
//! - sam (the approver role, and restarts) approves, and Kortex restarts ticker.
//!
//! Needs Kortex started with [`Slack::args`].

use super::slack_api::Slack as ScriptedSlack;
use super::{Scene, apply, wait_for, wait_phase};
use kortex::crd::{ActionProposal, ProposalPhase};
use kube::api::Api;
use serde_json::{Value, json};
use std::time::Duration;

const SIGNING: &str = "e2e-signing-secret-0123456789abcdef";
const TEAM: &str = "T0E2E";
const CHANNEL: &str = "C0E2E";

/// The people, as Slack and as the cluster know them.
const PAT: (&str, &str) = ("U0PAT", "pat@example.com");
const SAM: (&str, &str) = ("U0SAM", "sam@example.com");
const KIM: (&str, &str) = ("U0KIM", "kim@example.com");

/// The scripted Slack Kortex talks to.
pub struct Slack {
    api: ScriptedSlack,
}

impl Slack {
    pub async fn start() -> Self {
        Self {
            api: ScriptedSlack::start().await,
        }
    }

    /// Kortex's flags for it.
    pub fn args(&self) -> Vec<String> {
        vec!["--slack-api-url".to_owned(), self.api.api.clone()]
    }
}

/// POSTs `body` (of `content_type`) to Kortex's `path`, signed now with the app's secret.
async fn signed(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    content_type: &str,
    body: String,
) -> anyhow::Result<u16> {
    let at = jiff::Timestamp::now().as_second();
    let r = http
        .post(format!("{base}{path}"))
        .header("content-type", content_type)
        .header("x-slack-request-timestamp", at.to_string())
        .header(
            "x-slack-signature",
            kortex::slack::verify::sign(SIGNING.as_bytes(), at, body.as_bytes()),
        )
        .body(body)
        .send()
        .await?;
    Ok(r.status().as_u16())
}

/// `user` clicks Approve on the card `card_ts` of proposal `id`.
async fn approve(
    http: &reqwest::Client,
    base: &str,
    user: &str,
    id: &str,
    card_ts: &str,
) -> anyhow::Result<()> {
    let payload = json!({"type": "block_actions", "team": {"id": TEAM}, "user": {"id": user, "team_id": TEAM},
        "container": {"type": "message", "message_ts": card_ts, "channel_id": CHANNEL},
        "channel": {"id": CHANNEL}, "trigger_id": "1.2.3", "message": {"ts": card_ts},
        "actions": [{"action_id": "kortex_approve", "block_id": "kortex_decide", "value": id, "type": "button"}]});
    let body = format!(
        "payload={}",
        url::form_urlencoded::byte_serialize(payload.to_string().as_bytes()).collect::<String>()
    );
    let status = signed(
        http,
        base,
        "/slack/v1/interactions",
        "application/x-www-form-urlencoded",
        body,
    )
    .await?;
    anyhow::ensure!(status == 200, "the click was not acknowledged: {status}");
    Ok(())
}

/// The ephemeral message `user` got that contains `needle`, waiting for it.
async fn told(slack: &ScriptedSlack, user: &str, needle: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    let waited = wait_for(
        &format!("{user} to be told {needle:?}"),
        Duration::from_secs(60),
        async || {
            text = slack
                .calls("chat.postEphemeral")
                .into_iter()
                .filter(|c| c.body["user"] == user)
                .filter_map(|c| c.body["text"].as_str().map(str::to_owned))
                .find(|t| t.contains(needle))
                .unwrap_or_default();
            Ok(!text.is_empty())
        },
    )
    .await;
    if let Err(e) = waited {
        let seen: Vec<(String, Value)> = ["users.info", "chat.postEphemeral", "chat.postMessage"]
            .iter()
            .flat_map(|m| slack.calls(m))
            .map(|c| (c.method, c.body))
            .collect();
        anyhow::bail!("{e}; Slack saw: {seen:?}");
    }
    Ok(text)
}

/// The phase, with Kortex naming people `prefix` + their Slack e-mail (single sign-on's
/// `--oidc-username-prefix`).
pub async fn clicks_decide_as_the_person(
    scene: &Scene<'_>,
    slack: &Slack,
    prefix: &str,
) -> anyhow::Result<()> {
    let (admin, ns) = (scene.admin, scene.ns);
    let api = &slack.api;
    for (user, email) in [PAT, SAM, KIM] {
        api.person(user, email);
    }
    let [pat, sam, kim] = [PAT, SAM, KIM].map(|(_, email)| format!("{prefix}{email}"));
    // Who may do what: all three use the policy; pat and sam approve (patch
    // ActionProposals), sam restarts; kim has no patch on ActionProposals.
    let user =
        |u: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u});
    super::bind_roles(
        admin,
        ns,
        vec![
            (
                "slack-user",
                "kortex-user",
                json!([user(&pat), user(&sam), user(&kim)]),
            ),
            (
                "slack-approver",
                "kortex-approver",
                json!([user(&pat), user(&sam)]),
            ),
            ("slack-restart", "restart-deployments", json!([user(&sam)])),
        ],
    )
    .await?;
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "slack-app", "namespace": ns, "labels": {"kortex.dev/use": "true"}},
        "data": {"bot-token": kortex::redact::base64("xoxb-e2e"), "signing-secret": kortex::redact::base64(SIGNING)}}),
    )
    .await?;
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "slack", "namespace": ns},
        "spec": {"sessions": ["slack-*"], "provider": "local", "runToolsAsUser": false,
            "proposals": {"allowedActions": ["restart"], "allowedNamespaces": [ns], "execute": true,
                "requireDistinctApprover": true},
            "slack": {"teamId": TEAM, "channels": [CHANNEL],
                "botTokenSecretRef": {"name": "slack-app", "key": "bot-token"},
                "signingSecretRef": {"name": "slack-app", "key": "signing-secret"}}}}),
    )
    .await?;
    let policies: Api<kortex::crd::ChatPolicy> = Api::namespaced(admin.clone(), ns);
    wait_for(
        "the slack policy's app to listen",
        Duration::from_secs(60),
        async || {
            let p = policies.get("slack").await?;
            Ok(p.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Slack" && c.status == "True")
            }))
        },
    )
    .await?;
    // Without the impersonation grant nobody acts from Slack in the cluster: told why.
    let ask = json!({"type": "event_callback", "team_id": TEAM, "event_id": "Ev0E2E0",
        "event": {"type": "app_mention", "user": PAT.0, "text": "<@U0BOT> ticker is stuck",
            "ts": "1799999999.000100", "channel": CHANNEL}});
    wait_for(
        "the Slack door to take pat's first mention",
        Duration::from_secs(30),
        async || {
            let status = signed(
                scene.http,
                scene.base,
                "/slack/v1/events",
                "application/json",
                ask.to_string(),
            )
            .await?;
            Ok(status == 200)
        },
    )
    .await?;
    let why = told(api, PAT.0, "may not act as").await?;
    anyhow::ensure!(
        why.contains(&pat) && why.contains("slack_impersonate.yaml"),
        "{why}"
    );
    // The impersonation grant, as config/rbac/slack_impersonate.yaml ships it, scoped to
    // the three (no groups: the policy names no approver groups).
    let grant = format!("{ns}-slack-impersonate");
    super::grant_kortex(
        admin,
        "config/rbac/slack_impersonate.yaml",
        &grant,
        json!([{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"],
            "resourceNames": [pat, sam, kim]}]),
    )
    .await?;
    let outcome = decided_in_slack(scene, api, [&pat, &sam, &kim]).await;
    super::revoke_kortex(admin, &grant).await;
    outcome
}

async fn decided_in_slack(
    scene: &Scene<'_>,
    api: &ScriptedSlack,
    [_pat, sam, kim]: [&str; 3],
) -> anyhow::Result<()> {
    let (admin, ns, http, base) = (scene.admin, scene.ns, scene.http, scene.base);
    // pat asks in a thread; the model proposes restarting ticker; its card lands there.
    let thread = "1800000000.000100";
    let mention = json!({"type": "event_callback", "team_id": TEAM, "event_id": "Ev0E2E1",
        "event": {"type": "app_mention", "user": PAT.0, "text": "<@U0BOT> ticker is stuck",
            "ts": thread, "channel": CHANNEL}});
    let mut status = 0;
    // The leader loads the policy's Secrets; the door takes requests once they resolved.
    wait_for(
        "the Slack door to take pat's mention",
        Duration::from_secs(30),
        async || {
            status = signed(
                http,
                base,
                "/slack/v1/events",
                "application/json",
                mention.to_string(),
            )
            .await?;
            Ok(status == 200)
        },
    )
    .await?;
    let mut card = None;
    let waited = wait_for("the proposal's card", Duration::from_secs(90), async || {
        card = api
            .calls("chat.postMessage")
            .into_iter()
            .find(|c| c.body["blocks"].to_string().contains("kortex_approve"));
        Ok(card.is_some())
    })
    .await;
    if let Err(e) = waited {
        let seen: Vec<Value> = api
            .calls("chat.postMessage")
            .into_iter()
            .chain(api.calls("chat.update"))
            .chain(api.calls("chat.postEphemeral"))
            .map(|c| c.body)
            .collect();
        anyhow::bail!("{e}; Slack saw {seen:?}");
    }
    let card = card.unwrap_or_else(|| unreachable!());
    anyhow::ensure!(card.body["thread_ts"] == thread, "{:?}", card.body);
    let card_ts = card.ts.clone().unwrap_or_default();
    let id = card.body["blocks"]
        .as_array()
        .and_then(|b| b.last())
        .and_then(|a| a["elements"][0]["value"].as_str())
        .unwrap_or_default()
        .to_owned();
    let proposals: Api<ActionProposal> = Api::namespaced(admin.clone(), ns);
    // The card names the proposal as the cluster does.
    let blocks = card.body["blocks"].to_string();
    let name = proposals
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|n| blocks.contains(&format!("*{n}*")))
        .ok_or_else(|| anyhow::anyhow!("no ActionProposal is the card's: {blocks}"))?;
    wait_phase(&proposals, &name, ProposalPhase::Pending).await?;

    // kim may use the policy, not patch proposals: the API server refuses kim.
    approve(http, base, KIM.0, &id, &card_ts).await?;
    let why = told(api, KIM.0, "Nothing was decided").await?;
    anyhow::ensure!(
        why.contains(kim) && why.contains("forbidden"),
        "kim was not refused by the API server as kim: {why}"
    );
    // pat proposed it: the admission policy refuses (four-eyes).
    approve(http, base, PAT.0, &id, &card_ts).await?;
    let why = told(api, PAT.0, "Nothing was decided").await?;
    anyhow::ensure!(
        why.contains("ValidatingAdmissionPolicy")
            && why.contains("the policy requires someone other than the proposer to decide"),
        "pat was not refused by the admission policy: {why}"
    );
    anyhow::ensure!(
        proposals.get(&name).await?.spec.decision.is_none(),
        "a refused click decided something"
    );
    // sam approves: decided as sam, carried out, and the card says so.
    approve(http, base, SAM.0, &id, &card_ts).await?;
    wait_phase(&proposals, &name, ProposalPhase::Succeeded).await?;
    let decision = proposals
        .get(&name)
        .await?
        .spec
        .decision
        .ok_or_else(|| anyhow::anyhow!("no decision"))?;
    anyhow::ensure!(decision.by == sam, "{decision:?}");
    wait_for(
        "the card to say who approved, and that it was carried out",
        Duration::from_secs(60),
        async || {
            Ok(api.calls("chat.update").into_iter().any(|c| {
                c.body["ts"] == card_ts.as_str()
                    && c.body["text"].as_str().is_some_and(|t| {
                        t.contains(&format!("approved by {sam}")) && t.contains("carried out")
                    })
            }))
        },
    )
    .await?;
    eprintln!(
        "slack: kim refused by the API server, pat by the admission policy, sam approved and ticker restarted"
    );
    Ok(())
}
