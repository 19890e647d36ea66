//! Who a Slack user is to Kortex (`docs/slack.md`): the person the policy's
//! `spec.slack.users` maps them to, else the e-mail of their Slack profile (`users.info`,
//! which needs the `users:read.email` scope; Slack requires an e-mail to create a user),
//! with single sign-on's `--oidc-username-prefix` before it, as a sign-in names them.
//! Bots, app users and deactivated accounts are nobody. A Slack user Kortex cannot name
//! decides nothing and starts nothing; the reason says what to fix.

use super::api::{ApiError, Client};

/// The person `slack_user` is, by the app's table `users`, else by `client`'s `users.info`
/// (their e-mail, lowercased, after `prefix`).
pub async fn person(
    users: &[crate::crd::SlackUser],
    client: &Client,
    slack_user: &str,
    prefix: &str,
) -> Result<String, String> {
    if let Some(u) = users.iter().find(|u| u.slack_user == slack_user) {
        return Ok(u.user.clone());
    }
    let unknown = |why: String| {
        format!(
            "Kortex does not know who Slack user <@{slack_user}> is ({why}): ask your platform team to map {slack_user} in the ChatPolicy's spec.slack.users"
        )
    };
    match client.user(slack_user).await {
        Ok(p) if p.not_a_person => Err(unknown(
            "a bot, an app or a deactivated account acts for nobody".into(),
        )),
        Ok(p) => p
            .email
            .map(|e| format!("{prefix}{}", e.to_ascii_lowercase()))
            .ok_or_else(|| unknown("their Slack profile shows no e-mail to the app (it needs the users:read.email scope)".into())),
        Err(ApiError::Refused { error, .. }) => Err(unknown(format!("Slack's users.info said {error}"))),
        Err(e) => Err(format!("Slack could not be asked who <@{slack_user}> is: {e}; try again")),
    }
}
