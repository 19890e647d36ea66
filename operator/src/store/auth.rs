//! Who may come in: sign-ins with the OpenID provider (docs/sso.md) — the ones under way
//! (taken once) and the sessions of signed-in browsers and CLIs, shared by every replica;
//! nothing here is a usable secret (rows are found by digests, tokens are sealed by
//! `oidc::seal`) — and the Slack deliveries already taken (a retried one runs once).

use super::{Store, StoreError, now_ms};
use sqlx::Row;

/// A signed-in browser's or CLI's session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSession {
    /// SHA-256 (hex) of the session id.
    pub id_hash: String,
    /// The provider's `sub`.
    pub subject: String,
    /// The user name.
    pub user_name: String,
    /// The groups.
    pub groups: Vec<String>,
    /// The provider's tokens, sealed.
    pub sealed: String,
    /// Which session key sealed them.
    pub key_id: String,
    /// When the ID token (or, without one, the access token) expires, Unix ms.
    pub token_expires: i64,
    /// When the session ends whatever happens, Unix ms.
    pub expires_at: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Bumped by every refresh.
    pub version: i64,
}

fn read(r: &sqlx::any::AnyRow) -> Result<AuthSession, StoreError> {
    let groups: String = r.try_get("groups")?;
    Ok(from_row!(r => AuthSession {
        id_hash, subject, user_name,
        groups = serde_json::from_str(&groups).map_err(|source| StoreError::Json { column: "groups", source })?,
        sealed, key_id, token_expires, expires_at, created_at, version,
    }))
}

impl Store {
    /// Records a sign-in under way (or a CLI's one-time code), and forgets expired ones.
    pub async fn put_sign_in(
        &self,
        state_hash: &str,
        sealed: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sign_ins WHERE expires_at < $1")
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        sqlx::query("INSERT INTO sign_ins (state_hash, sealed, expires_at) VALUES ($1, $2, $3)")
            .bind(state_hash)
            .bind(sealed)
            .bind(expires_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Takes a sign-in under way: what it sealed, once. `None` when it was taken already
    /// (a replayed `state`), never existed, or expired.
    pub async fn take_sign_in(&self, state_hash: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .first(
                sqlx::query("SELECT sealed, expires_at FROM sign_ins WHERE state_hash = $1")
                    .bind(state_hash),
                |r| {
                    Ok((
                        r.try_get::<String, _>("sealed")?,
                        r.try_get::<i64, _>("expires_at")?,
                    ))
                },
            )
            .await?;
        let Some((sealed, expires_at)) = row else {
            return Ok(None);
        };
        // Two requests with the same state: only the one whose delete removed the row wins.
        let taken = self
            .changed(sqlx::query("DELETE FROM sign_ins WHERE state_hash = $1").bind(state_hash))
            .await?;
        Ok((taken && expires_at >= now_ms()).then_some(sealed))
    }

    /// Stores a new session.
    pub async fn put_auth_session(&self, s: &AuthSession) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM auth_sessions WHERE expires_at < $1")
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO auth_sessions (id_hash, subject, user_name, groups, sealed, key_id, \
             token_expires, expires_at, created_at, version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&s.id_hash)
        .bind(&s.subject)
        .bind(&s.user_name)
        .bind(serde_json::json!(s.groups).to_string())
        .bind(&s.sealed)
        .bind(&s.key_id)
        .bind(s.token_expires)
        .bind(s.expires_at)
        .bind(s.created_at)
        .bind(s.version)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The session whose id hashes to `id_hash`, unless it ended.
    pub async fn auth_session(&self, id_hash: &str) -> Result<Option<AuthSession>, StoreError> {
        self.first(
            sqlx::query(
                "SELECT id_hash, subject, user_name, groups, sealed, key_id, token_expires, \
                 expires_at, created_at, version FROM auth_sessions \
                 WHERE id_hash = $1 AND expires_at >= $2",
            )
            .bind(id_hash)
            .bind(now_ms()),
            read,
        )
        .await
    }

    /// Writes a refresh's outcome, unless another replica refreshed first (`false`: read
    /// the session again).
    pub async fn refresh_auth_session(&self, s: &AuthSession) -> Result<bool, StoreError> {
        self.changed(
            sqlx::query(
                "UPDATE auth_sessions SET sealed = $1, key_id = $2, token_expires = $3, \
                 expires_at = $4, groups = $5, version = version + 1 \
                 WHERE id_hash = $6 AND version = $7",
            )
            .bind(&s.sealed)
            .bind(&s.key_id)
            .bind(s.token_expires)
            .bind(s.expires_at)
            .bind(serde_json::json!(s.groups).to_string())
            .bind(&s.id_hash)
            .bind(s.version),
        )
        .await
    }

    /// Ends a session (sign-out, or a refresh the provider refused).
    pub async fn delete_auth_session(&self, id_hash: &str) -> Result<bool, StoreError> {
        self.changed(sqlx::query("DELETE FROM auth_sessions WHERE id_hash = $1").bind(id_hash))
            .await
    }

    /// Ends every session of `user` (erasure); how many.
    pub async fn delete_auth_sessions_of(&self, user: &str) -> Result<u64, StoreError> {
        Ok(
            sqlx::query("DELETE FROM auth_sessions WHERE user_name = $1")
                .bind(user)
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }

    /// Takes Slack's event `event_id` for this replica: `true` the first time any replica
    /// asks, `false` for a retried delivery already taken. Forgets ids older than a day.
    pub async fn claim_slack_event(&self, event_id: &str) -> Result<bool, StoreError> {
        let now = now_ms();
        sqlx::query("DELETE FROM slack_events WHERE received_at < $1")
            .bind(now - 24 * 3600 * 1000)
            .execute(&self.pool)
            .await?;
        self.changed(
            sqlx::query(
                "INSERT INTO slack_events (event_id, received_at) VALUES ($1, $2) \
                 ON CONFLICT (event_id) DO NOTHING",
            )
            .bind(event_id)
            .bind(now),
        )
        .await
    }

    /// The session Slack thread `thread_ts` of `channel` investigates in, if any.
    pub async fn slack_thread(
        &self,
        team_id: &str,
        channel: &str,
        thread_ts: &str,
    ) -> Result<Option<String>, StoreError> {
        self.first(
            sqlx::query(
                "SELECT session_id FROM slack_threads WHERE team_id = $1 AND channel = $2 AND thread_ts = $3",
            )
            .bind(team_id)
            .bind(channel)
            .bind(thread_ts),
            |r| Ok(r.try_get::<String, _>("session_id")?),
        )
        .await
    }

    /// Binds a thread to `session_id`, unless it is bound already (`false`: read it).
    pub async fn bind_slack_thread(
        &self,
        team_id: &str,
        channel: &str,
        thread_ts: &str,
        session_id: &str,
    ) -> Result<bool, StoreError> {
        self.changed(
            sqlx::query(
                "INSERT INTO slack_threads (team_id, channel, thread_ts, session_id, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id, channel, thread_ts) DO NOTHING",
            )
            .bind(team_id)
            .bind(channel)
            .bind(thread_ts)
            .bind(session_id)
            .bind(now_ms()),
        )
        .await
    }

    /// The Slack thread (`channel`, `thread_ts`) of `session_id` in workspace `team_id`, if
    /// it has one (the first bound, should several threads continue it).
    pub async fn slack_thread_of(
        &self,
        team_id: &str,
        session_id: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        self.first(
            sqlx::query(
                "SELECT channel, thread_ts FROM slack_threads WHERE team_id = $1 AND session_id = $2 \
                 ORDER BY created_at LIMIT 1",
            )
            .bind(team_id)
            .bind(session_id),
            |r| {
                Ok((
                    r.try_get::<String, _>("channel")?,
                    r.try_get::<String, _>("thread_ts")?,
                ))
            },
        )
        .await
    }

    /// The sessions of `channel`'s Slack threads, newest thread first (at most `limit`).
    pub async fn slack_threads_in(
        &self,
        team_id: &str,
        channel: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT thread_ts, session_id FROM slack_threads WHERE team_id = $1 AND channel = $2 \
             ORDER BY created_at DESC LIMIT $3",
        )
        .bind(team_id)
        .bind(channel)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>("thread_ts")?,
                    r.try_get::<String, _>("session_id")?,
                ))
            })
            .collect()
    }

    /// The groups of `user`'s latest sign-in that has not ended (empty without one): who they
    /// are when they act from elsewhere (Slack) as the person single sign-on knows.
    pub async fn groups_of(&self, user: &str) -> Result<Vec<String>, StoreError> {
        let row = self
            .first(
                sqlx::query(
                    "SELECT groups FROM auth_sessions WHERE user_name = $1 AND expires_at >= $2 \
                     ORDER BY created_at DESC LIMIT 1",
                )
                .bind(user)
                .bind(now_ms()),
                |r| Ok(r.try_get::<String, _>("groups")?),
            )
            .await?;
        Ok(row
            .and_then(|g| serde_json::from_str(&g).ok())
            .unwrap_or_default())
    }
}
