//! Investigating in a Slack thread (`docs/slack.md`): a mention of the app starts a session
//! for the thread (or continues the thread's session); a later message in that thread
//! continues it. The person is who the Slack user is to Kortex (`slack::identity`); the
//! session is theirs, governed by the app's ChatPolicy (its name is made to match the
//! policy's `sessions`). The answer goes into the thread: a first reply that is updated as
//! the run streams (at most every [`UPDATE_EVERY`], Slack's `chat.update` limits), then
//! the whole answer with the tools used and a link to the session in the dashboard.

use super::AppState;
use crate::catalog::SlackResolved;
use crate::slack::api::Client;
use crate::slack::inbound::Message;
use crate::store::Access;
use std::time::Duration;

/// How often the thread's reply is updated while the answer streams.
pub const UPDATE_EVERY: Duration = Duration::from_secs(2);
/// Slack refuses a message's text longer than this (and truncates beyond 40 000).
const TEXT_MAX: usize = 3_900;

/// Where the Web API is, and the client calling it.
pub struct SlackDoor {
    /// The Web API base, `https://slack.com/api` (`--slack-api-url`).
    pub api: String,
    /// The HTTP client (Kortex's egress rules, Kortex itself refused).
    pub http: reqwest::Client,
    /// The dashboard's address (`--public-url`), for links to sessions.
    pub public_url: Option<String>,
    /// Put before a Slack profile's e-mail to name the person as single sign-on does
    /// (`--oidc-username-prefix`).
    pub user_prefix: String,
    /// The groups a person acting from Slack is impersonated with in a cluster, of those
    /// their latest sign-in had (`--slack-impersonate-groups`).
    pub impersonate_groups: Vec<String>,
}

/// `--slack-api-url`, `--slack-impersonate-groups`.
#[derive(clap::Args, Debug, Clone)]
pub struct SlackArgs {
    /// Slack's Web API base URL (a proxy's, or a test's).
    #[arg(long, env = "KORTEX_SLACK_API_URL", default_value = crate::slack::api::SLACK_API)]
    pub slack_api_url: String,
    /// Cluster mode: the groups (as single sign-on names them, with their prefix) a person
    /// acting from Slack is impersonated with, when their latest sign-in had them — the
    /// `resourceNames` of the impersonation grant (docs/slack.md#impersonation). Never a
    /// `system:` group. Empty: the user alone.
    #[arg(
        long,
        env = "KORTEX_SLACK_IMPERSONATE_GROUPS",
        value_delimiter = ',',
        num_args = 0..
    )]
    pub slack_impersonate_groups: Vec<String>,
}

impl SlackArgs {
    /// The door's Web API side.
    pub fn door(
        &self,
        egress: &std::sync::Arc<crate::egress::Egress>,
        public_url: Option<&str>,
        user_prefix: &str,
    ) -> Result<SlackDoor, String> {
        if let Some(g) = self
            .slack_impersonate_groups
            .iter()
            .find(|g| g.starts_with("system:"))
        {
            return Err(format!(
                "--slack-impersonate-groups names {g}: a system: group is the API server's own, never a person's"
            ));
        }
        let builder = reqwest::Client::builder()
            .user_agent(concat!("kortex/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30));
        Ok(SlackDoor {
            api: self.slack_api_url.clone(),
            http: egress.client(true, builder, true)?,
            public_url: public_url.map(str::to_owned),
            user_prefix: user_prefix.to_owned(),
            impersonate_groups: self
                .slack_impersonate_groups
                .iter()
                .filter(|g| !g.trim().is_empty())
                .cloned()
                .collect(),
        })
    }
}

/// The session a thread starts: named `slack-<thread>` within the policy's first glob.
fn session_name(app_policy: &crate::catalog::PolicyEntry, thread: &str) -> String {
    super::access::session_name_for(app_policy, &format!("slack-{}", thread.replace('.', "-")))
}

fn clip(s: &str) -> String {
    crate::slack::blocks::clip(s, TEXT_MAX)
}

/// Who `person` is when they act from Slack: the groups of their latest single sign-on
/// (none without one). In a cluster, the impersonation of exactly them with those of their
/// groups the door may impersonate, and the groups as the API server then sees them (it
/// adds `system:authenticated`): decisions written as them must list every group the
/// admission policy sees, and asking proves the grant works. The error says what to fix.
pub async fn caller_of(
    state: &AppState,
    door: &SlackDoor,
    person: &str,
) -> Result<super::auth::Caller, String> {
    if person.starts_with("system:") {
        return Err(format!(
            "{person} names a user of the Kubernetes API server itself, whom nobody acts as from Slack: map the Slack user to a person in spec.slack.users"
        ));
    }
    let mut groups = state.store.groups_of(person).await.unwrap_or_default();
    let mut kube = None;
    if let Some(cluster) = &state.cluster_auth {
        groups.retain(|g| !g.starts_with("system:") && door.impersonate_groups.contains(g));
        let who = crate::operator::auth::KubeCredential::Impersonate {
            user: person.to_owned(),
            groups,
        };
        let seen = cluster.who_is(&who).await.map_err(|e| {
            format!(
                "Kortex may not act as {person} in the cluster ({e}): your platform team grants its ServiceAccount the impersonation of the people who act from Slack (config/rbac/slack_impersonate.yaml, the chart's slack.impersonation; docs/slack.md#impersonation)"
            )
        })?;
        groups = seen.groups;
        kube = Some(who);
    }
    Ok(super::auth::Caller {
        user: person.to_owned(),
        groups,
        kube,
        subject: None,
    })
}

/// Answers `m` in its thread (spawned once its event was taken). `mention`: the app was
/// mentioned (only a mention starts a session).
// Long because a conversation's steps in order (who, which session, may they, the run,
// its answer into the thread), each refusal said to the person in Slack.
pub async fn converse(
    state: AppState,
    door: std::sync::Arc<SlackDoor>,
    policy: crate::catalog::ObjectKey,
    app: SlackResolved,
    team_id: String,
    m: Message,
    mention: bool,
) {
    let client = Client::new(door.http.clone(), &door.api, app.bot_token.clone());
    let thread = m.thread().to_owned();
    let store = &state.store;
    let existing = match store.slack_thread(&team_id, &m.channel, &thread).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the Slack thread's session");
            return;
        }
    };
    if existing.is_none() && !mention {
        return;
    }
    let Some(slack_user) = m.user.clone() else {
        return;
    };
    let say_to = |text: String| {
        let client = client.clone();
        let channel = m.channel.clone();
        let user = slack_user.clone();
        let thread = thread.clone();
        async move {
            if let Err(e) = client
                .post_ephemeral(&channel, &user, Some(&thread), &text)
                .await
            {
                tracing::info!(error = %e, "cannot tell a Slack user why nothing happened");
            }
        }
    };
    let person = match crate::slack::identity::person(
        &app.spec.users,
        &client,
        &slack_user,
        &door.user_prefix,
    )
    .await
    {
        Ok(p) => p,
        Err(why) => return say_to(why).await,
    };
    let caller = match caller_of(&state, &door, &person).await {
        Ok(c) => c,
        Err(why) => return say_to(why).await,
    };
    let config = state.config.borrow().clone();
    let Some(entry) = config.catalog.policies.get(&policy) else {
        return;
    };
    let question = m.question();
    // The thread's session (theirs, shared or handed over to them, or an investigation of
    // the policy's alerts), or a new one of the person's.
    let session = match existing {
        Some(id) => match super::access::reachable(&state, &caller, &id, Access::Continue).await {
            Ok(s) => s,
            Err(e) => {
                let owner = store
                    .session_by_id(&id)
                    .await
                    .ok()
                    .flatten()
                    .map(|s| s.user)
                    .unwrap_or_default();
                tracing::info!(session = %id, user = %person, reason = %e.message, "a Slack user may not continue a thread's session");
                return say_to(format!(
                    "You ({person}) may not continue this thread's investigation: it is {owner}'s. They can hand it over to you with `@Kortex handover @you` in this thread (or `/kortex handover`, or in the dashboard)."
                ))
                .await;
            }
        },
        None => {
            let name = session_name(entry, &thread);
            let governs = config
                .catalog
                .match_policy(&policy.namespace, &name)
                .is_some_and(|p| p.object.metadata.name.as_deref() == Some(policy.name.as_str()));
            if !governs {
                return say_to(format!(
                    "ChatPolicy {policy} does not govern the session {name} its Slack app would start (a more specific policy does): ask your platform team to give Slack sessions their own sessions glob."
                ))
                .await;
            }
            let new = crate::store::NewSession {
                name,
                namespace: policy.namespace.clone(),
                user: person.clone(),
                policy: Some(policy.name.clone()),
                dynamic_tools: serde_json::Value::Array(Vec::new()),
            };
            let created = match store.create_session(&new).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a Slack thread's session");
                    return;
                }
            };
            match store
                .bind_slack_thread(&team_id, &m.channel, &thread, &created.id)
                .await
            {
                Ok(true) => created,
                // Another replica bound the thread first: its session.
                Ok(false) => match store.slack_thread(&team_id, &m.channel, &thread).await {
                    Ok(Some(id)) => match store.session_by_id(&id).await {
                        Ok(Some(s)) => s,
                        _ => return,
                    },
                    _ => return,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot bind a Slack thread to its session");
                    return;
                }
            }
        }
    };
    // The person must be allowed to use the policy, as in the dashboard (checked again on
    // each run).
    if let Err(e) = super::access::may_use(&state, &caller, entry).await {
        return say_to(e.message).await;
    }
    if let Some(rest) = handover_request(&question) {
        let to = Thread {
            channel: &m.channel,
            ts: &thread,
        };
        if let Err(why) =
            hand_over(&state, &door, &client, &app, &caller, &session.id, to, rest).await
        {
            tracing::info!(user = %person, reason = %why, "a hand-over from Slack was refused");
            say_to(why).await;
        }
        return;
    }
    // The Kubernetes tools read as the person (a policy's `runToolsAsUser`).
    if let Some(kube) = &caller.kube {
        state
            .engine
            .remember_token(&session.id, &person, kube.clone());
    }
    let reply = match client
        .post_message(&m.channel, Some(&thread), "_Looking into it…_", None)
        .await
    {
        Ok(ts) => ts,
        Err(e) => {
            tracing::warn!(error = %e, "cannot answer in a Slack thread");
            return;
        }
    };
    let started_ms = crate::store::now_ms();
    let mut live = state.engine.subscribe(&session.id);
    let run = match state.engine.start_run(&session, &person, &question).await {
        Ok(run) => run,
        Err(e) => {
            let _ = client
                .update(
                    &m.channel,
                    &reply,
                    &clip(&format!("Kortex could not start: {e}")),
                    None,
                )
                .await;
            return;
        }
    };
    let mut text = String::new();
    let mut tools: Vec<String> = Vec::new();
    let mut failure = None;
    let mut shown = String::new();
    let mut last_update = tokio::time::Instant::now();
    loop {
        let event = match tokio::time::timeout(UPDATE_EVERY, live.recv()).await {
            Ok(Ok(e)) => Some(e),
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => None,
            Ok(Err(_)) => break,
            Err(_) => None,
        };
        if let Some(e) = event.filter(|e| e.run_id.as_deref() == Some(run.as_str())) {
            use crate::chat::event;
            match e.event_type.as_str() {
                event::TEXT_DELTA => text.push_str(e.data["text"].as_str().unwrap_or_default()),
                event::TOOL_START => {
                    let name = e.data["name"].as_str().unwrap_or_default().to_owned();
                    if !tools.contains(&name) {
                        tools.push(name);
                    }
                }
                event::ERROR => {
                    failure = e.data["message"].as_str().map(str::to_owned);
                }
                event::RUN_LIFECYCLE => {
                    let s = e.data["state"].as_str().unwrap_or_default();
                    if matches!(s, "completed" | "failed" | "cancelled") {
                        if s != "completed" && failure.is_none() {
                            failure = Some(format!("the run ended {s}"));
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        if last_update.elapsed() >= UPDATE_EVERY && text != shown && !text.is_empty() {
            if client
                .update(&m.channel, &reply, &clip(&text), None)
                .await
                .is_ok()
            {
                shown = text.clone();
            }
            last_update = tokio::time::Instant::now();
        }
    }
    let mut answer = if text.trim().is_empty() {
        failure.clone().unwrap_or_else(|| "(no answer)".into())
    } else {
        text
    };
    if let Some(f) = failure.filter(|_| !answer.contains("could not")) {
        answer = format!("{answer}\n\n:x: {f}");
    }
    let mut context = String::new();
    if !tools.is_empty() {
        context.push_str(&format!("Tools: {}", tools.join(", ")));
    }
    if let Some(base) = &door.public_url {
        let link = format!("{}/#/chat/{}", base.trim_end_matches('/'), session.id);
        context.push_str(&format!(" · <{link}|Open the session in Kortex>"));
    }
    let mut blocks = vec![
        serde_json::json!({"type": "section", "text": {"type": "mrkdwn",
        "text": crate::slack::blocks::clip(&crate::slack::blocks::escape(&answer), crate::slack::blocks::SECTION_MAX)}}),
    ];
    if !context.is_empty() {
        blocks.push(serde_json::json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]}));
    }
    if let Err(e) = client
        .update(
            &m.channel,
            &reply,
            &clip(&answer),
            Some(&serde_json::Value::Array(blocks)),
        )
        .await
    {
        tracing::warn!(error = %e, "cannot put the answer in a Slack thread");
    }
    post_cards(
        &state,
        &client,
        &session.id,
        started_ms,
        &m.channel,
        &thread,
    )
    .await;
}

/// `handover <@U…> [note]` (the word in any case): what follows the word.
pub fn handover_request(question: &str) -> Option<&str> {
    let q = question.trim_start();
    let word = q.get(..8)?;
    let rest = &q[8..];
    (word.eq_ignore_ascii_case("handover")
        && (rest.is_empty() || rest.starts_with(char::is_whitespace)))
    .then(|| rest.trim())
}

/// The Slack user first mentioned in `text` (`<@U…>`, or `<@U…|name>` as an escaping slash
/// command sends it), and the text after the mention.
fn mentioned(text: &str) -> Option<(&str, &str)> {
    let start = text.find("<@")?;
    let end = start + text[start..].find('>')?;
    let id = text[start + 2..end].split('|').next()?;
    let valid = id.len() >= 2
        && (id.starts_with('U') || id.starts_with('W'))
        && id
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    valid.then(|| (id, text[end + 1..].trim()))
}

/// A Slack thread.
#[derive(Clone, Copy)]
pub struct Thread<'a> {
    /// Its channel.
    pub channel: &'a str,
    /// Its first message's `ts`.
    pub ts: &'a str,
}

/// Hands `session` over from `caller` to the Slack user `rest` mentions, with the rest of
/// `rest` as the note, as the dashboard's hand-over does (`docs/chat.md#hand-over`): they
/// may continue it from then on, here in its thread too. Tells them in the thread; the
/// error is what to tell the person who asked.
// Eight: the door, its client and app, who asks, and which session in which thread.
#[allow(clippy::too_many_arguments)]
pub async fn hand_over(
    state: &AppState,
    door: &SlackDoor,
    client: &Client,
    app: &SlackResolved,
    caller: &super::auth::Caller,
    session: &str,
    thread: Thread<'_>,
    rest: &str,
) -> Result<(), String> {
    let Some((to_user, note)) = mentioned(rest) else {
        return Err(
            "Say whom to hand the investigation over to: `handover @person what they should know`."
                .into(),
        );
    };
    let to = crate::slack::identity::person(&app.spec.users, client, to_user, &door.user_prefix)
        .await
        .map_err(|why| format!("Nothing was handed over. {why}"))?;
    let note = if note.is_empty() {
        format!("Handed over in Slack by {}.", caller.user)
    } else {
        note.to_owned()
    };
    let (handover, _) = super::share_api::hand_over(state, caller, session, &to, &note)
        .await
        .map_err(|e| format!("Nothing was handed over: {}", e.message))?;
    let mut told = format!(
        ":handshake: <@{to_user}>, {} handed this investigation over to you: {}",
        crate::slack::blocks::escape(&caller.user),
        crate::slack::blocks::escape(handover["note"].as_str().unwrap_or_default()),
    );
    if let Some(summary) = handover["summary"].as_str() {
        told.push_str(&format!(
            "\n*Summary*\n{}",
            crate::slack::blocks::escape(summary)
        ));
    }
    told.push_str("\nReply in this thread (mention the app) to continue it.");
    client
        .post_message(thread.channel, Some(thread.ts), &clip(&told), None)
        .await
        .map(drop)
        .map_err(|e| {
            format!(
                "The session was handed over to {to}, but Slack refused the message saying so: {e}"
            )
        })
}

/// Where a click on a proposal card came from.
pub struct Click {
    /// Who clicked.
    pub slack_user: String,
    /// The card (none of it for a dialog opened before cards were remembered).
    pub card: crate::slack::blocks::CardAt,
}

/// A decision clicked in Slack.
pub struct Decision {
    /// The app the click came through.
    pub app: SlackResolved,
    /// Its policy.
    pub policy: crate::catalog::ObjectKey,
    /// Where, and who.
    pub click: Click,
    /// The proposal.
    pub id: String,
    /// `Approve` or `Reject`.
    pub verdict: &'static str,
    /// Reject's reason.
    pub reason: Option<String>,
}

/// Decides proposal `id` (`Approve` or `Reject`) as the person who clicked: who the Slack
/// user is to Kortex, with the groups of their latest sign-in; in a cluster the decision is
/// written by impersonating exactly them, so RBAC and the admission policy judge them as
/// with kubectl. The card then says who decided and how it went; a refusal is told to the
/// person alone, and nothing is decided.
pub async fn decide(state: AppState, door: std::sync::Arc<SlackDoor>, client: Client, d: Decision) {
    let Decision {
        app,
        policy,
        click,
        id,
        verdict,
        reason,
    } = d;
    let tell = |text: String| {
        let client = client.clone();
        let user = click.slack_user.clone();
        let channel = click.card.channel.clone();
        let thread = click.card.thread.clone();
        async move {
            let sent = match &channel {
                Some(c) => {
                    client
                        .post_ephemeral(c, &user, thread.as_deref(), &text)
                        .await
                }
                // A dialog's submission has no channel: the app's direct message.
                None => client
                    .post_message(&user, None, &text, None)
                    .await
                    .map(drop),
            };
            if let Err(e) = sent {
                tracing::info!(error = %e, "cannot tell a Slack user how their click went");
            }
        }
    };
    let person = match crate::slack::identity::person(
        &app.spec.users,
        &client,
        &click.slack_user,
        &door.user_prefix,
    )
    .await
    {
        Ok(p) => p,
        Err(why) => return tell(format!("Nothing was decided. {why}")).await,
    };
    let caller = match caller_of(&state, &door, &person).await {
        Ok(c) => c,
        Err(why) => return tell(format!("Nothing was decided. {why}")).await,
    };
    let body = serde_json::json!({ "reason": reason }).to_string();
    let decided = super::proposals_api::decide(
        axum::extract::State(state.clone()),
        axum::Extension(caller),
        axum::extract::Path(id.clone()),
        axum::body::Bytes::from(body),
        verdict,
    )
    .await;
    let view = match decided {
        Ok(axum::Json(view)) => view,
        Err(e) => {
            tracing::info!(policy = %policy, proposal = %id, user = %person, reason = %e.message, "a decision from Slack was refused");
            return tell(format!("Nothing was decided: {}", e.message)).await;
        }
    };
    let name = view["name"].as_str().unwrap_or_default();
    let phase = view["status"]["phase"].as_str().unwrap_or_default();
    let message = view["status"]["message"].as_str().unwrap_or_default();
    let head = format!(
        "Proposal *{}* {} by {}",
        crate::slack::blocks::escape(name),
        if verdict == "Approve" {
            "approved"
        } else {
            "rejected"
        },
        crate::slack::blocks::escape(&person),
    );
    let done = format!(
        "{head}: {}",
        crate::slack::blocks::escape(if message.is_empty() { phase } else { message })
    );
    let blocks =
        serde_json::json!([{"type": "section", "text": {"type": "mrkdwn", "text": clip(&done)}}]);
    let shown = match (&click.card.channel, &click.card.ts) {
        (Some(c), Some(ts)) => {
            client
                .update(c, ts, &clip(&done.replace('*', "")), Some(&blocks))
                .await
        }
        _ => client
            .post_message(&click.slack_user, None, &done, None)
            .await
            .map(drop),
    };
    if let Err(e) = shown {
        tracing::info!(error = %e, "cannot show a decision in Slack");
    }
    // Carried out behind the decision (in a cluster, by the leader once it sees it): the
    // card then says how it ended.
    if let (Some(channel), Some(ts)) = (&click.card.channel, &click.card.ts)
        && !is_final(phase)
    {
        follow_outcome(&state, &client, &id, channel, ts, &head).await;
    }
}

/// How long a card waits to show how an approved proposal ended.
const OUTCOME_WAIT: Duration = Duration::from_secs(300);

fn is_final(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed" | "Rejected" | "Expired")
}

/// Updates the card `ts` in `channel` with how proposal `id` ended, once it has (at most
/// [`OUTCOME_WAIT`]).
async fn follow_outcome(
    state: &AppState,
    client: &Client,
    id: &str,
    channel: &str,
    ts: &str,
    head: &str,
) {
    let deadline = tokio::time::Instant::now() + OUTCOME_WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Ok(Some(p)) = state.store.get_proposal(id).await else {
            continue;
        };
        let outcome = match p.phase {
            crate::crd::ProposalPhase::Succeeded => ":white_check_mark: carried out".to_owned(),
            crate::crd::ProposalPhase::Failed => format!(
                ":x: failed: {}",
                crate::slack::blocks::escape(p.message.as_deref().unwrap_or("see the proposal"))
            ),
            crate::crd::ProposalPhase::Rejected => "rejected".to_owned(),
            crate::crd::ProposalPhase::Expired => "expired undecided".to_owned(),
            _ => continue,
        };
        let text = format!("{head}: {outcome}");
        let blocks = serde_json::json!([{"type": "section", "text": {"type": "mrkdwn", "text": clip(&text)}}]);
        if let Err(e) = client
            .update(channel, ts, &clip(&text.replace('*', "")), Some(&blocks))
            .await
        {
            tracing::info!(error = %e, "cannot show how a proposal ended in Slack");
        }
        return;
    }
}

/// Posts each proposal the run `run` of `session` made, pending, as a card in the thread.
pub async fn post_cards(
    state: &AppState,
    client: &Client,
    session: &str,
    since_ms: i64,
    channel: &str,
    thread: &str,
) {
    let Ok(rows) = state.store.list_proposals(Some("Pending"), 200).await else {
        return;
    };
    for p in rows
        .iter()
        .filter(|p| p.session_id.as_deref() == Some(session) && p.created_at >= since_ms)
    {
        let view = crate::proposals::view(p);
        let blocks = serde_json::Value::Array(crate::slack::blocks::proposal_card(&view));
        let text = format!("Proposal {} waits for a decision", p.name);
        if let Err(e) = client
            .post_message(channel, Some(thread), &text, Some(&blocks))
            .await
        {
            tracing::warn!(error = %e, "cannot post a proposal card in Slack");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hand_over_names_its_person_by_mention() {
        use super::{handover_request, mentioned};
        assert_eq!(handover_request("handover <@U1> note"), Some("<@U1> note"));
        assert_eq!(handover_request("  HandOver"), Some(""));
        assert_eq!(handover_request("handovers please"), None);
        assert_eq!(handover_request("why handover?"), None);
        assert_eq!(
            mentioned("<@U0BOB> the DB lags"),
            Some(("U0BOB", "the DB lags"))
        );
        // An escaping slash command sends the name along.
        assert_eq!(mentioned("<@W0CAROL|carol>"), Some(("W0CAROL", "")));
        // Not a user: a channel, a user group, a broken mention.
        assert_eq!(mentioned("<#C0INCIDENT> x"), None);
        assert_eq!(mentioned("<!subteam^S01> x"), None);
        assert_eq!(mentioned("<@u0lower> x"), None);
        assert_eq!(mentioned("@bob x"), None);
    }

    #[test]
    fn a_slack_session_is_named_to_match_the_policys_first_glob() {
        let policy = |globs: serde_json::Value| {
            crate::catalog::PolicyEntry::as_is(
                serde_json::from_value(
                    serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"sessions": globs, "provider": "x"}}),
                )
                .unwrap_or_else(|e| panic!("{e}")),
            )
        };
        assert_eq!(
            super::session_name(&policy(serde_json::json!(["*"])), "1700.0001"),
            "slack-1700-0001"
        );
        assert_eq!(
            super::session_name(&policy(serde_json::json!(["incident-*"])), "1.2"),
            "incident-slack-1-2"
        );
        assert_eq!(
            super::session_name(&policy(serde_json::json!(["team-??-*-*"])), "9.9"),
            "team-xx-slack-9-9-"
        );
        assert!(crate::glob::matches("team-??-*-*", "team-xx-slack-9-9-"));
    }
}
