//! Databases for tests: SQLite always, PostgreSQL when configured (each test gets a fresh
//! one, dropped at the end), and rows to put in them.

use kortex::store::{
    DecisionQuery, NewMessage, NewSession, ProposalRecord, Store, UsageEvent, new_id, now_ms,
};

/// Environment variable with an admin URL of a PostgreSQL server for tests; each test gets
/// a fresh database on it.
pub const PG_ENV: &str = "KORTEX_TEST_POSTGRES_URL";

/// A database for one test, removed when dropped (PostgreSQL) or with its temp dir (SQLite).
pub struct TestDb {
    pub store: Store,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    /// PostgreSQL: the admin URL and the database's name, to drop it at the end.
    pg: Option<(String, String)>,
}

impl Drop for TestDb {
    /// Drops a PostgreSQL test database (with `FORCE`: the test's own pool may still hold
    /// connections), on a thread of its own since the test's runtime may be the one that
    /// is dropping it. Without this every run left its databases behind (11 GB here).
    fn drop(&mut self) {
        let Some((admin, name)) = self.pg.take() else {
            return;
        };
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let pool = sqlx::AnyPool::connect(&admin)
                    .await
                    .map_err(|e| e.to_string())?;
                let done = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&pool)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
                pool.close().await;
                done
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop the test database: {e}");
        }
    }
}

pub async fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("kortex.db").display());
    let store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    TestDb {
        store,
        url,
        _dir: Some(dir),
        pg: None,
    }
}

/// A fresh PostgreSQL database, or `None` when no server is configured. With
/// `KORTEX_REQUIRE_POSTGRES=1` (the test script sets it) a missing server fails the test
/// instead of skipping it.
pub async fn postgres() -> Option<TestDb> {
    let Ok(admin) = std::env::var(PG_ENV) else {
        assert!(
            std::env::var("KORTEX_REQUIRE_POSTGRES").is_err(),
            "KORTEX_REQUIRE_POSTGRES is set but {PG_ENV} is not"
        );
        eprintln!("skipping PostgreSQL half: {PG_ENV} is not set");
        return None;
    };
    let name = format!("kortex_test_{}", uuid_like());
    sqlx::any::install_default_drivers();
    let admin_pool = sqlx::AnyPool::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("connect {PG_ENV}: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin_pool)
        .await
        .expect("create database");
    admin_pool.close().await;
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    let url = format!("{base}/{name}");
    let store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some(TestDb {
        store,
        url,
        _dir: None,
        pg: Some((admin, name)),
    })
}

/// Both databases (PostgreSQL only when configured).
pub async fn all_dbs() -> Vec<TestDb> {
    let mut dbs = vec![sqlite().await];
    dbs.extend(postgres().await);
    dbs
}

fn uuid_like() -> String {
    kortex::store::new_id().replace('-', "")
}

/// A restart proposal `name` of `user` (from `session`, if any) in namespace `default`, in
/// `phase`, expiring in 10 minutes.
pub fn proposal(session: Option<&str>, user: &str, name: &str, phase: &str) -> ProposalRecord {
    let now = now_ms();
    ProposalRecord {
        id: new_id(),
        name: name.into(),
        namespace: "default".into(),
        session_id: session.map(str::to_owned),
        session_name: "incident".into(),
        user: user.into(),
        policy: None,
        action: "restart".into(),
        target: None,
        params: None,
        rationale: "stuck".into(),
        blast_radius: None,
        reversible: Some(true),
        provider: None,
        model: None,
        phase: kortex::crd::ProposalPhase::parse(phase)
            .unwrap_or_else(|| panic!("{phase} is not a proposal phase")),
        decision: None,
        message: None,
        preview: None,
        undo: None,
        git: None,
        expires_at: now + 600_000,
        created_at: now,
        updated_at: now,
        version: 1,
    }
}

/// A session `name` of `user` in namespace `default`, under no policy, without dynamic tools.
pub fn new_session(user: &str, name: impl Into<String>) -> NewSession {
    NewSession {
        name: name.into(),
        namespace: "default".into(),
        user: user.into(),
        policy: None,
        dynamic_tools: serde_json::json!([]),
    }
}

/// A message of `role` (`user`, `assistant`, `tool`) saying `content`.
pub fn message(role: &str, content: impl Into<String>) -> NewMessage {
    NewMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    }
}

/// A chat call of `user` under `policy` at `at` (Unix ms) that cost `cost` (USD): 100 tokens
/// in, 10 out, to provider `model`'s `m1`.
pub fn usage(user: &str, policy: &str, at: i64, cost: f64) -> UsageEvent {
    UsageEvent {
        at,
        source: "chat".into(),
        policy: policy.into(),
        session_id: None,
        user: user.into(),
        provider: "model".into(),
        model: "m1".into(),
        input_tokens: 100,
        output_tokens: 10,
        cost_usd: cost,
        latency_ms: 5,
        outcome: "ok".into(),
        estimated: false,
    }
}

/// The audit rows of `kind` (all kinds: `None`), at most `limit`, newest first.
pub fn audit_query(kind: Option<&str>, limit: i64) -> DecisionQuery {
    DecisionQuery {
        kind: kind.map(str::to_owned),
        limit,
        ..Default::default()
    }
}
