//! The single sign-on phase (docs/sso.md) on the real API server: its JWT authenticator
//! trusts an OpenID provider on 127.0.0.1 (scripted, behind TLS: the API server fetches its
//! discovery and keys and verifies every ID token itself), Kortex signs people in with the
//! same provider (`--oidc-kubernetes token`), and every read and decision they make through
//! Kortex is judged by the API server as them. bob (`oidc:viewers`) reads a Deployment he
//! may not read and gets the API server's refusal from the tool; alice (`oidc:oncall`) reads
//! it; bob cannot approve alice's proposal, alice can, and Kortex restarts the Deployment —
//! over the dashboard's API with the session cookie, no token pasted anywhere. Then the
//! same with Kortex restarted in `--oidc-kubernetes impersonate`, granted
//! config/rbac/sso_impersonate.yaml: the API server judges the impersonated user (and the
//! admission policy sees the groups it adds, `system:authenticated`, in the decision).
//!
//! Runs when `KORTEX_E2E_AUTHN_CONFIG` names the file the API server reads with
//! `--authentication-config` (Kubernetes 1.30+ reloads it): the phase writes its
//! authenticator there (the file is replaced, so give the API server one of its own).
//! Skipped otherwise, saying so.

use super::oidc::Provider;
use super::{Scene, apply, wait_for, wait_phase};
use kortex::crd::{ActionProposal, ProposalPhase};
use kube::api::Api;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// What the phase sets up before Kortex starts: the provider, and Kortex's flags for it.
pub struct Sso {
    provider: Provider,
    /// Kortex's `--oidc-*` flags but the Kubernetes mode.
    args: Vec<String>,
}

impl Sso {
    /// Kortex's flags for the impersonate mode.
    pub fn impersonate_args(&self) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(
            [
                "--oidc-kubernetes",
                "impersonate",
                "--oidc-impersonate-groups",
                "oidc:oncall,oidc:viewers",
                "--oidc-username-prefix",
                "oidc:",
                "--oidc-groups-prefix",
                "oidc:",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        args
    }

    /// Kortex's flags for the token mode (the first Kortex of the run).
    pub fn token_args(&self) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(["--oidc-kubernetes".to_owned(), "token".to_owned()]);
        args
    }
}

/// Starts the provider, has the API server trust it, and gives Kortex's flags; `None` (and
/// why, on stderr) when no authentication config may be written.
pub async fn prepare(admin: &kube::Client, dir: &std::path::Path) -> anyhow::Result<Option<Sso>> {
    let Some(config) = std::env::var_os("KORTEX_E2E_AUTHN_CONFIG").map(PathBuf::from) else {
        eprintln!(
            "skipping the single sign-on phase: set KORTEX_E2E_AUTHN_CONFIG to the API server's --authentication-config file"
        );
        return Ok(None);
    };
    let (provider, ca) = Provider::start_tls().await;
    let indented: String = ca.lines().map(|l| format!("        {l}\n")).collect();
    let authn = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n  - issuer:\n      url: {}\n      audiences: [{}]\n      certificateAuthority: |\n{indented}    claimMappings:\n      username: {{claim: email, prefix: \"oidc:\"}}\n      groups: {{claim: groups, prefix: \"oidc:\"}}\n",
        provider.issuer,
        super::oidc::CLIENT_ID
    );
    std::fs::write(&config, authn)?;
    // The API server reloads the file on its own: wait until it accepts the provider's
    // tokens (the test mints this one only to know when; the sign-ins below are Kortex's).
    let probe = provider.sign("k1", &provider.claims("probe", 600));
    let reviews: Api<k8s_openapi::api::authentication::v1::TokenReview> = Api::all(admin.clone());
    wait_for(
        "the API server to trust the provider (its --authentication-config reloaded)",
        Duration::from_secs(150),
        async || {
            let review = reviews
                .create(
                    &Default::default(),
                    &serde_json::from_value(json!({"spec": {"token": probe}}))?,
                )
                .await?;
            Ok(review.status.and_then(|s| s.authenticated) == Some(true))
        },
    )
    .await?;
    let secret = dir.join("oidc-client-secret");
    std::fs::write(&secret, super::oidc::CLIENT_SECRET)?;
    let ca_file = dir.join("oidc-ca.pem");
    std::fs::write(&ca_file, &ca)?;
    let args = [
        "--oidc-issuer",
        &provider.issuer,
        "--oidc-client-id",
        super::oidc::CLIENT_ID,
        "--oidc-client-secret-file",
        &secret.display().to_string(),
        "--oidc-ca-file",
        &ca_file.display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    Ok(Some(Sso { provider, args }))
}

/// A browser's sign-in at Kortex over HTTP as `email` in `groups`: the session cookies and
/// the CSRF token.
async fn sign_in(
    sso: &Sso,
    base: &str,
    email: &str,
    groups: &[&str],
) -> anyhow::Result<(String, String)> {
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let r = browser
        .get(format!("{base}/auth/v1/oidc/login"))
        .send()
        .await?;
    anyhow::ensure!(r.status().as_u16() == 303, "sign-in start: {}", r.status());
    let header = |r: &reqwest::Response, name: &str| -> Vec<String> {
        r.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect()
    };
    let cookie = |r: &reqwest::Response, name: &str| -> Option<String> {
        header(r, "set-cookie")
            .into_iter()
            .map(|c| c.split(';').next().unwrap_or_default().to_owned())
            .find(|c| c.starts_with(&format!("{name}=")) && c.len() > name.len() + 1)
    };
    let location = reqwest::Url::parse(header(&r, "location").first().map_or("", String::as_str))?;
    let q: HashMap<String, String> = location.query_pairs().into_owned().collect();
    let state_cookie =
        cookie(&r, "kortex_sign_in").ok_or_else(|| anyhow::anyhow!("no state cookie"))?;
    let code = format!("code-{email}");
    let token = sso.provider.sign(
        "k1",
        &sso.provider.claims_for(&q["nonce"], 600, email, groups),
    );
    sso.provider.issue(&code, &q["code_challenge"], &token);
    let r = browser
        .get(format!(
            "{base}/auth/v1/oidc/callback?code={code}&state={}",
            q["state"]
        ))
        .header("cookie", state_cookie)
        .send()
        .await?;
    let session = cookie(&r, "kortex_session").ok_or_else(|| {
        anyhow::anyhow!("{email} was not signed in: {:?}", header(&r, "set-cookie"))
    })?;
    let csrf = cookie(&r, "kortex_csrf").ok_or_else(|| anyhow::anyhow!("no CSRF cookie"))?;
    let token = csrf
        .split_once('=')
        .map(|(_, v)| v.to_owned())
        .unwrap_or_default();
    Ok((format!("{session}; {csrf}"), token))
}

/// A signed-in browser.
struct Person {
    cookies: String,
    csrf: String,
}

impl Person {
    fn request(
        &self,
        http: &reqwest::Client,
        method: reqwest::Method,
        url: String,
    ) -> reqwest::RequestBuilder {
        http.request(method, url)
            .header("cookie", &self.cookies)
            .header("x-csrf-token", &self.csrf)
    }

    /// Creates session `name`, says `content`, and waits for the run (which reads) to end;
    /// the session's JSON then.
    async fn chat(
        &self,
        http: &reqwest::Client,
        base: &str,
        ns: &str,
        name: &str,
        content: &str,
    ) -> anyhow::Result<Value> {
        let id = say_as(self, http, base, ns, name, content).await?;
        let mut last = Value::Null;
        wait_for(
            &format!("{name} to finish"),
            Duration::from_secs(60),
            async || {
                last = self
                    .request(
                        http,
                        reqwest::Method::GET,
                        format!("{base}/chat/v1/sessions/{id}"),
                    )
                    .send()
                    .await?
                    .json()
                    .await?;
                Ok(last["status"] == "idle" && last.to_string().contains("get_resource"))
            },
        )
        .await?;
        Ok(last)
    }
}

pub async fn signed_in_through_the_provider(scene: &Scene<'_>, sso: &Sso) -> anyhow::Result<()> {
    let (admin, ns, base) = (scene.admin, scene.ns, scene.base);
    // Who may do what, in the API server's names for them: both chat (the shipped user
    // role); on call reads and restarts Deployments and approves (the shipped approver
    // role); viewers nothing else.
    let group =
        |g: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g});
    super::bind_roles(
        admin,
        ns,
        vec![
            (
                "sso-user",
                "kortex-user",
                json!([group("oidc:oncall"), group("oidc:viewers")]),
            ),
            (
                "sso-approver",
                "kortex-approver",
                json!([group("oidc:oncall")]),
            ),
            (
                "sso-restart",
                "restart-deployments",
                json!([group("oidc:oncall")]),
            ),
        ],
    )
    .await?;
    // Sessions named sso-* read the cluster as whoever chats (runToolsAsUser).
    apply(
        admin,
        Some(ns),
        &json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "sso", "namespace": ns},
        "spec": {"sessions": ["sso-*"], "provider": "local", "runToolsAsUser": true,
            "proposals": {"allowedActions": ["restart"], "allowedNamespaces": [ns], "execute": true,
                "requireDistinctApprover": false, "approverGroups": ["oidc:oncall"]}}}),
    )
    .await?;
    wait_for(
        "the sso policy to be loaded",
        Duration::from_secs(30),
        async || {
            let policies: Api<kortex::crd::ChatPolicy> = Api::namespaced(admin.clone(), ns);
            let p = policies.get("sso").await?;
            Ok(p.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            }))
        },
    )
    .await?;

    people_act_as_themselves(scene, sso, base, "token", "tok").await
}

/// Kortex (restarted with [`Sso::impersonate_args`]) in `impersonate` mode: its
/// ServiceAccount may impersonate users and exactly the groups of
/// config/rbac/sso_impersonate.yaml; the same people, the same outcomes, the API server
/// judging the impersonated user.
pub async fn impersonated(scene: &Scene<'_>, sso: &Sso) -> anyhow::Result<()> {
    let admin = scene.admin;
    let name = format!("{}-sso-impersonate", scene.ns);
    // config/rbac/sso_impersonate.yaml with this run's groups.
    let mut rules = kortex_e2e::yaml_docs("config/rbac/sso_impersonate.yaml")?[0]["rules"].clone();
    rules[1]["resourceNames"] = json!(["oidc:oncall", "oidc:viewers"]);
    super::grant_kortex(admin, "config/rbac/sso_impersonate.yaml", &name, rules).await?;
    let outcome = people_act_as_themselves(scene, sso, scene.base, "impersonation", "imp").await;
    super::revoke_kortex(admin, &name).await;
    outcome
}

/// bob (`oidc:viewers`) and alice (`oidc:oncall`) sign in at the Kortex at `base` (whose
/// Kubernetes mode is `mode`); bob's read is refused as bob, alice's is not; bob cannot
/// approve alice's proposal, alice can, and it is carried out.
async fn people_act_as_themselves(
    scene: &Scene<'_>,
    sso: &Sso,
    base: &str,
    mode: &str,
    tag: &str,
) -> anyhow::Result<()> {
    let (admin, ns, http) = (scene.admin, scene.ns, scene.http);
    let (cookies, csrf) = sign_in(sso, base, "bob@example.com", &["viewers"]).await?;
    let bob = Person { cookies, csrf };
    let (cookies, csrf) = sign_in(sso, base, "alice@example.com", &["oncall"]).await?;
    let alice = Person { cookies, csrf };
    let me: Value = alice
        .request(http, reqwest::Method::GET, format!("{base}/auth/v1/me"))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(
        me["user"] == "oidc:alice@example.com" && me["kubernetesMode"] == mode,
        "{mode}: alice as the API server knows her: {me}"
    );

    // bob's read of ticker is refused by the API server, as bob; alice's is not.
    let read = bob
        .chat(
            http,
            base,
            ns,
            &format!("sso-{tag}-bob-read"),
            "read ticker",
        )
        .await?;
    let text = read.to_string();
    anyhow::ensure!(
        text.contains("forbidden") && text.contains("oidc:bob@example.com"),
        "bob's read was not refused as bob: {text}"
    );
    let read = alice
        .chat(
            http,
            base,
            ns,
            &format!("sso-{tag}-alice-read"),
            "read ticker",
        )
        .await?;
    let text = read.to_string();
    anyhow::ensure!(
        !text.contains("forbidden") && text.contains("ticker"),
        "alice's read: {text}"
    );

    // alice's chat makes a proposal; bob cannot approve it, alice can.
    let sid = say_as(
        &alice,
        http,
        base,
        ns,
        &format!("sso-{tag}-alice-restart"),
        "ticker is stuck",
    )
    .await?;
    let proposals: Api<ActionProposal> = Api::namespaced(admin.clone(), ns);
    let mut listed = Value::Null;
    let waited = wait_for("alice's proposal", Duration::from_secs(60), async || {
        listed = alice
            .request(
                http,
                reqwest::Method::GET,
                format!("{base}/chat/v1/proposals?phase=Pending"),
            )
            .send()
            .await?
            .json()
            .await?;
        Ok(listed["items"].as_array().is_some_and(|a| {
            a.iter().any(|p| {
                p["spec"]["session"]["name"] == format!("sso-{tag}-alice-restart").as_str()
            })
        }))
    })
    .await;
    if let Err(e) = waited {
        let text = alice
            .request(
                http,
                reqwest::Method::GET,
                format!("{base}/chat/v1/sessions/{sid}"),
            )
            .send()
            .await?
            .text()
            .await?;
        anyhow::bail!("{e}: listed {listed}; the session: {text}");
    }
    let mine = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["spec"]["session"]["name"] == format!("sso-{tag}-alice-restart").as_str())
        .cloned()
        .unwrap_or_default();
    let (id, name) = (
        mine["id"].as_str().unwrap_or_default().to_owned(),
        mine["name"].as_str().unwrap_or_default().to_owned(),
    );
    wait_phase(&proposals, &name, ProposalPhase::Pending).await?;
    let r = bob
        .request(
            http,
            reqwest::Method::POST,
            format!("{base}/chat/v1/proposals/{id}/approve"),
        )
        .json(&json!({"reason": "bob tries"}))
        .send()
        .await?;
    let status = r.status().as_u16();
    let body = r.text().await?;
    anyhow::ensure!(
        status == 403,
        "bob's approval was not refused: {status} {body}"
    );
    let r = alice
        .request(
            http,
            reqwest::Method::POST,
            format!("{base}/chat/v1/proposals/{id}/approve"),
        )
        .json(&json!({"reason": "signed in with the provider"}))
        .send()
        .await?;
    let status = r.status();
    let body = r.text().await?;
    anyhow::ensure!(
        status.is_success(),
        "alice's approval was refused: {status} {body}"
    );
    wait_phase(&proposals, &name, ProposalPhase::Succeeded).await?;
    let decided = proposals.get(&name).await?;
    let decision = decided
        .spec
        .decision
        .ok_or_else(|| anyhow::anyhow!("no decision"))?;
    anyhow::ensure!(decision.by == "oidc:alice@example.com", "{decision:?}");
    eprintln!(
        "single sign-on ({mode}): bob refused by the API server as himself, alice read and approved, ticker restarted"
    );
    Ok(())
}

async fn say_as(
    person: &Person,
    http: &reqwest::Client,
    base: &str,
    ns: &str,
    name: &str,
    content: &str,
) -> anyhow::Result<String> {
    let created: Value = person
        .request(
            http,
            reqwest::Method::POST,
            format!("{base}/chat/v1/sessions"),
        )
        .json(&json!({"name": name, "namespace": ns}))
        .send()
        .await?
        .json()
        .await?;
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(!id.is_empty(), "no session: {created}");
    let r = person
        .request(
            http,
            reqwest::Method::POST,
            format!("{base}/chat/v1/sessions/{id}/messages"),
        )
        .json(&json!({"content": content}))
        .send()
        .await?;
    anyhow::ensure!(
        r.status().as_u16() == 202,
        "message refused: {}",
        r.text().await?
    );
    Ok(id)
}
