//! A fake Kubernetes API server on 127.0.0.1 that speaks the real wire protocol the kube
//! client uses: lists, metadata-only lists (`PartialObjectMetadata`), streaming watches,
//! gets, creates, conditional replaces (409 on a stale resourceVersion), server-side-apply
//! status patches and Events. Every request is recorded, so the tests assert the exact
//! writes the operator makes. Also the objects the operator tests plant in it, and
//! kubeconfigs pointing at it.

use crate::support::net::serve;
use crate::support::yaml::root;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// One request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub accept: String,
    /// The bearer token sent.
    pub token: String,
    /// `Impersonate-User` and every `Impersonate-Group`, when Kortex impersonated.
    pub impersonate: Option<(String, Vec<String>)>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    /// Objects with their plural (`llmproviders`, `secrets`, `leases`, …).
    objects: Vec<(String, Value)>,
    version: u64,
    seen: Vec<Seen>,
    /// Users a SubjectAccessReview allows.
    allowed: Vec<String>,
    /// Paths whose writes (PATCH, not dry-run) never answer.
    hung: Vec<String>,
    /// How long each answer takes (a slow API server, or one far away).
    latency: Duration,
    /// Paths whose reads answer 500.
    failing: Vec<String>,
    /// Every watch event sent, so that a watch resumed from a `resourceVersion` gets what
    /// it missed, as from a real API server's watch cache.
    history: Vec<(String, Value)>,
}

/// The claims of a JWT-shaped token (not verified).
fn jwt_claims(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_, Some(claims), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    serde_json::from_slice(&kortex::oidc::jwt::base64url(claims)?).ok()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// The fake API server.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<(String, Value)>,
    /// `true` while the API server is "down": every request gets 503 and open watches end.
    outage: Arc<tokio::sync::watch::Sender<bool>>,
    pub url: String,
}

/// An API path: plural, namespace, name, subresource.
type ApiPath = (String, Option<String>, Option<String>, Option<String>);

/// The parts of an API path.
fn parse(path: &str) -> Option<ApiPath> {
    let rest = path.strip_prefix("/api/v1/").or_else(|| {
        let p = path.strip_prefix("/apis/")?;
        let mut parts = p.splitn(3, '/');
        parts.next()?;
        parts.next()?;
        parts.next()
    })?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        ["namespaces", ns, plural, tail @ ..] => Some((
            (*plural).to_owned(),
            Some((*ns).to_owned()),
            tail.first().map(|s| (*s).to_owned()),
            tail.get(1).map(|s| (*s).to_owned()),
        )),
        [plural] => Some(((*plural).to_owned(), None, None, None)),
        _ => None,
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "message": message, "code": code}),
        ),
    )
        .into_response()
}

fn metadata_only(o: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]})
}

fn matches_selector(o: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let labels = &o["metadata"]["labels"];
        match term.split_once('=') {
            Some((k, v)) => labels[k] == v,
            None => !labels[term].is_null(),
        }
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        kv.strip_prefix(&format!("{key}=")).map(|v| {
            v.replace("%2F", "/")
                .replace("%3D", "=")
                .replace("%2C", ",")
        })
    })
}

impl FakeApi {
    /// Starts one (and installs the TLS crypto provider its clients need).
    pub async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (events, _) = broadcast::channel(1024);
        let mut fake = Self {
            state: Arc::default(),
            events,
            outage: Arc::new(tokio::sync::watch::channel(false).0),
            url: String::new(),
        };
        let handler = fake.clone();
        let app = axum::Router::new().fallback(move |req: Request<Body>| {
            let fake = handler.clone();
            async move { fake.handle(req).await }
        });
        let url = serve(app).await;
        fake.url = url;
        // As in a real install: the shipped admission policy, trusting the identity Kortex
        // runs as here (the token of `write_kubeconfig`), bound everywhere. Without it the
        // leader executes nothing.
        let (policy, binding) = admission_policy("not-a-real");
        fake.apply("validatingadmissionpolicies", policy);
        fake.apply("validatingadmissionpolicybindings", binding);
        fake
    }

    /// Removes an object (as `kubectl delete` would), announcing it to watches.
    pub fn remove(&self, plural: &str, namespace: Option<&str>, name: &str) {
        let mut st = self.lock();
        let Some(i) = st.objects.iter().position(|(p, o)| {
            p == plural
                && o["metadata"]["namespace"].as_str() == namespace
                && o["metadata"]["name"] == name
        }) else {
            return;
        };
        let (_, mut object) = st.objects.remove(i);
        st.version += 1;
        object["metadata"]["resourceVersion"] = json!(st.version.to_string());
        let event = (
            plural.to_owned(),
            json!({"type": "DELETED", "object": object}),
        );
        st.history.push(event.clone());
        drop(st);
        let _ = self.events.send(event);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces an object (as `kubectl apply` would), announcing it to watches.
    pub fn apply(&self, plural: &str, mut object: Value) {
        let mut st = self.lock();
        st.version += 1;
        let version = st.version.to_string();
        object["metadata"]["resourceVersion"] = json!(version);
        let key = |o: &Value| {
            (
                o["metadata"]["namespace"].clone(),
                o["metadata"]["name"].clone(),
            )
        };
        let existing = st
            .objects
            .iter()
            .position(|(p, o)| p == plural && key(o) == key(&object));
        let kind = if let Some(i) = existing {
            let old = &st.objects[i].1;
            object["metadata"]["uid"] = old["metadata"]["uid"].clone();
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            let spec_changed = old.get("spec") != object.get("spec");
            object["metadata"]["generation"] = json!(generation + i64::from(spec_changed));
            if object.get("status").is_none() {
                object["status"] = old["status"].clone();
            }
            st.objects[i].1 = object.clone();
            "MODIFIED"
        } else {
            object["metadata"]["uid"] = json!(format!("uid-{version}"));
            object["metadata"]["creationTimestamp"] = json!(
                jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
            );
            object["metadata"]["generation"] = json!(1);
            st.objects.push((plural.to_owned(), object.clone()));
            "ADDED"
        };
        let event = (plural.to_owned(), json!({"type": kind, "object": object}));
        st.history.push(event.clone());
        drop(st);
        let _ = self.events.send(event);
    }

    /// The object, as stored.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .iter()
            .find(|(p, o)| {
                p == plural
                    && o["metadata"]["namespace"] == namespace
                    && o["metadata"]["name"] == name
            })
            .map(|(_, o)| o.clone())
    }

    /// Makes writes (PATCH, not dry-run) of `path` hang forever, as a wedged API server or
    /// webhook would.
    pub fn hang(&self, path: &str) {
        self.lock().hung.push(path.to_owned());
    }

    /// Makes reads of `path` answer 500 (`true`) or work again (`false`).
    pub fn fail(&self, path: &str, failing: bool) {
        let mut st = self.lock();
        st.failing.retain(|p| p != path);
        if failing {
            st.failing.push(path.to_owned());
        }
    }

    /// Takes the API server away (`true`: every request answers 503 as a load balancer with
    /// no backend would, and open watches are cut) or brings it back (`false`).
    pub fn outage(&self, down: bool) {
        self.outage.send_replace(down);
    }

    /// Makes every answer take `latency` (before it is computed: a write lands after it).
    pub fn latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Lets SubjectAccessReviews allow `user`.
    pub fn allow(&self, user: &str) {
        self.lock().allowed.push(user.to_owned());
    }

    /// Objects of a kind.
    pub fn list(&self, plural: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|(p, _)| p == plural)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Waits (up to 20 s) until `check` holds.
    pub async fn until(&self, what: &str, check: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !check(self) {
            if tokio::time::Instant::now() > deadline {
                let seen: Vec<String> = self
                    .seen()
                    .iter()
                    .map(|s| format!("{} {}?{} {}", s.method, s.path, s.query, s.body))
                    .collect();
                panic!(
                    "timed out waiting for {what}; requests:\n{}",
                    seen.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn handle(&self, req: Request<Body>) -> Response {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        let headers: HeaderMap = req.headers().clone();
        let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let latency = self.lock().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let accept = headers
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_owned();
        let impersonate = headers
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .map(|user| {
                let groups = headers
                    .get_all("impersonate-group")
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(str::to_owned))
                    .collect();
                (user.to_owned(), groups)
            });
        self.lock().seen.push(Seen {
            token,
            impersonate,
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            content_type,
            accept,
            body: body.clone(),
        });
        if *self.outage.borrow() {
            return status(
                503,
                "ServiceUnavailable",
                "the API server is down (fake outage)",
            );
        }
        if method == Method::PATCH
            && query_param(&query, "dryRun").is_none()
            && self.lock().hung.contains(&path)
        {
            return std::future::pending().await;
        }
        if method == Method::GET && self.lock().failing.contains(&path) {
            return status(500, "InternalError", "the fake fails this path");
        }
        let Some((plural, namespace, name, sub)) = parse(&path) else {
            return status(404, "NotFound", &format!("no such path {path}"));
        };
        let metadata = headers
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("PartialObjectMetadata"));
        let in_scope = |o: &Value| {
            namespace
                .as_ref()
                .is_none_or(|ns| o["metadata"]["namespace"] == ns.as_str())
        };
        match (method, name, sub) {
            (Method::GET, None, None)
                if query_param(&query, "watch").as_deref() == Some("true") =>
            {
                let selector = query_param(&query, "labelSelector").unwrap_or_default();
                // Live events after the missed ones (subscribed first, so none falls between).
                let live = self.events.subscribe();
                let version = |event: &Value| -> u64 {
                    event["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                let from: u64 = query_param(&query, "resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let missed: Vec<(String, Value)> = if from == 0 {
                    Vec::new()
                } else {
                    self.lock()
                        .history
                        .iter()
                        .filter(|(_, e)| version(e) > from)
                        .cloned()
                        .collect()
                };
                let seen_up_to = missed.last().map_or(from, |(_, e)| version(e));
                let rx = futures_util::stream::iter(missed).chain(tokio_stream_of(live).filter(
                    move |(_, e)| {
                        let newer = version(e) > seen_up_to;
                        async move { newer }
                    },
                ));
                let ns = namespace.clone();
                let stream = rx.filter_map(move |(p, event)| {
                    let keep = p == plural
                        && ns.as_ref().is_none_or(|ns| {
                            event["object"]["metadata"]["namespace"] == ns.as_str()
                        })
                        && matches_selector(&event["object"], &selector);
                    let line = keep.then(|| {
                        let mut event = event.clone();
                        if metadata {
                            event["object"] = metadata_only(&event["object"]);
                        }
                        Ok::<_, std::convert::Infallible>(format!("{event}\n"))
                    });
                    async move { line }
                });
                let mut outage = self.outage.subscribe();
                let cut = async move {
                    let _ = outage.wait_for(|down| *down).await;
                };
                let stream = futures_util::StreamExt::take_until(stream, Box::pin(cut));
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(stream))
                    .unwrap_or_else(|_| status(500, "InternalError", "stream"))
            }
            (Method::GET, None, None) => {
                let selector = query_param(&query, "labelSelector").unwrap_or_default();
                let st = self.lock();
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|(p, o)| *p == plural && in_scope(o) && matches_selector(o, &selector))
                    .map(|(_, o)| {
                        if metadata {
                            metadata_only(o)
                        } else {
                            o.clone()
                        }
                    })
                    .collect();
                let (api_version, kind) = if metadata {
                    ("meta.k8s.io/v1", "PartialObjectMetadataList".to_owned())
                } else {
                    ("v1", "List".to_owned())
                };
                axum::Json(json!({"apiVersion": api_version, "kind": kind,
                    "metadata": {"resourceVersion": st.version.to_string()}, "items": items}))
                .into_response()
            }
            (Method::GET, Some(name), None) => {
                match self.get(&plural, namespace.as_deref().unwrap_or_default(), &name) {
                    Some(o) => axum::Json(o).into_response(),
                    None => status(404, "NotFound", &format!("{plural} \"{name}\" not found")),
                }
            }
            (Method::POST, None, None)
                if plural == "selfsubjectreviews" && headers.contains_key("impersonate-user") =>
            {
                // As the API server: the impersonated user, their groups, and
                // system:authenticated.
                let user = headers
                    .get("impersonate-user")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let mut groups: Vec<String> = headers
                    .get_all("impersonate-group")
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(str::to_owned))
                    .collect();
                groups.push("system:authenticated".into());
                (
                    StatusCode::CREATED,
                    axum::Json(json!({"apiVersion": "authentication.k8s.io/v1",
                    "kind": "SelfSubjectReview", "metadata": {},
                    "status": {"userInfo": {"username": user, "groups": groups}}})),
                )
                    .into_response()
            }
            (Method::POST, None, None) if plural == "selfsubjectreviews" => {
                // The bearer token says who it is: `<user>-token`.
                let user = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(|t| t.trim_end_matches("-token").to_owned())
                    .unwrap_or_default();
                (StatusCode::CREATED, axum::Json(json!({"apiVersion": "authentication.k8s.io/v1",
                    "kind": "SelfSubjectReview", "metadata": {},
                    "status": {"userInfo": {"username": user, "groups": ["system:authenticated", "sre"]}}})))
                .into_response()
            }
            (Method::POST, None, None) if plural == "tokenreviews" => {
                let token = body["spec"]["token"].as_str().unwrap_or_default();
                let status = match (token.strip_suffix("-token"), jwt_claims(token)) {
                    (Some(user), _) => json!({"authenticated": true,
                        "user": {"username": user, "groups": ["system:authenticated", "sre"]}}),
                    // As a JWT authenticator configured with the `oidc:` prefixes would (the
                    // fake does not check the signature: the tests check Kortex's side).
                    (None, Some(claims)) if claims["email"].is_string() => {
                        let mut groups = vec![json!("system:authenticated")];
                        groups.extend(
                            claims["groups"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .map(|g| json!(format!("oidc:{g}"))),
                        );
                        json!({"authenticated": true, "user": {
                            "username": format!("oidc:{}", claims["email"].as_str().unwrap_or_default()),
                            "groups": groups}})
                    }
                    _ => json!({"authenticated": false, "error": "invalid bearer token"}),
                };
                let mut review = body.clone();
                review["status"] = status;
                (StatusCode::CREATED, axum::Json(review)).into_response()
            }
            (Method::POST, None, None) if plural == "subjectaccessreviews" => {
                let user = body["spec"]["user"].as_str().unwrap_or_default().to_owned();
                let allowed = self.lock().allowed.contains(&user);
                let mut review = body.clone();
                review["status"] = json!({"allowed": allowed});
                (StatusCode::CREATED, axum::Json(review)).into_response()
            }
            (Method::POST, None, None) => {
                let mut body = body;
                if body["metadata"]["name"].is_null()
                    && let Some(prefix) = body["metadata"]["generateName"].as_str()
                {
                    let n = self.lock().version;
                    body["metadata"]["name"] = json!(format!("{prefix}{:05x}", n * 7919 % 0xfffff));
                }
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let mut object = body.clone();
                object["metadata"]["namespace"] = json!(namespace);
                if plural != "events"
                    && self
                        .get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                        .is_some()
                {
                    return status(
                        409,
                        "AlreadyExists",
                        &format!("{plural} \"{name}\" already exists"),
                    );
                }
                self.apply(&plural, object);
                let stored = self
                    .get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                    .unwrap_or(body);
                (StatusCode::CREATED, axum::Json(stored)).into_response()
            }
            (Method::PUT, Some(name), None) => {
                let Some(current) =
                    self.get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                else {
                    return status(404, "NotFound", "not found");
                };
                if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
                self.apply(&plural, body);
                axum::Json(self.get(&plural, namespace.as_deref().unwrap_or_default(), &name))
                    .into_response()
            }
            (Method::PATCH, Some(name), Some(sub)) if sub == "status" => {
                let Some(mut current) =
                    self.get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                else {
                    return status(404, "NotFound", "not found");
                };
                // Server-side apply with a resourceVersion is a precondition.
                if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                    && current["metadata"]["resourceVersion"] != rv
                {
                    return status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
                current["status"] = body["status"].clone();
                self.apply(&plural, current);
                axum::Json(self.get(&plural, namespace.as_deref().unwrap_or_default(), &name))
                    .into_response()
            }
            (Method::PATCH, Some(name), sub) => {
                let Some(mut current) =
                    self.get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                else {
                    return status(404, "NotFound", "not found");
                };
                match sub.as_deref() {
                    Some("scale") => {
                        let mut scale = json!({"spec": {"replicas": current["spec"]["replicas"]}});
                        merge(&mut scale, &body);
                        current["spec"]["replicas"] = scale["spec"]["replicas"].clone();
                    }
                    None => merge(&mut current, &body),
                    Some(_) => return status(404, "NotFound", "no such subresource"),
                }
                if query_param(&query, "dryRun").is_none() {
                    self.apply(&plural, current);
                    current = self
                        .get(&plural, namespace.as_deref().unwrap_or_default(), &name)
                        .unwrap_or_default();
                }
                if sub.as_deref() == Some("scale") {
                    return axum::Json(json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                        "metadata": current["metadata"], "spec": {"replicas": current["spec"]["replicas"]}}))
                    .into_response();
                }
                axum::Json(current).into_response()
            }
            _ => status(405, "MethodNotAllowed", "not supported by the fake"),
        }
    }
}

fn tokio_stream_of<T: Clone + Send + 'static>(
    rx: broadcast::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

pub fn provider(base: &str) -> Value {
    json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": "gpt", "namespace": "team-a"},
        // A model server beside Kortex on loopback (like a sidecar): allowed explicitly.
        "spec": {"type": "openai-compatible", "baseUrl": format!("{base}/v1"), "defaultModel": "m1",
            "allowPrivateTargets": true,
            "apiKeySecretRef": {"name": "llm-keys", "key": "openai"}}})
}

pub fn secret(key: Option<&str>) -> Value {
    let data = match key {
        Some(k) => json!({"openai": base64(k)}),
        None => json!({}),
    };
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": "team-a", "labels": {"kortex.dev/use": "true"}},
        "type": "Opaque", "data": data})
}

pub fn base64(text: &str) -> String {
    kortex::redact::base64(text)
}

pub fn status_patches(fake: &FakeApi, plural: &str, name: &str) -> Vec<Seen> {
    fake.seen()
        .into_iter()
        .filter(|s| s.method == "PATCH" && s.path.ends_with(&format!("/{plural}/{name}/status")))
        .collect()
}

pub fn condition(object: &Option<Value>, type_: &str) -> Option<(String, String)> {
    object.as_ref().and_then(|o| {
        o["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
    })
}

/// `config/admission/policy.yaml` (policy and binding) trusting `user`.
pub fn admission_policy(user: &str) -> (Value, Value) {
    let text = std::fs::read_to_string(root().join("config/admission/policy.yaml")).unwrap();
    let text = text.replace("system:serviceaccount:kortex:kortex", user);
    let mut docs = text
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap());
    let policy = docs.next().unwrap_or_default();
    let binding = docs.next().unwrap_or_default();
    (policy, binding)
}

/// The ChatPolicy `team-a/incidents`: every session, answered by the provider `gpt`, with
/// `proposals`.
pub fn incidents_policy(proposals: Value) -> Value {
    json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ChatPolicy",
        "metadata": {"name": "incidents", "namespace": "team-a"},
        "spec": {"sessions": ["*"], "provider": "gpt", "proposals": proposals}})
}

/// A fake API server holding the [`deployment`] and the [`incidents_policy`] with
/// `proposals`, and a scripted provider (its URL and script): where a proposals test in
/// cluster mode starts.
pub async fn incidents_cluster(
    proposals: Value,
) -> (FakeApi, String, Arc<crate::support::provider::Script>) {
    let fake = FakeApi::start().await;
    let (llm, script) = crate::support::provider::mock().await;
    fake.apply("deployments", deployment());
    fake.apply("chatpolicies", incidents_policy(proposals));
    (fake, llm, script)
}

pub fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop", "annotations": {"deployment.kubernetes.io/revision": "4"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
            "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [{"name": "api", "image": "shop/api:4"}]}}}})
}

pub fn proposal_named(fake: &FakeApi, prefix: &str) -> Option<Value> {
    fake.list("actionproposals").into_iter().find(|p| {
        p["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(prefix))
    })
}

pub fn phase(fake: &FakeApi, name: &str) -> String {
    fake.get("actionproposals", "shop", name)
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A kubeconfig in `dir` for the API server at `api` (a made-up token).
pub fn write_kubeconfig(dir: &std::path::Path, api: &str) -> std::path::PathBuf {
    write_kubeconfig_as(dir, api, "not-a-real-token", "kubeconfig")
}

/// A kubeconfig file `file` in `dir` for the API server at `api`, with `token`, and the
/// context's namespace `shop`.
pub fn write_kubeconfig_as(
    dir: &std::path::Path,
    api: &str,
    token: &str,
    file: &str,
) -> std::path::PathBuf {
    let path = dir.join(file);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{api}\"}}}}]\nusers: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u, namespace: shop}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}
