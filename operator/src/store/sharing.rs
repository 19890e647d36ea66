//! Sessions shared with other users and groups (`docs/chat.md#sharing`): to `read` (follow
//! the session, its messages, events and export) or to `continue` (also post messages,
//! answer dynamic tool calls, steer and cancel its runs). The owner alone shares, revokes
//! and deletes.

use super::{SessionRecord, Store, StoreError, now_ms};
use serde::{Deserialize, Serialize};
use sqlx::Row;

/// What a share allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Read the session as it goes.
    Read,
    /// Take part: post messages, answer tool calls, steer runs.
    Continue,
}

impl Access {
    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Continue => "continue",
        }
    }

    fn parse(s: &str) -> Self {
        if s == "continue" {
            Self::Continue
        } else {
            Self::Read
        }
    }
}

/// One share of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// `user` or `group`.
    pub kind: String,
    /// The user or group name.
    pub principal: String,
    /// What it allows.
    pub access: Access,
    /// Who shared it.
    pub created_by: String,
    /// When (Unix ms).
    pub created_at: i64,
}

/// `(kind, principal)` pairs of `users` and `groups`.
fn principals<'a>(users: &'a [String], groups: &'a [String]) -> Vec<(&'static str, &'a str)> {
    users
        .iter()
        .map(|u| ("user", u.as_str()))
        .chain(groups.iter().map(|g| ("group", g.as_str())))
        .collect()
}

impl Store {
    /// Shares session `id` with `users` and `groups` (`access` replaces what they had);
    /// every share of the session after it.
    pub async fn share_session(
        &self,
        id: &str,
        users: &[String],
        groups: &[String],
        access: Access,
        by: &str,
    ) -> Result<Vec<Share>, StoreError> {
        let mut tx = self.begin().await?;
        for (kind, principal) in principals(users, groups) {
            sqlx::query(
                "INSERT INTO session_shares (session_id, kind, principal, access, created_by, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session_id, kind, principal) DO UPDATE SET \
                 access = excluded.access, created_by = excluded.created_by, created_at = excluded.created_at",
            )
            .bind(id)
            .bind(kind)
            .bind(principal)
            .bind(access.as_str())
            .bind(by)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.shares(id).await
    }

    /// Revokes the shares of `users` and `groups` (both empty: every share); how many.
    pub async fn unshare_session(
        &self,
        id: &str,
        users: &[String],
        groups: &[String],
    ) -> Result<u64, StoreError> {
        if users.is_empty() && groups.is_empty() {
            let done = sqlx::query("DELETE FROM session_shares WHERE session_id = $1")
                .bind(id)
                .execute(&self.pool)
                .await?;
            return Ok(done.rows_affected());
        }
        let mut n = 0;
        for (kind, principal) in principals(users, groups) {
            n += sqlx::query(
                "DELETE FROM session_shares WHERE session_id = $1 AND kind = $2 AND principal = $3",
            )
            .bind(id)
            .bind(kind)
            .bind(principal)
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        Ok(n)
    }

    /// Every share of session `id`.
    pub async fn shares(&self, id: &str) -> Result<Vec<Share>, StoreError> {
        let rows = sqlx::query(
            "SELECT kind, principal, access, created_by, created_at FROM session_shares \
             WHERE session_id = $1 ORDER BY kind DESC, principal",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Share {
                    kind: r.try_get("kind")?,
                    principal: r.try_get("principal")?,
                    access: Access::parse(&r.try_get::<String, _>("access")?),
                    created_by: r.try_get("created_by")?,
                    created_at: r.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// The sessions shared with `user` (directly or through one of `groups`), with the
    /// most each share allows; most recently updated first.
    pub async fn sessions_shared_with(
        &self,
        user: &str,
        groups: &[String],
    ) -> Result<Vec<(SessionRecord, Access)>, StoreError> {
        let mut best: std::collections::BTreeMap<String, Access> = Default::default();
        for (kind, principal) in
            std::iter::once(("user", user)).chain(groups.iter().map(|g| ("group", g.as_str())))
        {
            let rows = sqlx::query(
                "SELECT session_id, access FROM session_shares WHERE kind = $1 AND principal = $2",
            )
            .bind(kind)
            .bind(principal)
            .fetch_all(&self.pool)
            .await?;
            for r in rows {
                let access = Access::parse(&r.try_get::<String, _>("access")?);
                let id: String = r.try_get("session_id")?;
                let slot = best.entry(id).or_insert(access);
                *slot = (*slot).max(access);
            }
        }
        let mut out = Vec::with_capacity(best.len());
        for (id, access) in best {
            if let Some(s) = self.session_by_id(&id).await?
                && s.user != user
            {
                out.push((s, access));
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.0.updated_at));
        Ok(out)
    }

    /// What `user` (with `groups`) may do in session `id` of someone else: `None` when it
    /// is not shared with them (or does not exist).
    pub async fn shared_access(
        &self,
        id: &str,
        user: &str,
        groups: &[String],
    ) -> Result<Option<(SessionRecord, Access)>, StoreError> {
        let mut best: Option<Access> = None;
        for (kind, principal) in
            std::iter::once(("user", user)).chain(groups.iter().map(|g| ("group", g.as_str())))
        {
            let row = sqlx::query(
                "SELECT access FROM session_shares WHERE session_id = $1 AND kind = $2 AND principal = $3",
            )
            .bind(id)
            .bind(kind)
            .bind(principal)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(r) = row {
                let access = Access::parse(&r.try_get::<String, _>("access")?);
                best = Some(best.map_or(access, |b| b.max(access)));
            }
        }
        let Some(access) = best else {
            return Ok(None);
        };
        Ok(self
            .session_by_id(id)
            .await?
            .filter(|s| s.user != user)
            .map(|s| (s, access)))
    }
}
