//! Manifest folders for `kortex serve`, and the documents the tests write into them again
//! and again (chat and gateway keys).

use std::path::PathBuf;

/// A new temporary folder with an empty manifest folder `m` in it (what `--manifests`
/// reads; tests put the database beside it, `k.db`).
pub fn manifest_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    (dir, m)
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
    let (dir, m) = manifest_dir();
    let mut all: String = users
        .iter()
        .map(|(user, key, groups)| chat_key_secret(user, key, groups))
        .collect();
    all.push_str(yaml);
    std::fs::write(m.join("all.yaml"), all).unwrap();
    let db = format!("sqlite://{}", dir.path().join("k.db").display());
    (dir, db)
}
