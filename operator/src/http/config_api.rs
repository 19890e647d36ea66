//! `GET /api/v1/llm/providers`, `/api/v1/tools`, `/api/v1/policies`: what the server
//! currently serves, with each object's conditions and where it came from — and never a
//! secret value (Secret references are shown by name and key only). Documents that failed
//! to load are listed too, unavailable, with the error that names the file and field.
//! `GET /api/v1/manifests` lists every load problem.

use super::AppState;
use super::access::ApiQuery;
use super::error::ApiError;
use crate::catalog::ObjectKey;
use crate::crd::conditions::reasons;
use crate::live::LiveConfig;
use crate::source::manifest::{Identity, Kind, Severity};
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Query parameters of the listings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only objects of this namespace.
    namespace: Option<String>,
}

fn identity(kind: Kind, key: &ObjectKey) -> Identity {
    Identity {
        kind,
        namespace: key.namespace.clone(),
        name: key.name.clone(),
    }
}

/// `source` and `problems` of an object, from the manifest loader.
fn source_fields(config: &LiveConfig, id: &Identity) -> (Value, Value, bool) {
    let source = config
        .origins
        .get(id)
        .map(|o| json!({"file": o.file.display().to_string(), "document": o.document, "line": o.line}))
        .unwrap_or(Value::Null);
    let problems: Vec<String> = config.problems_of(id).map(ToString::to_string).collect();
    (source, json!(problems), config.stale.contains(id))
}

/// Objects of `kind` that failed to load and are not served in any version.
fn broken(
    config: &LiveConfig,
    kind: Kind,
    served: &BTreeSet<&ObjectKey>,
    namespace: Option<&str>,
) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in config
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
    {
        let Some(id) = &p.object else { continue };
        let key = ObjectKey::new(&id.namespace, &id.name);
        if id.kind != kind
            || served.contains(&key)
            || namespace.is_some_and(|ns| ns != id.namespace)
        {
            continue;
        }
        if !seen.insert(key) {
            continue;
        }
        let problems: Vec<String> = config.problems_of(id).map(ToString::to_string).collect();
        out.push(json!({
            "namespace": id.namespace,
            "name": id.name,
            "available": false,
            "conditions": [{
                "type": "Ready",
                "status": "False",
                "reason": reasons::INVALID_MANIFEST,
                "message": problems.join("; "),
                "lastTransitionTime": config.loaded_at.to_string(),
            }],
            "source": {"file": p.origin.file.display().to_string(), "document": p.origin.document, "line": p.origin.line},
            "problems": problems,
        }));
    }
    out
}

fn in_namespace(key: &ObjectKey, q: &ListQuery) -> bool {
    q.namespace.as_deref().is_none_or(|ns| ns == key.namespace)
}

/// What every listed object has, whatever its kind.
struct Common {
    available: bool,
    generation: Option<i64>,
    observed_generation: Option<i64>,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// The listing of one kind: the common fields, the kind's own (`view`), then the objects of
/// that kind that failed to load.
fn listing<E>(
    state: &AppState,
    query: ApiQuery<ListQuery>,
    kind: Kind,
    entries: impl Fn(&LiveConfig) -> &std::collections::BTreeMap<ObjectKey, E>,
    view: impl Fn(&E) -> (Common, Value),
) -> Result<Json<Value>, ApiError> {
    let ApiQuery(q) = query;
    let config = state.config.borrow().clone();
    let mut items = Vec::new();
    let mut served = BTreeSet::new();
    for (key, entry) in entries(&config).iter().filter(|(k, _)| in_namespace(k, &q)) {
        served.insert(key);
        let (common, own) = view(entry);
        let (source, problems, stale) = source_fields(&config, &identity(kind, key));
        let mut item = json!({
            "namespace": key.namespace,
            "name": key.name,
            "available": common.available,
            "generation": common.generation,
            "observedGeneration": common.observed_generation,
            "conditions": common.conditions,
            "source": source,
            "stale": stale,
            "problems": problems,
        });
        if let (Some(item), Value::Object(own)) = (item.as_object_mut(), own) {
            item.extend(own);
        }
        items.push(item);
    }
    items.extend(broken(&config, kind, &served, q.namespace.as_deref()));
    Ok(Json(json!({"items": items})))
}

/// `GET /api/v1/llm/providers`
pub async fn providers(
    State(state): State<AppState>,
    query: ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let probes = state.probes.read().map(|b| b.clone()).unwrap_or_default();
    listing(
        &state,
        query,
        Kind::LLMProvider,
        |c| &c.catalog.providers,
        |p| {
            let spec = &p.object.spec;
            let mut status = p.object.status.clone().unwrap_or_default();
            let probe = probes.get(&ObjectKey::of(&p.object));
            if let Some(probe) = probe {
                status
                    .conditions
                    .retain(|c| c.type_ != crate::crd::conditions::types::REACHABLE);
                status
                    .conditions
                    .push(probe.condition(p.object.metadata.generation));
                // The discovered models are in the live catalog already (`probe::fold`).
            }
            let common = Common {
                available: p.available,
                generation: p.object.metadata.generation,
                observed_generation: status.observed_generation,
                conditions: status.conditions,
            };
            let mut own = json!({
                "type": spec.provider_type.as_str(),
                "baseUrl": p.base_url(),
                "locality": p.locality(),
                "toolMode": spec.tool_mode(),
                "defaultModel": p.default_model(),
                "fastModel": spec.fast_model,
                "models": spec.models,
                "maxTokens": p.max_tokens(),
                "timeoutSeconds": p.timeout().as_secs_f64(),
                "apiKeySecretRef": spec.api_key_secret_ref,
                "caBundleSecretRef": spec.ca_bundle_secret_ref,
                "headers": spec.headers.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
                "statusModels": status.models,
                "secretHash": status.secret_hash,
                "probe": probe.map(|r| json!({
                    "reachable": r.reachable,
                    "ok": r.ok,
                    "latencyMs": r.latency_ms,
                    "checkedAt": r.checked_at.to_string(),
                    "models": r.models,
                })),
            });
            if spec.provider_type == crate::crd::ProviderType::ClaudeCode {
                own["command"] = json!(spec.command.as_deref().unwrap_or("claude"));
                own["authSecretRef"] = json!(spec.auth_secret_ref);
                own["authKind"] = json!(spec.auth_kind.unwrap_or_default());
                own["maxTurns"] = json!(spec.max_turns);
            }
            (common, own)
        },
    )
}

/// `GET /api/v1/tools`
pub async fn tools(
    State(state): State<AppState>,
    query: ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let plugins = state.engine.router.plugins();
    let Json(mut out) = listing(
        &state,
        query,
        Kind::KortexTool,
        |c| &c.catalog.tools,
        |t| {
            let spec = &t.object.spec;
            let mut status = t.object.status.clone().unwrap_or_default();
            let key = ObjectKey::of(&t.object);
            let discovery = plugins.discovery.get(&key).map(|d| {
                status.tools = d.tools.clone();
                json!({
                    "reachable": d.discovered_at.is_some() && d.error.is_none(),
                    "error": d.error,
                    "skipped": d.skipped,
                    "discoveredAt": d.discovered_at.map(|t| t.to_string()),
                })
            });
            let problem = plugins.problems.get(&key);
            let backend = match (&spec.http, &spec.mcp) {
                (Some(h), _) => {
                    json!({"type": "http", "method": h.method, "url": h.url, "auth": h.auth.as_ref().map(|a| a.auth_type)})
                }
                (None, Some(m)) => {
                    json!({"type": "mcp", "url": m.url, "include": m.include, "exclude": m.exclude,
                "auth": m.auth.as_ref().map(|a| a.auth_type)})
                }
                (None, None) => Value::Null,
            };
            let common = Common {
                available: t.available,
                generation: t.object.metadata.generation,
                observed_generation: status.observed_generation,
                conditions: status.conditions,
            };
            let own = json!({
                "toolName": t.tool_name,
                "description": spec.description,
                "backend": backend,
                "parameters": spec.parameters,
                "allowedSessions": spec.allowed_sessions,
                "allowPrivateTargets": spec.allow_private_targets,
                "timeoutSeconds": t.timeout().as_secs_f64(),
                "maxResultBytes": t.max_result_bytes(),
                "tools": status.tools,
                "discovery": discovery,
                "buildError": problem,
                // The guide as list_tool_guides shows it (the text is in the object).
                "guide": spec.guide.as_deref().map(|g| json!({
                    "name": t.tool_name,
                    "summary": crate::tools::guides::summary(g),
                    "bytes": g.len(),
                })),
            });
            (common, own)
        },
    )?;
    let builtin: Vec<Value> = state
        .engine
        .router
        .builtin()
        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    out["builtin"] = json!(builtin);
    Ok(Json(out))
}

/// `GET /api/v1/policies`
pub async fn policies(
    State(state): State<AppState>,
    query: ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let Json(mut out) = listing(
        &state,
        query,
        Kind::ChatPolicy,
        |c| &c.catalog.policies,
        |p| {
            let status = p.object.status.clone().unwrap_or_default();
            let common = Common {
                available: p.available,
                generation: p.object.metadata.generation,
                observed_generation: status.observed_generation,
                conditions: status.conditions,
            };
            (common, json!({"spec": p.object.spec}))
        },
    )?;
    // What each policy would use now and what it has spent today.
    let config = state.config.borrow().clone();
    let catalog = &config.catalog;
    for item in out["items"].as_array_mut().into_iter().flatten() {
        let (Some(ns), Some(name)) = (item["namespace"].as_str(), item["name"].as_str()) else {
            continue;
        };
        let Some(entry) = catalog.policies.get(&ObjectKey::new(ns, name)) else {
            continue;
        };
        let plan =
            crate::govern::route::plan(catalog, ns, entry, crate::govern::route::Role::Default);
        let today = state
            .engine
            .governor
            .spent_today(&format!("{ns}/{name}"))
            .await
            .map_err(ApiError::from)?;
        let limit = entry
            .object
            .spec
            .budget
            .as_ref()
            .and_then(|b| b.daily_usd_limit);
        // The last seven days' spend per provider, for the dashboard's chart.
        let since = crate::store::utc_day(crate::store::now_ms() - 6 * 86_400_000);
        let days: Vec<Value> = state
            .store
            .policy_spend_by_day(&format!("{ns}/{name}"), &since)
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|(day, provider, cost)| json!({"day": day, "provider": provider, "costUsd": cost}))
            .collect();
        item["spendByDay"] = json!(days);
        item["routes"] = json!(plan.routes);
        item["skipped"] = json!(plan.skipped);
        item["spend"] = json!({
            "todayUsd": today,
            "dailyUsdLimit": limit,
            "percentUsed": limit.filter(|l| *l > 0.0).map(|l| (today / l * 1000.0).round() / 10.0),
        });
    }
    Ok(Json(out))
}

/// `GET /api/v1/manifests`: every problem of the last load, errors first.
pub async fn manifests(State(state): State<AppState>) -> Json<Value> {
    let config = state.config.borrow().clone();
    let mut problems: Vec<&crate::source::manifest::Problem> = config.problems.iter().collect();
    problems.sort_by_key(|p| p.severity != Severity::Error);
    let items: Vec<Value> = problems
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
            if let Some(obj) = v.as_object_mut() {
                obj.insert("text".into(), Value::String(p.to_string()));
            }
            v
        })
        .collect();
    Json(json!({
        "version": config.version,
        "loadedAt": config.loaded_at.to_string(),
        "errors": config.errors().count(),
        "items": items,
    }))
}
