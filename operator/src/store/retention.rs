//! Retention: what is kept how long (`docs/storage.md#retention`). Each pass deletes in
//! batches of at most [`BATCH`] rows per statement, so a chat run writing meanwhile waits for
//! one short statement at most, and records what it deleted as an audit row (`kind:
//! deletion`, `outcome: retention`, counts per table).
//!
//! Never deleted by retention: anything of a session with a run in progress (running,
//! pausing, paused, waiting for client results or for its plan), and a session with a
//! proposal still `Pending` or `Executing`.

use super::{Store, StoreError};
use serde_json::json;

/// Rows per statement.
pub const BATCH: i64 = 1000;

/// How long things are kept, in milliseconds (0: kept forever).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// A session not updated for this long goes, with all it holds.
    pub sessions_ms: i64,
    /// The events of a failed or cancelled run that ended this long ago.
    pub failed_runs_ms: i64,
    /// Stored large tool results (read with `read_result_chunk`).
    pub tool_results_ms: i64,
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
}

impl Pruned {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        self.sessions += other.sessions;
        self.messages += other.messages;
        self.events += other.events;
        self.runs += other.runs;
        self.tool_results += other.tool_results;
        self.mcp_sessions += other.mcp_sessions;
    }

    /// Whether nothing was deleted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Sessions retention must leave alone: a run in progress, or a proposal still open.
const IN_USE: &str = "(SELECT session_id FROM chat_runs WHERE finished_at IS NULL \
     UNION SELECT session_id FROM proposals WHERE phase IN ('Pending', 'Executing') AND session_id IS NOT NULL)";

/// Sessions with a run whose task is writing (a deleted session's parked run — paused,
/// waiting for client results or a plan — goes with it).
const LIVE: &str =
    "(SELECT session_id FROM chat_runs WHERE status IN ('running', 'pausing', 'cancelling'))";

impl Store {
    /// Deletes `sql` (which must bind the cutoff as `$1` and the batch as `$2`) batch by
    /// batch until nothing is left; how many rows.
    async fn delete_batched(&self, sql: &str, cutoff: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
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
        }
    }

    /// Deletes the sessions `ids` selects (SQL binding a cutoff as `$1`) with everything
    /// they hold: their rows first, in batches, the session rows last (nothing left to
    /// cascade), so no statement deletes more than a batch.
    async fn delete_sessions(
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
            self.record_decision(&super::NewDecision {
                kind: "deletion".into(),
                subject: "deleted sessions".into(),
                outcome: "session_deleted".into(),
                detail: json!({"deleted": p}),
                ..Default::default()
            })
            .await?;
        }
        Ok(p)
    }

    /// One retention pass as of `now` (Unix ms): deletes what the windows no longer keep
    /// and records it.
    pub async fn prune(&self, now: i64, w: &Windows) -> Result<Pruned, StoreError> {
        let mut p = Pruned::default();
        if w.failed_runs_ms > 0 {
            p.events += self
                .delete_batched(
                    "DELETE FROM run_events WHERE (session_id, seq) IN (\
                       SELECT e.session_id, e.seq FROM run_events e JOIN chat_runs r ON r.id = e.run_id \
                       WHERE r.status IN ('failed', 'cancelled') AND r.finished_at < $1 LIMIT $2)",
                    now - w.failed_runs_ms,
                )
                .await?;
        }
        if w.tool_results_ms > 0 {
            p.tool_results += self
                .delete_batched(
                    &format!(
                        "DELETE FROM tool_results WHERE id IN (SELECT id FROM tool_results \
                         WHERE created_at < $1 AND session_id NOT IN {IN_USE} LIMIT $2)"
                    ),
                    now - w.tool_results_ms,
                )
                .await?;
        }
        if w.sessions_ms > 0 {
            let idle = format!(
                "SELECT id FROM chat_sessions WHERE updated_at < $1 AND id NOT IN {IN_USE}"
            );
            self.delete_sessions(&idle, now - w.sessions_ms, &mut p)
                .await?;
            p.mcp_sessions += self
                .delete_batched(
                    "DELETE FROM mcp_sessions WHERE id IN (SELECT id FROM mcp_sessions \
                     WHERE used_at < $1 LIMIT $2)",
                    now - w.sessions_ms,
                )
                .await?;
        }
        if !p.is_empty() {
            self.record_decision(&super::NewDecision {
                kind: "deletion".into(),
                subject: "retention".into(),
                outcome: "retention".into(),
                detail: json!({"deleted": p, "windowsMs": {
                    "sessions": w.sessions_ms,
                    "failedRuns": w.failed_runs_ms,
                    "toolResults": w.tool_results_ms,
                }}),
                ..Default::default()
            })
            .await?;
        }
        Ok(p)
    }
}

/// Retention's flags of `kortex serve` and `kortex run` (`docs/storage.md#retention`).
#[derive(clap::Args, Debug, Clone)]
pub struct RetentionArgs {
    /// How long a session nobody has used is kept, with all it holds (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_SESSIONS", default_value = "90d", value_parser = parse_window)]
    pub retention_sessions: std::time::Duration,
    /// How long the events of a failed or cancelled run are kept (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_FAILED_RUNS", default_value = "30d", value_parser = parse_window)]
    pub retention_failed_runs: std::time::Duration,
    /// How long stored large tool results are kept (`0`: forever).
    #[arg(long, env = "KORTEX_RETENTION_TOOL_RESULTS", default_value = "7d", value_parser = parse_window)]
    pub retention_tool_results: std::time::Duration,
}

impl RetentionArgs {
    /// The windows in milliseconds.
    pub fn windows(&self) -> Windows {
        let ms = |d: std::time::Duration| d.as_millis().min(i64::MAX as u128) as i64;
        Windows {
            sessions_ms: ms(self.retention_sessions),
            failed_runs_ms: ms(self.retention_failed_runs),
            tool_results_ms: ms(self.retention_tool_results),
        }
    }
}

/// `90d`, `12h`, `30m` or `0` (forever).
pub fn parse_window(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a window like 90d, 12h or 30m (0: forever)"))?;
    let secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(format!("{s:?}: the unit is d, h, m or s (e.g. 90d)")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        assert_eq!(
            parse_window("90d"),
            Ok(std::time::Duration::from_secs(90 * 86_400))
        );
        assert_eq!(
            parse_window("12h"),
            Ok(std::time::Duration::from_secs(12 * 3_600))
        );
        assert_eq!(parse_window("0"), Ok(std::time::Duration::ZERO));
        assert!(parse_window("soon").is_err());
        assert!(parse_window("3w").is_err());
    }
}
