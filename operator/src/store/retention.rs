//! Retention: what is kept how long (`docs/storage.md#retention`). `store/` owns the
//! deletes; the pruner task (`cli/pruner.rs`) decides when. Each pass deletes in batches of
//! at most [`BATCH`] rows per statement, so a chat run writing meanwhile waits for one short
//! statement at most, and records what it deleted as an audit row (`kind: deletion`,
//! `outcome`: the reason — `retention`, `size_cap` or `session_deleted` — and counts per
//! table).
//!
//! Windows come from a `ChatPolicy`'s `spec.retention` for the sessions (and their runs,
//! usage and audit rows) created under it, and from the `--retention-*` flags for the rest.
//!
//! Never deleted by retention: anything of a session with a run in progress (running,
//! pausing, paused, waiting for client results or for its plan), a session with a proposal
//! still `Pending` or `Executing`, proposals themselves (the record of what was proposed and
//! decided), and the daily usage roll-ups (spend totals stay whole).

use super::{Backend, Store, StoreError};
use serde_json::json;

/// Rows per statement.
pub const BATCH: i64 = 1000;

/// Audit rows are kept at least this long (a shorter window is raised to it).
pub const AUDIT_MIN_MS: i64 = 30 * DAY_MS;

const DAY_MS: i64 = 86_400_000;

/// Settled notifications are kept this long.
const NOTIFY_KEEP_MS: i64 = 7 * DAY_MS;

/// How long things are kept, in milliseconds (0: kept forever).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// A session not updated for this long goes, with all it holds.
    pub sessions_ms: i64,
    /// The events of a failed or cancelled run that ended this long ago.
    pub failed_runs_ms: i64,
    /// Stored large tool results (read with `read_result_chunk`).
    pub tool_results_ms: i64,
    /// Per-call usage rows (the daily roll-ups are kept).
    pub usage_ms: i64,
    /// Audit rows (at least [`AUDIT_MIN_MS`]).
    pub audit_ms: i64,
    /// What one user may keep stored (messages, events, tool results); past it their oldest
    /// sessions go first. `None`: no cap.
    pub max_stored_bytes_per_user: Option<u64>,
    /// Responses the gateway's `/v1/responses` kept (`store: true`), by their age.
    pub responses_ms: i64,
}

impl Default for Windows {
    /// The documented defaults (those of the `--retention-*` flags).
    fn default() -> Self {
        Self {
            sessions_ms: 90 * DAY_MS,
            failed_runs_ms: 30 * DAY_MS,
            tool_results_ms: 7 * DAY_MS,
            responses_ms: 30 * DAY_MS,
            usage_ms: 400 * DAY_MS,
            audit_ms: 400 * DAY_MS,
            max_stored_bytes_per_user: None,
        }
    }
}

/// Which rows a scope's windows govern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Governs {
    /// What was created under the policy `namespace/name`.
    Policy {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Everything not created under one of these policies (`(namespace, name)`).
    Rest(Vec<(String, String)>),
}

/// Windows and the rows they govern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// How long.
    pub windows: Windows,
    /// What.
    pub governs: Governs,
}

impl Scope {
    /// One scope for everything.
    pub fn all(windows: Windows) -> Self {
        Self {
            windows,
            governs: Governs::Rest(Vec::new()),
        }
    }

    /// SQL condition on a session row aliased `a` (`namespace`, `policy` as a name).
    fn sessions(&self, a: &str) -> String {
        let one = |ns: &str, name: &str| {
            format!(
                "({a}.namespace = {} AND COALESCE({a}.policy, '') = {})",
                lit(ns),
                lit(name)
            )
        };
        self.render(one)
    }

    /// SQL condition on a column holding `namespace/name` (runs, usage rows).
    fn qualified(&self, column: &str) -> String {
        self.render(|ns, name| format!("COALESCE({column}, '') = {}", lit(&format!("{ns}/{name}"))))
    }

    /// SQL condition on an audit row (`namespace`, and `policy` as a name or
    /// `namespace/name`).
    fn decisions(&self) -> String {
        self.render(|ns, name| {
            format!(
                "(COALESCE(namespace, '') = {} AND COALESCE(policy, '') IN ({}, {}))",
                lit(ns),
                lit(name),
                lit(&format!("{ns}/{name}"))
            )
        })
    }

    fn render(&self, one: impl Fn(&str, &str) -> String) -> String {
        match &self.governs {
            Governs::Policy { namespace, name } => one(namespace, name),
            Governs::Rest(except) if except.is_empty() => "1 = 1".into(),
            Governs::Rest(except) => format!(
                "NOT ({})",
                except
                    .iter()
                    .map(|(ns, name)| one(ns, name))
                    .collect::<Vec<_>>()
                    .join(" OR ")
            ),
        }
    }
}

/// A SQL string literal (Kubernetes names and ids never hold a quote; doubled if one did).
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// What one pass deleted, by table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pruned {
    /// `chat_sessions` rows (their messages, events, runs and results are counted apart).
    pub sessions: u64,
    /// `chat_messages` rows.
    pub messages: u64,
    /// `run_events` rows.
    pub events: u64,
    /// `chat_runs` rows.
    pub runs: u64,
    /// `tool_results` rows.
    pub tool_results: u64,
    /// `mcp_sessions` rows (idle MCP transport sessions, on the sessions window).
    pub mcp_sessions: u64,
    /// `usage_events` rows (per call; the daily roll-ups stay).
    pub usage_events: u64,
    /// `decisions` rows (the audit log).
    pub decisions: u64,
    /// `notify_events` and `notify_deliveries` rows, 7 days after they were settled.
    pub notifications: u64,
    /// `gateway_responses` rows (`/v1/responses` with `store`).
    pub responses: u64,
}

impl Pruned {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        for (mine, theirs) in self.counts_mut().into_iter().zip(other.counts()) {
            *mine.1 += theirs.1;
        }
    }

    /// Counts by kind (the metric's `kind` label).
    pub fn counts(&self) -> [(&'static str, u64); 10] {
        // The fields are listed once, in `counts_mut`.
        let mut copy = *self;
        copy.counts_mut().map(|(kind, n)| (kind, *n))
    }

    fn counts_mut(&mut self) -> [(&'static str, &mut u64); 10] {
        [
            ("sessions", &mut self.sessions),
            ("messages", &mut self.messages),
            ("events", &mut self.events),
            ("runs", &mut self.runs),
            ("tool_results", &mut self.tool_results),
            ("mcp_sessions", &mut self.mcp_sessions),
            ("usage_events", &mut self.usage_events),
            ("decisions", &mut self.decisions),
            ("notifications", &mut self.notifications),
            ("responses", &mut self.responses),
        ]
    }

    /// Whether nothing was deleted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Why rows were deleted (the audit row's `outcome`, the metric's `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Past a retention window.
    Retention,
    /// Their user deleted the session (or an admin did).
    SessionDeleted,
    /// A user was erased.
    Erasure,
    /// Their user stored more than `maxStoredBytesPerUser`.
    SizeCap,
}

impl Reason {
    /// As written in audit rows and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retention => "retention",
            Self::SessionDeleted => "session_deleted",
            Self::Erasure => "erasure",
            Self::SizeCap => "size_cap",
        }
    }
}

/// Sessions retention must leave alone: a run in progress, or a proposal still open.
const IN_USE: &str = "(SELECT session_id FROM chat_runs WHERE finished_at IS NULL \
     UNION SELECT session_id FROM proposals WHERE phase IN ('Pending', 'Executing') AND session_id IS NOT NULL)";

/// Sessions with a run whose task is writing (a deleted session's parked run — paused,
/// waiting for client results or a plan — goes with it).
pub(super) const LIVE: &str =
    "(SELECT session_id FROM chat_runs WHERE status IN ('running', 'pausing', 'cancelling'))";

impl Store {
    /// Deletes `sql` (which must bind the cutoff as `$1` and the batch as `$2`) batch by
    /// batch until nothing is left; how many rows. Between batches it rests as long as the
    /// last one took, so writers waiting meanwhile (a chat run appending its events) get
    /// the database at least half the time: SQLite has one writer at a time, and a writer
    /// that finds it busy backs off in growing sleeps.
    async fn delete_batched(&self, sql: &str, cutoff: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let started = std::time::Instant::now();
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .bind(cutoff)
                .bind(BATCH)
                .execute(&self.pool)
                .await?
                .rows_affected();
            total += done;
            if done < BATCH as u64 {
                return Ok(total);
            }
            tokio::time::sleep(started.elapsed().max(std::time::Duration::from_millis(1))).await;
        }
    }

    /// Deletes the sessions `ids` selects (SQL binding a cutoff as `$1`) with everything
    /// they hold: their rows first, in batches, the session rows last (nothing left to
    /// cascade), so no statement deletes more than a batch.
    pub(super) async fn delete_sessions(
        &self,
        ids: &str,
        cutoff: i64,
        p: &mut Pruned,
    ) -> Result<(), StoreError> {
        for (table, key, counter) in [
            ("run_events", "(session_id, seq)", &mut p.events as &mut u64),
            ("chat_messages", "id", &mut p.messages),
            ("tool_results", "id", &mut p.tool_results),
            ("chat_runs", "id", &mut p.runs),
        ] {
            let pick = key.trim_matches(|c| c == '(' || c == ')');
            *counter += self
                .delete_batched(
                    &format!(
                        "DELETE FROM {table} WHERE {key} IN (SELECT {pick} FROM {table} \
                         WHERE session_id IN ({ids}) LIMIT $2)"
                    ),
                    cutoff,
                )
                .await?;
        }
        p.sessions += self
            .delete_batched(
                &format!("DELETE FROM chat_sessions WHERE id IN ({ids} LIMIT $2)"),
                cutoff,
            )
            .await?;
        Ok(())
    }

    /// Records a deletion: `kind: deletion`, the reason as `outcome` and `detail.reason`.
    pub(super) async fn record_deletion(
        &self,
        reason: Reason,
        subject: &str,
        user: Option<&str>,
        detail: serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut detail = detail;
        detail["reason"] = json!(reason.as_str());
        self.record_decision(&super::NewDecision {
            kind: "deletion".into(),
            subject: subject.into(),
            outcome: reason.as_str().into(),
            user: user.map(str::to_owned),
            detail,
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    /// Removes for good the sessions their users deleted (`DELETE /chat/v1/sessions/{id}`
    /// hides one at once) unless a run of theirs is still writing; records it (`outcome:
    /// session_deleted`). Their proposals stay (the audit record of what was proposed).
    pub async fn purge_deleted(&self) -> Result<Pruned, StoreError> {
        let mut p = Pruned::default();
        let deleted = format!(
            "SELECT id FROM chat_sessions WHERE deleted_at IS NOT NULL AND deleted_at < $1 AND id NOT IN {LIVE}"
        );
        self.delete_sessions(&deleted, i64::MAX, &mut p).await?;
        if !p.is_empty() {
            self.record_deletion(
                Reason::SessionDeleted,
                "deleted sessions",
                None,
                json!({"deleted": p}),
            )
            .await?;
        }
        Ok(p)
    }

    /// One retention pass as of `now` (Unix ms): deletes what each scope's windows no
    /// longer keep and records it (`outcome: retention`).
    pub async fn prune(&self, now: i64, scopes: &[Scope]) -> Result<Pruned, StoreError> {
        let mut total = Pruned::default();
        for scope in scopes {
            let p = self.prune_scope(now, scope).await?;
            total.add(&p);
        }
        if !total.is_empty() {
            self.record_deletion(
                Reason::Retention,
                "retention",
                None,
                json!({"deleted": total, "scopes": scopes.iter().map(describe).collect::<Vec<_>>()}),
            )
            .await?;
        }
        Ok(total)
    }

    async fn prune_scope(&self, now: i64, scope: &Scope) -> Result<Pruned, StoreError> {
        let w = &scope.windows;
        let mut p = Pruned::default();
        if w.failed_runs_ms > 0 {
            p.events += self
                .delete_batched(
                    &format!(
                        "DELETE FROM run_events WHERE (session_id, seq) IN (\
                           SELECT e.session_id, e.seq FROM chat_runs r \
                           JOIN run_events e ON e.session_id = r.session_id AND e.run_id = r.id \
                           JOIN chat_sessions s ON s.id = r.session_id \
                           WHERE r.status IN ('failed', 'cancelled') AND r.finished_at < $1 AND {} LIMIT $2)",
                        scope.sessions("s")
                    ),
                    now - w.failed_runs_ms,
                )
                .await?;
        }
        if w.tool_results_ms > 0 {
            p.tool_results += self
                .delete_batched(
                    &format!(
                        "DELETE FROM tool_results WHERE id IN (SELECT t.id FROM tool_results t \
                         JOIN chat_sessions s ON s.id = t.session_id \
                         WHERE t.created_at < $1 AND {} AND t.session_id NOT IN {IN_USE} LIMIT $2)",
                        scope.sessions("s")
                    ),
                    now - w.tool_results_ms,
                )
                .await?;
        }
        if w.sessions_ms > 0 {
            let idle = format!(
                "SELECT s.id FROM chat_sessions s WHERE s.updated_at < $1 AND {} AND s.id NOT IN {IN_USE}",
                scope.sessions("s")
            );
            self.delete_sessions(&idle, now - w.sessions_ms, &mut p)
                .await?;
            // Transport sessions belong to no policy: the flags' window.
            if matches!(scope.governs, Governs::Rest(_)) {
                p.mcp_sessions += self
                    .delete_batched(
                        "DELETE FROM mcp_sessions WHERE id IN (SELECT id FROM mcp_sessions \
                         WHERE used_at < $1 LIMIT $2)",
                        now - w.sessions_ms,
                    )
                    .await?;
            }
        }
        // Stored gateway responses belong to a key, not to a session: the flags' window.
        if matches!(scope.governs, Governs::Rest(_)) && w.responses_ms > 0 {
            p.responses += self
                .delete_batched(
                    "DELETE FROM gateway_responses WHERE id IN (SELECT id FROM gateway_responses \
                     WHERE created_at < $1 LIMIT $2)",
                    now - w.responses_ms,
                )
                .await?;
        }
        // Notifications sent or given up on are kept a week (the outbox, not a record).
        if matches!(scope.governs, Governs::Rest(_)) {
            let settled = now - NOTIFY_KEEP_MS;
            p.notifications += self
                .delete_batched(
                    "DELETE FROM notify_deliveries WHERE id IN (SELECT id FROM notify_deliveries \
                     WHERE COALESCE(delivered_at, failed_at) < $1 LIMIT $2)",
                    settled,
                )
                .await?;
            p.notifications += self
                .delete_batched(
                    "DELETE FROM notify_events WHERE id IN (SELECT e.id FROM notify_events e \
                     WHERE e.fanned_at < $1 AND NOT EXISTS (SELECT 1 FROM notify_deliveries d WHERE d.event_id = e.id) LIMIT $2)",
                    settled,
                )
                .await?;
        }
        if w.usage_ms > 0 {
            p.usage_events += self
                .delete_batched(
                    &format!(
                        "DELETE FROM usage_events WHERE id IN (SELECT id FROM usage_events \
                         WHERE at < $1 AND {} LIMIT $2)",
                        scope.qualified("policy")
                    ),
                    now - w.usage_ms,
                )
                .await?;
        }
        if w.audit_ms > 0 {
            p.decisions += self
                .delete_batched(
                    &format!(
                        "DELETE FROM decisions WHERE id IN (SELECT id FROM decisions \
                         WHERE at < $1 AND {} LIMIT $2)",
                        scope.decisions()
                    ),
                    now - w.audit_ms.max(AUDIT_MIN_MS),
                )
                .await?;
        }
        Ok(p)
    }

    /// Enforces each scope's `maxStoredBytesPerUser`: a user storing more (messages, run
    /// events, tool results of their sessions under that scope) loses their oldest sessions
    /// first until under it; sessions in use stay. Records it (`outcome: size_cap`).
    pub async fn cap_sizes(&self, scopes: &[Scope]) -> Result<Pruned, StoreError> {
        let mut total = Pruned::default();
        let mut users = std::collections::BTreeSet::new();
        for scope in scopes {
            let Some(cap) = scope.windows.max_stored_bytes_per_user else {
                continue;
            };
            let bytes = |col: &str| match self.backend {
                Backend::Postgres => format!("octet_length({col})"),
                Backend::Sqlite => format!("length(CAST({col} AS BLOB))"),
            };
            let sql = format!(
                "SELECT s.id, s.user_name, CAST(\
                   COALESCE((SELECT SUM({}) FROM chat_messages m WHERE m.session_id = s.id), 0) \
                 + COALESCE((SELECT SUM({}) FROM run_events e WHERE e.session_id = s.id), 0) \
                 + COALESCE((SELECT SUM({}) FROM tool_results t WHERE t.session_id = s.id), 0) AS BIGINT) AS bytes, \
                 CASE WHEN s.id IN {IN_USE} THEN 1 ELSE 0 END AS busy \
                 FROM chat_sessions s WHERE s.deleted_at IS NULL AND {} \
                 ORDER BY s.user_name, s.updated_at, s.id",
                bytes("m.content"),
                bytes("e.data"),
                bytes("t.content"),
                scope.sessions("s")
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&self.pool)
                .await?;
            let mut sessions: Vec<(String, String, u64, bool)> = Vec::with_capacity(rows.len());
            for row in &rows {
                use sqlx::Row;
                sessions.push((
                    row.try_get("id")?,
                    row.try_get("user_name")?,
                    row.try_get::<i64, _>("bytes")?.max(0) as u64,
                    row.try_get::<i64, _>("busy")? != 0,
                ));
            }
            let doomed = over_cap(&sessions, cap);
            for (user, _) in &doomed {
                users.insert(user.clone());
            }
            let ids: Vec<&str> = doomed.iter().map(|(_, id)| id.as_str()).collect();
            for chunk in ids.chunks(BATCH as usize) {
                let list = chunk
                    .iter()
                    .map(|id| lit(id))
                    .collect::<Vec<_>>()
                    .join(", ");
                let pick = format!(
                    "SELECT id FROM chat_sessions WHERE updated_at < $1 AND id IN ({list})"
                );
                self.delete_sessions(&pick, i64::MAX, &mut total).await?;
            }
        }
        if !total.is_empty() {
            self.record_deletion(
                Reason::SizeCap,
                "maxStoredBytesPerUser",
                None,
                json!({"deleted": total, "users": users.len()}),
            )
            .await?;
        }
        Ok(total)
    }
}

/// The sessions (`(user, id)`) to delete so each user's total stays within `cap`: oldest
/// first, never one in use. `sessions` is `(id, user, bytes, in use)`, ordered by user, then
/// oldest first.
fn over_cap(sessions: &[(String, String, u64, bool)], cap: u64) -> Vec<(String, String)> {
    let mut doomed = Vec::new();
    for user in sessions.chunk_by(|a, b| a.1 == b.1) {
        let mut total: u64 = user.iter().map(|s| s.2).sum();
        for (id, name, bytes, busy) in user {
            if total <= cap {
                break;
            }
            if !busy {
                total -= bytes;
                doomed.push((name.clone(), id.clone()));
            }
        }
    }
    doomed
}

/// A scope as recorded in the audit row.
fn describe(scope: &Scope) -> serde_json::Value {
    let w = &scope.windows;
    let windows = json!({
        "sessions": w.sessions_ms,
        "failedRuns": w.failed_runs_ms,
        "toolResults": w.tool_results_ms,
        "usage": w.usage_ms,
        "audit": w.audit_ms,
        "maxStoredBytesPerUser": w.max_stored_bytes_per_user,
        "responses": w.responses_ms,
    });
    match &scope.governs {
        Governs::Policy { namespace, name } => {
            json!({"policy": format!("{namespace}/{name}"), "windowsMs": windows})
        }
        Governs::Rest(_) => json!({"policy": null, "windowsMs": windows}),
    }
}

/// Retention's flags of `kortex serve` and `kortex run` (`docs/storage.md#retention`): the
/// windows of everything no `ChatPolicy` sets its own for.
#[derive(clap::Args, Debug, Clone)]
pub struct RetentionArgs {
    /// How long a session nobody has used is kept, with all it holds (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_SESSIONS", default_value = "90d", value_parser = crate::crd::parse_window)]
    pub retention_sessions: std::time::Duration,
    /// How long the events of a failed or cancelled run are kept (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_FAILED_RUNS", default_value = "30d", value_parser = crate::crd::parse_window)]
    pub retention_failed_runs: std::time::Duration,
    /// How long stored large tool results are kept (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_TOOL_RESULTS", default_value = "7d", value_parser = crate::crd::parse_window)]
    pub retention_tool_results: std::time::Duration,
    /// How long per-call usage rows are kept; the daily roll-ups stay (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_USAGE", default_value = "400d", value_parser = crate::crd::parse_window)]
    pub retention_usage: std::time::Duration,
    /// How long audit rows are kept, at least 30d (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_AUDIT", default_value = "400d", value_parser = parse_audit_window)]
    pub retention_audit: std::time::Duration,
    /// How often the retention pass runs (on the leader).
    /// Responses kept by the gateway's `/v1/responses` (`store: true`) older than this are
    /// deleted (`0`: kept until deleted).
    #[arg(long, env = "KORTEX_RETENTION_RESPONSES", default_value = "30d", value_parser = crate::crd::parse_window)]
    pub retention_responses: std::time::Duration,
    #[arg(long, env = "KORTEX_RETENTION_EVERY", default_value = "15m", value_parser = parse_every)]
    pub retention_every: std::time::Duration,
    /// What one user may keep stored; past it their oldest sessions go first (default: no cap).
    #[arg(
        long,
        env = "KORTEX_RETENTION_MAX_STORED_BYTES_PER_USER",
        value_name = "BYTES"
    )]
    pub retention_max_stored_bytes_per_user: Option<u64>,
    /// The key of erasure pseudonyms (keep it in a Secret): with it, a user erased twice
    /// gets one pseudonym; without it, each erasure draws a random key.
    #[arg(
        long,
        env = "KORTEX_ERASURE_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub erasure_key: Option<String>,
}

impl RetentionArgs {
    /// The windows in milliseconds.
    pub fn windows(&self) -> Windows {
        Windows {
            sessions_ms: millis(self.retention_sessions),
            failed_runs_ms: millis(self.retention_failed_runs),
            tool_results_ms: millis(self.retention_tool_results),
            usage_ms: millis(self.retention_usage),
            audit_ms: millis(self.retention_audit),
            max_stored_bytes_per_user: self.retention_max_stored_bytes_per_user,
            responses_ms: millis(self.retention_responses),
        }
    }
}

/// A window in milliseconds.
pub fn millis(d: std::time::Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

fn parse_every(s: &str) -> Result<std::time::Duration, String> {
    let d = crate::crd::parse_window(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: the retention pass needs an interval, e.g. 15m"
        ));
    }
    Ok(d)
}

fn parse_audit_window(s: &str) -> Result<std::time::Duration, String> {
    let d = crate::crd::parse_window(s)?;
    if !d.is_zero() && millis(d) < AUDIT_MIN_MS {
        return Err(format!(
            "{s:?}: audit rows are kept at least 30d (0: forever)"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_sessions_of_a_user_over_the_cap_go_first_never_one_in_use() {
        let s = |id: &str, user: &str, bytes: u64, busy: bool| {
            (id.to_owned(), user.to_owned(), bytes, busy)
        };
        // Ordered by user, then oldest first.
        let sessions = [
            s("a1", "alice", 400, false),
            s("a2", "alice", 300, true),
            s("a3", "alice", 200, false),
            s("a4", "alice", 100, false),
            s("b1", "bob", 500, false),
        ];
        let doomed = over_cap(&sessions, 350);
        // alice: 1000 → a1 goes (600), a2 is in use, a3 goes (400), a4 goes (300).
        assert_eq!(
            doomed,
            vec![
                ("alice".to_owned(), "a1".to_owned()),
                ("alice".to_owned(), "a3".to_owned()),
                ("alice".to_owned(), "a4".to_owned()),
                ("bob".to_owned(), "b1".to_owned()),
            ]
        );
        assert!(over_cap(&sessions, 1000).iter().all(|(u, _)| u == "bob"));
    }

    #[test]
    fn scopes_render_as_conditions_on_their_policy_or_on_every_other() {
        let one = Scope {
            windows: Windows::default(),
            governs: Governs::Policy {
                namespace: "shop".into(),
                name: "o'ps".into(),
            },
        };
        assert_eq!(
            one.sessions("s"),
            "(s.namespace = 'shop' AND COALESCE(s.policy, '') = 'o''ps')"
        );
        assert_eq!(
            one.qualified("policy"),
            "COALESCE(policy, '') = 'shop/o''ps'"
        );
        let rest = Scope {
            windows: Windows::default(),
            governs: Governs::Rest(vec![("shop".into(), "ops".into())]),
        };
        assert_eq!(
            rest.sessions("s"),
            "NOT ((s.namespace = 'shop' AND COALESCE(s.policy, '') = 'ops'))"
        );
        assert_eq!(Scope::all(Windows::default()).decisions(), "1 = 1");
    }

    #[test]
    fn the_audit_flag_keeps_at_least_30_days() {
        assert!(parse_audit_window("7d").is_err());
        assert_eq!(parse_audit_window("0"), Ok(std::time::Duration::ZERO));
        assert!(parse_audit_window("30d").is_ok());
    }
}
