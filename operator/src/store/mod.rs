//! Storage: one schema for PostgreSQL and SQLite (sqlx's `Any` driver), the migrations in
//! `migrations/` embedded in the binary, and one [`Store`] whose methods are grouped by
//! what they keep, a file each (`runs.rs`, `proposals.rs`, `usage.rs`, `audit.rs`, …), with
//! the rows in `models.rs`. Also the arithmetic over stored numbers that several rooms
//! report (`usage_total`, `wilson`). Imports only `crd` and `telemetry`.
//!
//! Portable SQL only: `$N` placeholders (SQLite accepts them too), integer Unix-millisecond
//! timestamps, JSON as TEXT, `INSERT ... ON CONFLICT`, `UPDATE ... RETURNING`.

/// What adding a row to `usage_daily` does when its day, policy, provider, model and user
/// already have one: the counts add up (recording usage, and erasure merging a user's rows
/// into their pseudonym's).
macro_rules! usage_daily_add {
    () => {
        " ON CONFLICT (day, policy, provider, model, user_name) DO UPDATE SET \
           requests = usage_daily.requests + excluded.requests, \
           input_tokens = usage_daily.input_tokens + excluded.input_tokens, \
           output_tokens = usage_daily.output_tokens + excluded.output_tokens, \
           cost_usd = usage_daily.cost_usd + excluded.cost_usd, \
           estimated_requests = usage_daily.estimated_requests + excluded.estimated_requests"
    };
}

/// Reads a row into a struct: each field from the column of its name, from the column named
/// after `as` (`user as "user_name"`), or as the expression after `=` (`detail =
/// json_col(row, "detail")?`). Meant inside a function returning `Result<_, StoreError>`.
macro_rules! from_row {
    ($row:ident => $ty:ident { $($field:ident $(as $col:literal)? $(= $val:expr)?),* $(,)? }) => {
        $ty { $($field: from_row!(@col $row, $field $(as $col)? $(= $val)?)),* }
    };
    (@col $row:ident, $field:ident) => {
        $row.try_get(stringify!($field))?
    };
    (@col $row:ident, $field:ident as $col:literal) => {
        $row.try_get($col)?
    };
    (@col $row:ident, $field:ident = $val:expr) => {
        $val
    };
}

/// A statement with its arguments bound so far.
type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

mod audit;
mod auth;
mod budget;
pub mod erasure;
mod evals;
mod mcp;
mod models;
mod notify;
mod proposals;
mod repo;
pub mod retention;
mod runs;
mod sharing;
mod triggers;
mod usage;

pub use auth::AuthSession;
pub use evals::{EvalRun, SessionUsage, wilson};
pub use mcp::MCP_ORIGIN;
pub use notify::{Delivery, NotifyEventRecord};
pub use runs::{PlanRecord, RunRecord, RunState};
pub use sharing::{Access, Handover, Share};
pub use triggers::{FinishedTriggerRun, NewTriggerEvent, RunDigest, TriggerEvent, TriggerGroup};
pub use usage::usage_total;

pub use budget::{BudgetHold, BudgetRefused, BudgetSettle, LeaseAsk, LeaseDraw, LeaseKey};
pub use models::*;
pub use repo::utc_day;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Executor, SqlSafeStr};
use std::borrow::Cow;
use std::time::Duration;

/// The migrations, in order: `(version, description, sql)`. A test checks this list
/// against the files in `migrations/`.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../../../migrations/0001_init.sql")),
    (
        2,
        "tool_results",
        include_str!("../../../migrations/0002_tool_results.sql"),
    ),
    (
        3,
        "budgets",
        include_str!("../../../migrations/0003_budgets.sql"),
    ),
    (
        4,
        "estimated_usage",
        include_str!("../../../migrations/0004_estimated_usage.sql"),
    ),
    (
        5,
        "runs_per_policy",
        include_str!("../../../migrations/0005_runs_per_policy.sql"),
    ),
    (6, "mcp", include_str!("../../../migrations/0006_mcp.sql")),
    (
        7,
        "run_control",
        include_str!("../../../migrations/0007_run_control.sql"),
    ),
    (
        8,
        "notifications",
        include_str!("../../../migrations/0008_notifications.sql"),
    ),
    (
        9,
        "sharing",
        include_str!("../../../migrations/0009_sharing.sql"),
    ),
    (
        10,
        "handover",
        include_str!("../../../migrations/0010_handover.sql"),
    ),
    (
        11,
        "traces",
        include_str!("../../../migrations/0011_traces.sql"),
    ),
    (
        12,
        "message_model",
        include_str!("../../../migrations/0012_message_model.sql"),
    ),
    (
        13,
        "evals",
        include_str!("../../../migrations/0013_evals.sql"),
    ),
    (
        14,
        "responses",
        include_str!("../../../migrations/0014_responses.sql"),
    ),
    (
        15,
        "triggers",
        include_str!("../../../migrations/0015_triggers.sql"),
    ),
    (
        16,
        "proposal_git",
        include_str!("../../../migrations/0016_proposal_git.sql"),
    ),
    (
        17,
        "sign_in",
        include_str!("../../../migrations/0017_sign_in.sql"),
    ),
    (
        18,
        "slack_events",
        include_str!("../../../migrations/0018_slack_events.sql"),
    ),
    (
        19,
        "slack_threads",
        include_str!("../../../migrations/0019_slack_threads.sql"),
    ),
];

/// Which database is behind the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite (standalone mode, single replica).
    Sqlite,
    /// PostgreSQL (production, any number of replicas).
    Postgres,
}

/// What went wrong talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is not `sqlite:` or `postgres:`.
    #[error("unsupported database URL {0}: use sqlite://FILE or postgres://USER@HOST/DB")]
    UnsupportedUrl(String),
    /// Connecting failed.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL with any password removed.
        url: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("database query failed: {0}")]
    Query(#[from] sqlx::Error),
    /// A stored JSON column could not be read.
    #[error("stored JSON in {column} is invalid: {source}")]
    Json {
        /// Which column.
        column: &'static str,
        /// Parser error.
        source: serde_json::Error,
    },
    /// A conditional update lost a race or found the row in another state.
    #[error("{0}")]
    Conflict(String),
}

impl StoreError {
    /// Whether the statement never reached the database (no connection could be had), so
    /// running it again cannot do it twice. A connection that breaks mid-statement is not
    /// this: the write may have been committed.
    pub fn is_not_sent(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. } | Self::Query(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
        )
    }

    /// Whether the database's disk is full (SQLite `SQLITE_FULL`, PostgreSQL `53100`, or
    /// `ENOSPC`): nothing was written, and retrying is useless until space is freed.
    pub fn is_full(&self) -> bool {
        let Self::Query(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Database(d) => d
                .code()
                .is_some_and(|c| c == "53100" || c.parse::<i64>().is_ok_and(|n| n & 0xff == 13)),
            sqlx::Error::Io(io) => io.raw_os_error() == Some(28),
            _ => false,
        }
    }

    /// Whether the database could not be reached (down, restarting, the pool exhausted),
    /// rather than the query being wrong: worth a retry in a moment.
    pub fn is_unavailable(&self) -> bool {
        let e = match self {
            Self::Connect { .. } => return true,
            Self::Query(e) => e,
            _ => return false,
        };
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_) => true,
            // PostgreSQL: connection exceptions (08…) and operator intervention (57P…,
            // e.g. an administrator shutdown).
            sqlx::Error::Database(d) => d
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
            _ => false,
        }
    }
}

/// How long a run waits for an unreachable database before it gives a write up: shorter
/// than [`crate::chat::STALE_AFTER`], so a run either goes on or ends itself before another
/// replica takes it for dead.
pub const WRITE_PATIENCE: Duration = Duration::from_secs(45);

/// Runs `op` again while no connection to the database can be had
/// ([`StoreError::is_not_sent`]: never a statement that may have run), with
/// backoff (250 ms doubling to 5 s; each try itself waits up to the pool's 5 s), for at
/// most [`WRITE_PATIENCE`]. For the writes of a run, which no client is waiting on and
/// which must not be lost to a database restart; requests answer 503 at once instead.
pub async fn patiently<T, F, Fut>(what: &str, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + WRITE_PATIENCE;
    let mut wait = Duration::from_millis(250);
    let mut warned = false;
    loop {
        match op().await {
            Err(e) if e.is_not_sent() && tokio::time::Instant::now() + wait < deadline => {
                if !warned {
                    tracing::warn!(what, error = %e, "the database is unavailable; retrying for up to {}s", WRITE_PATIENCE.as_secs());
                    warned = true;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Ok(v) => {
                if warned {
                    tracing::info!(what, "the database is back; the write went through");
                }
                return Ok(v);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The database, shared by every part of the server.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

/// `url` with the password (if any) replaced, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((creds, host)) => {
            let user = creds.split(':').next().unwrap_or_default();
            if creds.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else {
                url.to_owned()
            }
        }
        None => url.to_owned(),
    }
}

impl Store {
    /// `f` in a database client span (`db.query.summary`: what the operation does to which
    /// tables, never its SQL text or values), when traces are on.
    pub(crate) fn traced<F: std::future::Future>(
        &self,
        summary: &'static str,
        f: F,
    ) -> tracing::instrument::Instrumented<F> {
        let system = match self.backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgresql",
        };
        tracing::Instrument::instrument(f, crate::telemetry::trace::db_span(system, summary))
    }

    /// Connects to `url` (`sqlite://kortex.db`, created if missing, or `postgres://...`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if url.starts_with("sqlite:") {
            let url = if url.contains("mode=") || url.contains(":memory:") {
                url.to_owned()
            } else if url.contains('?') {
                format!("{url}&mode=rwc")
            } else {
                format!("{url}?mode=rwc")
            };
            (Backend::Sqlite, url)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            (Backend::Postgres, url.to_owned())
        } else {
            return Err(StoreError::UnsupportedUrl(redact_url(url)));
        };
        // A database that is down is said within 5 s (503 `database_unavailable`), not after a
        // long wait.
        let mut options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(5));
        options = match backend {
            // One writer at a time anyway; a few connections let reads proceed under WAL.
            Backend::Sqlite => options.max_connections(4).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                    conn.execute("PRAGMA foreign_keys = ON").await?;
                    conn.execute("PRAGMA busy_timeout = 5000").await?;
                    Ok(())
                })
            }),
            Backend::Postgres => options.max_connections(16),
        };
        let pool = options
            .connect(&url)
            .await
            .map_err(|source| StoreError::Connect {
                url: redact_url(&url),
                source,
            })?;
        Ok(Self { pool, backend })
    }

    /// Applies pending migrations (idempotent; safe to run from several replicas at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrations: Vec<Migration> = MIGRATIONS
            .iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    Cow::Borrowed(*description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect();
        let migrator = Migrator {
            migrations: Cow::Owned(migrations),
            ..Migrator::DEFAULT
        };
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// A write transaction. On SQLite it takes the write lock at once (`BEGIN IMMEDIATE`):
    /// a deferred one that reads first and then writes cannot wait for another writer (the
    /// busy timeout does not apply to that upgrade) and failed with "database is locked"
    /// (codes 5 and 517) under concurrent runs — found by the soak benchmark.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// A new time-ordered id (UUID v7).
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_migrations_match_the_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<String> = MIGRATIONS
            .iter()
            .map(|(v, d, _)| format!("{v:04}_{d}.sql"))
            .collect();
        assert_eq!(
            files, embedded,
            "add new files in migrations/ to store::MIGRATIONS"
        );
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://kortex:hunter2@db:5432/kortex"),
            "postgres://kortex:***@db:5432/kortex"
        );
        assert_eq!(
            redact_url("postgres://kortex@db/kortex"),
            "postgres://kortex@db/kortex"
        );
        assert_eq!(redact_url("sqlite://kortex.db"), "sqlite://kortex.db");
    }
}
