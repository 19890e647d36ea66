//! Erasure of a user (`kortex erase-user`, `DELETE /api/v1/users/{name}`;
//! `docs/storage.md#erasure`): their sessions go with everything they hold, and wherever
//! else their name is stored — usage and audit rows, proposal mirrors, other sessions'
//! transcripts, run control, budget counters — it is replaced by a keyed hash, the same
//! everywhere, so spend totals and the audit trail stay whole and consistent. A second
//! erasure of the same name finds nothing and changes nothing.

use super::retention::{BATCH, Pruned, Reason};
use super::{Backend, Store, StoreError};
use serde_json::json;
use sqlx::Row;
use std::collections::BTreeMap;

/// The pseudonym of `user` under `key`: `erased-` and 16 hex digits of
/// HMAC-SHA256(key, user). The same key gives the same pseudonym, so rows pseudonymised
/// by two erasures still add up per person.
pub fn pseudonym(key: &[u8], user: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, user.as_bytes());
    let hex: String = tag.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("erased-{hex}")
}

/// A fresh random key, for an erasure without a configured one (`KORTEX_ERASURE_KEY`):
/// its pseudonyms link to nobody, ever.
pub fn random_key() -> Vec<u8> {
    use ring::rand::SecureRandom;
    let mut key = vec![0u8; 32];
    // The system's generator does not fail on the platforms Kortex runs on; a UUID's
    // randomness is the fallback.
    if ring::rand::SystemRandom::new().fill(&mut key).is_err() {
        key = uuid::Uuid::new_v4().as_bytes().repeat(2);
    }
    key
}

/// What an erasure did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Erased {
    /// The pseudonym that replaced the name.
    pub pseudonym: String,
    /// Rows deleted (the user's sessions and what they held).
    pub deleted: Pruned,
    /// Other rows deleted: the user's MCP transport sessions, budget counters and the
    /// shares others gave them.
    pub deleted_other: u64,
    /// Rows whose text named the user, by table, now naming the pseudonym.
    pub pseudonymised: BTreeMap<&'static str, u64>,
}

impl Erased {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.deleted.is_empty()
            && self.deleted_other == 0
            && self.pseudonymised.values().all(|n| *n == 0)
    }
}

/// The tables whose text may name a user, with their keys and text columns. Exact-name
/// columns (`user_name`, `decided_by`) and free text alike are rewritten where the name
/// stands as a whole word (not inside a longer name).
const TEXT: &[(&str, &[&str], &[&str])] = &[
    ("decisions", &["id"], &["user_name", "subject", "detail"]),
    ("usage_events", &["id"], &["user_name"]),
    (
        "proposals",
        &["id"],
        &[
            "user_name",
            "session_name",
            "rationale",
            "decision",
            "message",
            "params",
            "target",
            "preview",
            "undo",
        ],
    ),
    ("run_intents", &["id"], &["user_name", "message"]),
    (
        "run_plans",
        &["id"],
        &["decided_by", "steps", "approved_steps"],
    ),
    ("chat_sessions", &["id"], &["name", "title"]),
    ("chat_runs", &["id"], &["reason", "actor"]),
    (
        "chat_messages",
        &["id"],
        &["content", "tool_calls", "author"],
    ),
    (
        "session_shares",
        &["session_id", "kind", "principal"],
        &["created_by"],
    ),
    (
        "session_handovers",
        &["id"],
        &["from_user", "to_user", "note", "summary"],
    ),
    ("run_events", &["session_id", "seq"], &["data"]),
    ("tool_results", &["id"], &["content"]),
    ("mcp_sessions", &["id"], &["state"]),
    ("notify_events", &["id"], &["data"]),
];

/// Whether `next` (then `then`) continues a user name: a letter or digit does; so does
/// `.`, `_`, `-`, `@` or `+` followed by one (`bob.smith`), but not a full stop ending a
/// sentence (`approved by bob.`).
fn continues(next: Option<char>, then: Option<char>) -> bool {
    match next {
        Some(c) if c.is_alphanumeric() => true,
        Some('.' | '_' | '-' | '@' | '+') => then.is_some_and(char::is_alphanumeric),
        _ => false,
    }
}

/// `text` with every whole-word `name` replaced by `with`.
fn replace_name(text: &str, name: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(name) {
        let mut before = rest[..i].chars().rev();
        let mut after = rest[i + name.len()..].chars();
        let inside =
            continues(before.next(), before.next()) || continues(after.next(), after.next());
        out.push_str(&rest[..i]);
        out.push_str(if inside { name } else { with });
        rest = &rest[i + name.len()..];
    }
    out.push_str(rest);
    out
}

impl Store {
    /// Sessions of `user` whose run is still writing (to be cancelled before an erasure).
    pub async fn writing_sessions_of(&self, user: &str) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM chat_sessions WHERE user_name = $1 AND id IN {}",
            super::retention::LIVE
        )))
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| r.try_get("id").map_err(StoreError::from))
            .collect()
    }

    /// Erases `user` (see the module), as asked by `by`; records it (`kind: deletion`,
    /// `outcome: erasure`, the pseudonym as subject, counts) unless nothing was found.
    /// Sessions with a run still writing are left (cancel it first): the error says so.
    pub async fn erase_user(&self, user: &str, key: &[u8], by: &str) -> Result<Erased, StoreError> {
        if user.is_empty() {
            return Err(StoreError::Conflict("the user name is empty".into()));
        }
        let busy = self.writing_sessions_of(user).await?;
        if !busy.is_empty() {
            return Err(StoreError::Conflict(format!(
                "{} session(s) of this user still have a run writing; cancel them and retry",
                busy.len()
            )));
        }
        let mut erased = Erased {
            pseudonym: pseudonym(key, user),
            ..Default::default()
        };
        // Their sessions, with all they hold.
        let ids: Vec<String> = sqlx::query("SELECT id FROM chat_sessions WHERE user_name = $1")
            .bind(user)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, _>>()?;
        for chunk in ids.chunks(BATCH as usize) {
            // Ids are UUIDs this store made: safe as literals.
            let list = chunk
                .iter()
                .map(|id| format!("'{}'", id.replace('\'', "''")))
                .collect::<Vec<_>>()
                .join(", ");
            let pick =
                format!("SELECT id FROM chat_sessions WHERE updated_at < $1 AND id IN ({list})");
            self.delete_sessions(&pick, i64::MAX, &mut erased.deleted)
                .await?;
        }
        // What others shared with them.
        erased.deleted_other +=
            sqlx::query("DELETE FROM session_shares WHERE kind = 'user' AND principal = $1")
                .bind(user)
                .execute(&self.pool)
                .await?
                .rows_affected();
        erased.deleted_other += sqlx::query("DELETE FROM mcp_sessions WHERE user_name = $1")
            .bind(user)
            .execute(&self.pool)
            .await?
            .rows_affected();
        // Their sign-ins end too.
        erased.deleted_other += self.delete_auth_sessions_of(user).await?;
        // Rolling counters keyed by the name (`requests/ns/policy/user`): short-lived, and
        // nobody is left to draw on them.
        let suffix = format!("%/{}", like_escape(user));
        for table in ["budget_counters", "budget_reservations"] {
            erased.deleted_other += sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE scope LIKE $1 ESCAPE '\\'"
            )))
            .bind(&suffix)
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        let merged = self.merge_usage_daily(user, &erased.pseudonym).await?;
        erased.pseudonymised.insert("usage_daily", merged);
        for (table, key, columns) in TEXT {
            let n = self
                .pseudonymise(table, key, columns, user, &erased.pseudonym)
                .await?;
            erased.pseudonymised.insert(table, n);
        }
        // An admin erasing themselves is named by the pseudonym too.
        let by = if by == user {
            erased.pseudonym.as_str()
        } else {
            by
        };
        if !erased.is_empty() {
            self.record_deletion(
                Reason::Erasure,
                &erased.pseudonym,
                Some(by),
                json!({"deleted": erased.deleted, "deletedOther": erased.deleted_other, "pseudonymised": erased.pseudonymised}),
            )
            .await?;
        }
        Ok(erased)
    }

    /// Moves `user`'s daily roll-ups to `pseudonym`, adding to rows it already has.
    async fn merge_usage_daily(&self, user: &str, pseudonym: &str) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let moved = sqlx::query(concat!(
            "INSERT INTO usage_daily (day, policy, provider, model, user_name, requests, input_tokens, \
             output_tokens, cost_usd, estimated_requests) \
             SELECT day, policy, provider, model, $2, requests, input_tokens, output_tokens, cost_usd, \
             estimated_requests FROM usage_daily WHERE user_name = $1",
            usage_daily_add!()
        ))
        .bind(user)
        .bind(pseudonym)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM usage_daily WHERE user_name = $1")
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(moved)
    }

    /// Rewrites `table`'s rows whose `columns` name `user` as a whole word; how many rows.
    /// Walks the table by key, a batch at a time (rows containing the name inside a longer
    /// one are read and left as they are).
    async fn pseudonymise(
        &self,
        table: &str,
        key: &[&str],
        columns: &[&str],
        user: &str,
        pseudonym: &str,
    ) -> Result<u64, StoreError> {
        let contains = |c: &str| match self.backend {
            Backend::Postgres => format!("strpos({c}, $1) > 0"),
            Backend::Sqlite => format!("instr({c}, $1) > 0"),
        };
        let found = columns
            .iter()
            .map(|c| contains(c))
            .collect::<Vec<_>>()
            .join(" OR ");
        let keys = key.join(", ");
        // Keyset pagination: `(k1, k2) > ($2, $3)`.
        let after = format!(
            "({keys}) > ({})",
            (0..key.len())
                .map(|i| format!("${}", i + 2))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let cols = columns.join(", ");
        let set = columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let at = key
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ${}", columns.len() + i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        let int_key = |k: &str| k == "seq";
        let mut last: Option<Vec<KeyValue>> = None;
        let mut changed = 0;
        loop {
            let sql = format!(
                "SELECT {keys}, {cols} FROM {table} WHERE ({found}){} ORDER BY {keys} LIMIT {BATCH}",
                if last.is_some() {
                    format!(" AND {after}")
                } else {
                    String::new()
                }
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(user);
            for v in last.iter().flatten() {
                q = v.bind(q);
            }
            let rows = q.fetch_all(&self.pool).await?;
            for row in &rows {
                let mut values = Vec::with_capacity(columns.len());
                let mut any = false;
                for c in columns {
                    let v: Option<String> = row.try_get(*c)?;
                    let new = v.as_deref().map(|t| replace_name(t, user, pseudonym));
                    any |= new != v;
                    values.push(new);
                }
                let k: Vec<KeyValue> = key
                    .iter()
                    .map(|k| {
                        Ok(if int_key(k) {
                            KeyValue::Int(row.try_get(*k)?)
                        } else {
                            KeyValue::Text(row.try_get(*k)?)
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()?;
                if any {
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE {table} SET {set} WHERE {at}"
                    )));
                    for v in values {
                        q = q.bind(v);
                    }
                    for v in &k {
                        q = v.bind(q);
                    }
                    changed += q.execute(&self.pool).await?.rows_affected();
                }
                last = Some(k);
            }
            if rows.len() < BATCH as usize {
                return Ok(changed);
            }
        }
    }
}

/// A key column's value.
#[derive(Clone, Debug)]
enum KeyValue {
    Text(String),
    Int(i64),
}

impl KeyValue {
    fn bind<'q>(
        &self,
        q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        match self {
            Self::Text(s) => q.bind(s.clone()),
            Self::Int(i) => q.bind(*i),
        }
    }
}

/// `s` with LIKE's wildcards escaped (by `\`).
fn like_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_replaced_as_whole_words_only() {
        let out = replace_name(
            r#"{"by":"bob"} approved by bob; bobby, bob.smith and x.bob stay; requests/shop/ops/bob. By bob."#,
            "bob",
            "erased-1",
        );
        assert_eq!(
            out,
            r#"{"by":"erased-1"} approved by erased-1; bobby, bob.smith and x.bob stay; requests/shop/ops/erased-1. By erased-1."#
        );
        assert_eq!(replace_name("bob", "bob", "x"), "x");
    }

    #[test]
    fn the_pseudonym_is_keyed_and_stable() {
        let a = pseudonym(b"k1", "alice");
        assert_eq!(a, pseudonym(b"k1", "alice"));
        assert_ne!(a, pseudonym(b"k2", "alice"));
        assert_ne!(a, pseudonym(b"k1", "bob"));
        assert!(a.starts_with("erased-") && a.len() == "erased-".len() + 16);
        assert!(!a.contains("alice"));
    }
}
