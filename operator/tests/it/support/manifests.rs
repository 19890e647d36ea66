//! Manifest folders for `kortex serve`, and the documents tests write into them: each
//! builder gives one YAML document (a `spec` or `stringData` is written as the entries of a
//! flow map, `a: 1, b: {c: 2}`), and [`docs`] joins them into a stream.

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

/// YAML documents joined into one stream.
pub fn docs(docs: &[String]) -> String {
    docs.join("---\n")
}

/// A Kortex object of `kind` named `name` (in the manifests' namespace) with `spec`.
pub fn object(kind: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: kortex.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}}}\nspec: {{{spec}}}\n"
    )
}

/// An `LLMProvider` named `name` with `spec`.
pub fn provider(name: &str, spec: &str) -> String {
    object("LLMProvider", name, spec)
}

/// A `ChatPolicy` named `name` with `spec`.
pub fn policy(name: &str, spec: &str) -> String {
    object("ChatPolicy", name, spec)
}

/// A `KortexTool` named `name` with `spec`.
pub fn tool(name: &str, spec: &str) -> String {
    object("KortexTool", name, spec)
}

/// A Secret named `name` holding `data` (its `stringData`).
pub fn secret(name: &str, data: &str) -> String {
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\nstringData: {{{data}}}\n")
}

/// A chat credential Secret named `name`: `data` holds its `user`, `key` and `groups`.
pub fn chat_key(name: &str, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, labels: {{kortex.dev/credentials: chat}}}}\nstringData: {{{data}}}\n"
    )
}

/// A gateway credential Secret named `name`: `key` calls the gateway as `team`, under the
/// ChatPolicy `policy`.
pub fn gateway_key(name: &str, team: &str, policy: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, labels: {{kortex.dev/credentials: gateway}}, annotations: {{kortex.dev/policy: {policy}}}}}\nstringData: {{team: {team}, key: {key}}}\n"
    )
}
