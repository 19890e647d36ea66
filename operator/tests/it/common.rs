//! Shared test helpers: databases (SQLite always, PostgreSQL when configured).

use kortex::store::Store;

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
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}", dir.path().join("kortex.db").display());
    let store = Store::connect(&url).await.unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
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
        .unwrap_or_else(|e| panic!("create database: {e}"));
    admin_pool.close().await;
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    let url = format!("{base}/{name}");
    let store = Store::connect(&url).await.unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
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

/// Serves `app` on a free port of 127.0.0.1 until the test ends; its `http://` URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// An HTTP client (with the one TLS crypto provider Kortex uses installed).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// Polls `probe` every 100 ms until it gives `Ok`, and returns that; after 30 s fails the
/// test with `what` and the last `Err` (the state it saw).
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last seen: {last}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A ChatPolicy for namespace `default` matching every session, with `tools` rules
/// (`json!({})`: every tool allowed).
pub fn tool_policy(tools: serde_json::Value) -> kortex::catalog::PolicyEntry {
    kortex::catalog::PolicyEntry {
        object: serde_json::from_value(
            serde_json::json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"sessions": ["*"], "provider": "x", "tools": tools}}),
        )
        .unwrap_or_else(|e| panic!("{e}")),
        available: true,
        notify: Vec::new(),
        triggers: Vec::new(),
    }
}

/// What a tool gets when session `name` of user `u` in namespace `default` calls it.
pub async fn tool_context(store: &Store, name: &str) -> kortex::tools::ToolContext {
    let session = store
        .create_session(&kortex::store::NewSession {
            name: name.into(),
            namespace: "default".into(),
            user: "u".into(),
            policy: None,
            dynamic_tools: serde_json::json!([]),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kortex::tools::ToolContext {
        store: store.clone(),
        session,
        run_id: "run-1".into(),
        redactor: Default::default(),
        kube: Default::default(),
        guides: std::sync::Arc::from(Vec::new()),
        via: "chat",
    }
}

/// A chat credential Secret of `kortex serve`'s manifests (a YAML document and its `---`):
/// `key` signs in as `user`, member of the comma-separated `groups`.
pub fn chat_key_secret(user: &str, key: &str, groups: &str) -> String {
    let name: String = user
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: chat-{name}\n  labels: {{kortex.dev/credentials: chat}}\nstringData: {{user: {user}, key: \"{key}\", groups: \"{groups}\"}}\n---\n"
    )
}

/// A manifest folder (`<dir>/m`) holding a chat key for each `(user, key, groups)` and then
/// `yaml`, and the URL of a SQLite database beside it: what a key-mode server starts from.
pub fn keyed_manifests(users: &[(&str, &str, &str)], yaml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap_or_else(|e| panic!("{e}"));
    let mut all: String = users
        .iter()
        .map(|(user, key, groups)| chat_key_secret(user, key, groups))
        .collect();
    all.push_str(yaml);
    std::fs::write(m.join("all.yaml"), all).unwrap_or_else(|e| panic!("{e}"));
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    (dir, db)
}
