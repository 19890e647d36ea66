//! `kortex login` and `kortex logout` (docs/sso.md#the-cli): the browser signs in at the
//! company's provider through the server, which hands this process a one-time code on a
//! loopback port (as kubelogin does); the code and this process's PKCE verifier buy the
//! session's bearer token, kept in the user's config (0600). `kortex chat`, `proposals`,
//! `usage`, `erase-user` and `mcp` use it when no `--key` is given. The server keeps the
//! provider's tokens and refreshes them: the stored token lasts as long as the session.

use clap::Args;
use serde_json::{Value, json};
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `kortex login` options.
#[derive(Args, Debug)]
pub struct LoginArgs {
    /// Kortex server URL.
    #[arg(long, env = "KORTEX_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Print the sign-in URL only; do not try to open a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// How long to wait for the browser, e.g. `5m`.
    #[arg(long, default_value = "5m", value_parser = super::parse_duration)]
    pub timeout: std::time::Duration,
}

/// `kortex logout` options.
#[derive(Args, Debug)]
pub struct LogoutArgs {
    /// Kortex server URL.
    #[arg(long, env = "KORTEX_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
}

/// The file holding the tokens of `kortex login`: `$KORTEX_CONFIG`, else
/// `$XDG_CONFIG_HOME/kortex/credentials.json`, else `~/.config/kortex/credentials.json`.
pub fn credentials_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KORTEX_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("kortex/credentials.json"))
}

fn server_key(server: &str) -> String {
    server.trim_end_matches('/').to_owned()
}

fn read_all() -> Value {
    credentials_path()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({"servers": {}}))
}

/// The token `kortex login` stored for `server`, if any.
pub fn stored_token(server: &str) -> Option<String> {
    read_all()["servers"][server_key(server)]["token"]
        .as_str()
        .map(str::to_owned)
}

/// Writes the credentials file readable by its owner alone (0600, its folder 0700).
fn write_all(v: &Value) -> Result<PathBuf, String> {
    let path = credentials_path()
        .ok_or("no HOME, XDG_CONFIG_HOME or KORTEX_CONFIG to keep the token in")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
    }
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    let tmp = path.with_extension("tmp");
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::io::Write::write_all(&mut f, text.as_bytes())
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Reads one request on the loopback port: its query's `code` or `error`, answering the
/// browser with a page that says what happened.
async fn one_callback(
    listener: &tokio::net::TcpListener,
) -> Result<Result<String, String>, String> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("the loopback listener failed: {e}"))?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < buf.len() {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&got);
        let target = head
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
            .to_owned();
        let Some(query) = target.strip_prefix("/callback?") else {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        };
        let pairs: std::collections::HashMap<String, String> =
            url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
        let outcome = match (pairs.get("code"), pairs.get("error")) {
            (_, Some(e)) => Err(e.clone()),
            (Some(c), None) => Ok(c.clone()),
            (None, None) => Err("the server sent no code".to_owned()),
        };
        let text = match &outcome {
            Ok(_) => {
                "Signed in to Kortex. You can close this tab and return to the terminal.".to_owned()
            }
            Err(e) => format!("Kortex could not sign you in: {e}"),
        };
        let page = format!(
            "<!doctype html><meta charset=utf-8><title>Kortex</title><p>{}</p>",
            text.replace('&', "&amp;").replace('<', "&lt;")
        );
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{page}",
            page.len()
        );
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
        return Ok(outcome);
    }
}

/// `kortex login`.
pub async fn login(args: LoginArgs) -> Result<(), String> {
    let server = server_key(&args.server);
    let verifier = crate::oidc::seal::random_token() + &crate::oidc::seal::random_token();
    let challenge = crate::oidc::provider::pkce_challenge(&verifier);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot listen on a loopback port: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let url = format!("{server}/auth/v1/oidc/login?cli_port={port}&cli_challenge={challenge}");
    println!("Open this URL in a browser to sign in:\n\n    {url}\n");
    std::io::Write::flush(&mut std::io::stdout()).ok();
    if !args.no_browser {
        for opener in ["xdg-open", "open"] {
            if std::process::Command::new(opener)
                .arg(&url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .is_ok()
            {
                break;
            }
        }
    }
    let code = tokio::time::timeout(args.timeout, one_callback(&listener))
        .await
        .map_err(|_| format!("no sign-in within {:?}", args.timeout))??
        .map_err(|e| format!("sign-in failed: {e}"))?;
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{server}/auth/v1/oidc/token"))
        .json(&json!({"code": code, "verifier": verifier}))
        .send()
        .await
        .map_err(|e| format!("cannot reach {server}: {e}"))?;
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!(
            "{server} refused the sign-in: {}",
            body["error"]["message"].as_str().unwrap_or("no details")
        ));
    }
    let token = body["token"].as_str().ok_or("the server sent no token")?;
    let mut all = read_all();
    all["servers"][&server] = json!({
        "token": token,
        "user": body["user"],
        "expiresAt": body["expiresAt"],
    });
    let path = write_all(&all)?;
    let groups: Vec<&str> = body["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    println!(
        "Signed in to {server} as {}{} (token kept in {}).",
        body["user"].as_str().unwrap_or("?"),
        if groups.is_empty() {
            String::new()
        } else {
            format!(" ({})", groups.join(", "))
        },
        path.display()
    );
    Ok(())
}

/// `kortex logout`: ends the session on the server and forgets the token.
pub async fn logout(args: LogoutArgs) -> Result<(), String> {
    let server = server_key(&args.server);
    let Some(token) = stored_token(&server) else {
        println!("Not signed in to {server}.");
        return Ok(());
    };
    let ended = reqwest::Client::new()
        .post(format!("{server}/auth/v1/logout"))
        .bearer_auth(&token)
        .send()
        .await;
    let mut all = read_all();
    if let Some(servers) = all["servers"].as_object_mut() {
        servers.remove(&server);
    }
    write_all(&all)?;
    match ended {
        Ok(_) => println!("Signed out of {server}."),
        Err(e) => println!("Forgot the token of {server} (the server could not be told: {e})."),
    }
    Ok(())
}
