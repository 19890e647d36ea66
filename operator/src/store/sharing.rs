//! Sessions shared with other users and groups (`docs/chat.md#sharing`): to `read` (follow
//! the session, its messages, events and export) or to `continue` (also post messages,
//! answer dynamic tool calls, steer and cancel its runs). The owner alone shares, revokes
//! and deletes. A hand-over (`docs/chat.md#hand-over`) shares to continue with a note for
//! the next person, and notifies them.

use super::{SessionRecord, Store, StoreError, new_id, now_ms};
use serde::{Deserialize, Serialize};
use serde_json::json;
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

/// A hand-over note: who passed the session to whom, what they wrote, and the summary of
/// the investigation so far (by the policy's `summarize` model, when it has one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// Its id.
    pub id: String,
    /// Who handed over.
    pub from: String,
    /// To whom.
    pub to: String,
    /// Their note.
    pub note: String,
    /// The summary, when a `summarize` model wrote one.
    pub summary: Option<String>,
    /// Unix ms.
    pub created_at: i64,
}

/// Grants (or changes) `principal`'s access in `tx`.
async fn upsert_share(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
    kind: &str,
    principal: &str,
    access: Access,
    by: &str,
) -> Result<(), StoreError> {
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
    .execute(&mut **tx)
    .await?;
    Ok(())
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
            upsert_share(&mut tx, id, kind, principal, access, by).await?;
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
        let stmt = sqlx::query(
            "SELECT kind, principal, access, created_by, created_at FROM session_shares \
             WHERE session_id = $1 ORDER BY kind DESC, principal",
        )
        .bind(id);
        self.all(stmt, |r| {
            Ok(from_row!(r => Share {
                kind, principal, access = Access::parse(&r.try_get::<String, _>("access")?),
                created_by, created_at,
            }))
        })
        .await
    }

    /// The sessions shared with `user` or one of `groups` (only session `only` when
    /// given), each with the most its shares allow: one query, whatever the number of groups.
    async fn grants(
        &self,
        user: &str,
        groups: &[String],
        only: Option<&str>,
    ) -> Result<std::collections::BTreeMap<String, Access>, StoreError> {
        let mut sql = String::from(
            "SELECT session_id, access FROM session_shares WHERE ((kind = 'user' AND principal = $1)",
        );
        if !groups.is_empty() {
            let marks: Vec<String> = (0..groups.len()).map(|i| format!("${}", i + 2)).collect();
            sql.push_str(&format!(
                " OR (kind = 'group' AND principal IN ({}))",
                marks.join(", ")
            ));
        }
        sql.push(')');
        if only.is_some() {
            sql.push_str(&format!(" AND session_id = ${}", groups.len() + 2));
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(user);
        for g in groups {
            query = query.bind(g);
        }
        if let Some(id) = only {
            query = query.bind(id);
        }
        let mut best = std::collections::BTreeMap::new();
        for r in query.fetch_all(&self.pool).await? {
            let access = Access::parse(&r.try_get::<String, _>("access")?);
            let id: String = r.try_get("session_id")?;
            let slot = best.entry(id).or_insert(access);
            *slot = (*slot).max(access);
        }
        Ok(best)
    }

    /// The sessions shared with `user` (directly or through one of `groups`), with the
    /// most each share allows; most recently updated first.
    pub async fn sessions_shared_with(
        &self,
        user: &str,
        groups: &[String],
    ) -> Result<Vec<(SessionRecord, Access)>, StoreError> {
        let mut out = Vec::new();
        for (id, access) in self.grants(user, groups, None).await? {
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
        let Some(access) = self.grants(user, groups, Some(id)).await?.remove(id) else {
            return Ok(None);
        };
        Ok(self
            .session_by_id(id)
            .await?
            .filter(|s| s.user != user)
            .map(|s| (s, access)))
    }

    /// Hands session `session` over from `from` to `to` in one transaction: `to` may
    /// continue it (unless they own it), the note is kept, and the `session.handover`
    /// event goes to the outbox of `policy` (`namespace/name`) when the session has one.
    pub async fn hand_over(
        &self,
        session: &SessionRecord,
        from: &str,
        to: &str,
        note: &str,
        summary: Option<&str>,
        policy: Option<&str>,
    ) -> Result<Handover, StoreError> {
        let handover = Handover {
            id: new_id(),
            from: from.to_owned(),
            to: to.to_owned(),
            note: note.to_owned(),
            summary: summary.map(str::to_owned),
            created_at: now_ms(),
        };
        let mut tx = self.begin().await?;
        if to != session.user {
            upsert_share(&mut tx, &session.id, "user", to, Access::Continue, from).await?;
        }
        sqlx::query(
            "INSERT INTO session_handovers (id, session_id, from_user, to_user, note, summary, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&handover.id)
        .bind(&session.id)
        .bind(from)
        .bind(to)
        .bind(note)
        .bind(summary)
        .bind(handover.created_at)
        .execute(&mut *tx)
        .await?;
        if let Some(policy) = policy {
            let data = json!({
                "handoverId": handover.id,
                "sessionId": session.id,
                "sessionName": session.name,
                "namespace": session.namespace,
                "title": session.title,
                "owner": session.user,
                "from": from,
                "to": to,
                "note": note,
                "summary": summary,
            });
            super::notify::add_event(&mut tx, "session.handover", policy, &session.id, &data)
                .await?;
        }
        tx.commit().await?;
        Ok(handover)
    }

    /// The hand-over notes of session `id`, oldest first.
    pub async fn handovers(&self, id: &str) -> Result<Vec<Handover>, StoreError> {
        let stmt = sqlx::query(
            "SELECT id, from_user, to_user, note, summary, created_at FROM session_handovers \
             WHERE session_id = $1 ORDER BY created_at, id",
        )
        .bind(id);
        self.all(stmt, |r| {
            Ok(from_row!(r => Handover {
                id, from as "from_user", to as "to_user", note, summary, created_at,
            }))
        })
        .await
    }
}
