//! Browser scripts (`tests/browser/*.mjs`): headless Chromium driven by `playwright-core`
//! with node. Skipped when Chromium or the npm package is missing, unless
//! `KORTEX_REQUIRE_BROWSER=1` (the test script sets it after installing them).

use crate::support::server::Server;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Runs `script` (in `tests/browser`) with node and `env` plus `CHROMIUM` and `SCREENSHOTS`,
/// beside this runtime (which keeps serving the mock provider); `None` when Chromium or
/// playwright-core is missing (a failure under `KORTEX_REQUIRE_BROWSER=1`).
pub async fn run_browser(script: &str, env: &[(&str, &str)]) -> Option<std::process::Output> {
    let required = std::env::var("KORTEX_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let modules = browser_dir().join("node_modules/playwright-core");
    let (Some(chromium), true) = (chromium(), modules.exists()) else {
        assert!(
            !required,
            "KORTEX_REQUIRE_BROWSER=1 but Chromium or {} is missing",
            modules.display()
        );
        eprintln!(
            "skipping: Chromium or playwright-core is not installed (scripts/test.sh installs them)"
        );
        return None;
    };
    let mut command = std::process::Command::new("node");
    command
        .arg(browser_dir().join(script))
        .env("CHROMIUM", &chromium)
        .env("SCREENSHOTS", screenshots());
    for (k, v) in env {
        command.env(k, v);
    }
    let run = tokio::task::spawn_blocking(move || command.output());
    Some(
        tokio::time::timeout(Duration::from_secs(150), run)
            .await
            .unwrap_or_else(|_| panic!("the browser test {script} did not finish in 150 s"))
            .unwrap()
            .expect("node"),
    )
}

pub fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots")
}

/// Fails with the script's output and the server's log unless the browser script passed.
pub fn passed(out: &std::process::Output, server: &Server) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "browser test failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- server log\n{}",
        server.log()
    );
    println!("{stdout}");
}

fn chromium() -> Option<String> {
    std::env::var("KORTEX_TEST_CHROMIUM").ok().or_else(|| {
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .map(str::to_owned)
    })
}
