//! What Kortex's MCP door keeps: the session each caller's MCP tool calls belong to, and the
//! transport sessions (`Mcp-Session-Id`) with their owner and `initialize` parameters, so
//! any replica can carry a session on.

use super::models::{NewSession, SessionRecord};
use super::{Store, StoreError, now_ms};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// The `origin` of sessions whose tool calls came in over MCP.
pub const MCP_ORIGIN: &str = "mcp";

/// The id of the MCP session of `user` named `name` in `namespace`: the same on every
/// replica, so concurrent first calls meet on one row.
fn mcp_session_id(user: &str, namespace: &str, name: &str) -> String {
    let mut h = Sha256::new();
    for part in [user, namespace, name] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("mcp-{hex}")
}

impl Store {
    /// The session that `new.user`'s MCP tool calls named `new.name` in `new.namespace`
    /// belong to, created on first use. Its policy is refreshed to the one now governing it.
    pub async fn mcp_session(&self, new: &NewSession) -> Result<SessionRecord, StoreError> {
        let id = mcp_session_id(&new.user, &new.namespace, &new.name);
        let now = now_ms();
        sqlx::query(
            "INSERT INTO chat_sessions (id, name, namespace, user_name, policy, status, dynamic_tools, created_at, updated_at, origin) \
             VALUES ($1, $2, $3, $4, $5, 'idle', '[]', $6, $6, 'mcp') ON CONFLICT (id) DO NOTHING",
        )
        .bind(&id)
        .bind(&new.name)
        .bind(&new.namespace)
        .bind(&new.user)
        .bind(&new.policy)
        .bind(now)
        .execute(&self.pool)
        .await?;
        // A session the user deleted comes back when they use MCP again.
        sqlx::query("UPDATE chat_sessions SET policy = $2, deleted_at = NULL WHERE id = $1 AND (policy IS NULL OR policy <> $2 OR deleted_at IS NOT NULL)")
            .bind(&id)
            .bind(&new.policy)
            .execute(&self.pool)
            .await?;
        self.get_session(&id, &new.user).await?.ok_or_else(|| {
            StoreError::Conflict(format!("the MCP session {id} vanished as it was created"))
        })
    }

    /// Records who opened the MCP transport session `id` (only they may use it).
    pub async fn set_mcp_owner(&self, id: &str, user: &str) -> Result<(), StoreError> {
        self.set_mcp_column(id, "user_name", user).await
    }

    /// Who opened the MCP transport session `id`: `None` if it is unknown, `Some(None)`
    /// while its owner is being recorded.
    pub async fn mcp_owner(&self, id: &str) -> Result<Option<Option<String>>, StoreError> {
        self.mcp_column(id, "user_name").await
    }

    /// Keeps the `initialize` parameters (JSON) of MCP transport session `id`.
    pub async fn put_mcp_state(&self, id: &str, state: &str) -> Result<(), StoreError> {
        self.set_mcp_column(id, "state", state).await
    }

    /// The kept `initialize` parameters of MCP transport session `id`.
    pub async fn mcp_state(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.mcp_column(id, "state").await?.flatten())
    }

    /// Sets `column` (`user_name` or `state`) of MCP transport session `id`, creating its
    /// row, and marks it used now.
    async fn set_mcp_column(
        &self,
        id: &str,
        column: &'static str,
        value: &str,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO mcp_sessions (id, {column}, created_at, used_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (id) DO UPDATE SET {column} = $2, used_at = $3"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(value)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `column` of MCP transport session `id`: `None` if it is unknown.
    async fn mcp_column(
        &self,
        id: &str,
        column: &'static str,
    ) -> Result<Option<Option<String>>, StoreError> {
        let sql = format!("SELECT {column} FROM mcp_sessions WHERE id = $1");
        let stmt = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id);
        self.first(stmt, |r| Ok(r.try_get::<Option<String>, _>(column)?))
            .await
    }

    /// Forgets MCP transport session `id` (the client ended it).
    pub async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM mcp_sessions WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::mcp_session_id;

    #[test]
    fn mcp_session_ids_differ_by_user_namespace_and_name() {
        let a = mcp_session_id("alice", "default", "mcp");
        assert_eq!(a, mcp_session_id("alice", "default", "mcp"));
        assert_ne!(a, mcp_session_id("bob", "default", "mcp"));
        assert_ne!(a, mcp_session_id("alice", "shop", "mcp"));
        // The separator keeps "ab"+"c" apart from "a"+"bc".
        assert_ne!(
            mcp_session_id("ab", "c", "x"),
            mcp_session_id("a", "bc", "x")
        );
        assert!(a.starts_with("mcp-") && a.len() == 36);
    }
}
