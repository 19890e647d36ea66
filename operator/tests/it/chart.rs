//! The Helm chart `charts/kortex`: it lints, renders with its defaults and with the values
//! files in `charts/kortex/ci/`, every rendered object is valid for its kind (k8s-openapi
//! round trip, and `kubernetes-validate --strict` when available), its CRDs are `crds/`,
//! its RBAC is `config/rbac`'s and covers every call Kortex makes, bad values are refused
//! with the reason, every value is documented and maps to a real flag or variable, and
//! its defaults install what `kubectl kustomize config/default` does.
//!
//! Needs a `helm` (`KORTEX_TEST_HELM`; scripts/test.sh provides one over PyPI's
//! helm-python-sdk); without it the tests that render are skipped, unless
//! `KORTEX_REQUIRE_HELM=1`.

use super::config::{assert_rbac_covers_calls, granted};
use crate::support::yaml::{check, docs, key, parse, root};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

const CHART: &str = "charts/kortex";
const NAMESPACE: &str = "kortex";

/// The values files the chart is rendered with besides its defaults.
const VALUES_FILES: &[&str] = &[
    "charts/kortex/ci/postgres-values.yaml",
    "charts/kortex/ci/observability-values.yaml",
    "charts/kortex/ci/sqlite-persistent-values.yaml",
    "charts/kortex/ci/sso-values.yaml",
    "charts/kortex/ci/slack-values.yaml",
];

/// The `helm` to run, or `None` (with the reason printed) to skip.
fn helm() -> Option<String> {
    match std::env::var("KORTEX_TEST_HELM") {
        Ok(helm) if !helm.is_empty() => Some(helm),
        _ => {
            assert!(
                std::env::var("KORTEX_REQUIRE_HELM").as_deref() != Ok("1"),
                "KORTEX_REQUIRE_HELM=1 but KORTEX_TEST_HELM is not set"
            );
            eprintln!(
                "skipping: KORTEX_TEST_HELM is not set (scripts/test.sh installs helm-python-sdk and sets it)"
            );
            None
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `helm template kortex charts/kortex -n kortex ARGS...` as text.
fn template_text(helm: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["template", "kortex", CHART, "--namespace", NAMESPACE];
    all.extend_from_slice(args);
    run(helm, &all)
}

/// The rendered objects.
fn template(helm: &str, args: &[&str]) -> Vec<Value> {
    let text =
        template_text(helm, args).unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"));
    parse(&text, &format!("helm template {args:?}"))
}

/// Every way the tests render the chart: the defaults, then each values file.
fn renderings(helm: &str) -> Vec<(String, Vec<Value>)> {
    let mut out = vec![("defaults".to_owned(), template(helm, &[]))];
    for file in VALUES_FILES {
        out.push(((*file).to_owned(), template(helm, &["-f", file])));
    }
    out
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found = find(objects, kind);
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

fn container(objects: &[Value]) -> &Value {
    &one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn env(objects: &[Value]) -> BTreeMap<String, Value> {
    container(objects)["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["name"].as_str().unwrap_or_default().to_owned(), e.clone()))
        .collect()
}

fn env_value(objects: &[Value], name: &str) -> Option<String> {
    env(objects)
        .get(name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}

/// Minimal schemas of the Prometheus Operator kinds the chart renders (their CRDs are not
/// here to validate against): the fields the chart writes, with their types.
fn monitoring_schema(kind: &str) -> Value {
    let metadata = json!({"type": "object", "required": ["name", "namespace"]});
    match kind {
        "ServiceMonitor" => json!({
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": {"const": "monitoring.coreos.com/v1"},
                "metadata": metadata,
                "spec": {
                    "type": "object", "additionalProperties": false,
                    "required": ["selector", "endpoints"],
                    "properties": {
                        "selector": {"type": "object", "required": ["matchLabels"]},
                        "namespaceSelector": {"type": "object", "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}}},
                        "endpoints": {"type": "array", "minItems": 1, "items": {
                            "type": "object", "additionalProperties": false,
                            "properties": {
                                "port": {"type": "string"}, "path": {"type": "string"},
                                "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}
                            }
                        }}
                    }
                }
            }
        }),
        "PrometheusRule" => json!({
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": {"const": "monitoring.coreos.com/v1"},
                "metadata": metadata,
                "spec": {
                    "type": "object", "additionalProperties": false, "required": ["groups"],
                    "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "additionalProperties": false, "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {"type": "array", "minItems": 1, "items": {
                                "type": "object", "additionalProperties": false,
                                "required": ["alert", "expr", "labels", "annotations"],
                                "properties": {
                                    "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                    "labels": {"type": "object", "required": ["severity"], "additionalProperties": {"type": "string"}},
                                    "annotations": {"type": "object", "required": ["summary", "description"], "additionalProperties": {"type": "string"}}
                                }
                            }}
                        }
                    }}}
                }
            }
        }),
        other => panic!("no schema for {other}"),
    }
}

fn validate_object(object: &Value, origin: &str) {
    let kind = object["kind"].as_str().unwrap_or_default();
    if object["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
    {
        let schema = monitoring_schema(kind);
        let validator = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(object)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{origin}: {kind}: {errors:#?}");
    } else {
        check(object, origin);
    }
    assert!(
        object["metadata"]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        "{origin}: {kind} without a name"
    );
}

/// `kubernetes-validate --strict` (the Kubernetes OpenAPI schemas, offline) over `text`,
/// for the oldest supported Kubernetes and the newest it knows; skipped without it.
fn kubernetes_validate(text: &str, origin: &str) {
    let Ok(validator) = std::env::var("KORTEX_TEST_KUBE_VALIDATE") else {
        assert!(
            std::env::var("KORTEX_REQUIRE_HELM").as_deref() != Ok("1"),
            "KORTEX_REQUIRE_HELM=1 but KORTEX_TEST_KUBE_VALIDATE is not set"
        );
        eprintln!("not running kubernetes-validate: KORTEX_TEST_KUBE_VALIDATE is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, text).unwrap();
    let file = file.to_string_lossy().into_owned();
    for version in ["1.30.0", "1.37.0"] {
        let out = run(
            &validator,
            &["--strict", "--quiet", "-k", version, file.as_str()],
        )
        .unwrap_or_else(|e| panic!("{origin}: kubernetes-validate {version}:\n{e}"));
        // Only the Prometheus Operator kinds may lack a schema.
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                line.contains("Couldn't find schema for kind ServiceMonitor")
                    || line.contains("Couldn't find schema for kind PrometheusRule"),
                "{origin}: kubernetes-validate {version}: {line}"
            );
        }
    }
}

/// The CRDs in the chart's `crds/` are byte for byte the files in `crds/` (which a unit
/// test keeps equal to `kortex crds`).
#[test]
fn chart_crds_are_the_crds_folder() {
    let list = |dir: &str| -> BTreeSet<String> {
        std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".kortex.dev.yaml"))
            .collect()
    };
    let (ours, chart) = (list("crds"), list("charts/kortex/crds"));
    assert_eq!(
        chart, ours,
        "charts/kortex/crds/ must hold exactly crds/'s files"
    );
    assert_eq!(ours.len(), 4);
    for file in ours {
        let a = std::fs::read(root().join("crds").join(&file)).unwrap_or_default();
        let b = std::fs::read(root().join("charts/kortex/crds").join(&file)).unwrap_or_default();
        assert!(
            a == b,
            "charts/kortex/crds/{file} differs from crds/{file}: run `KORTEX_UPDATE_CRDS=1 cargo test -p kortex crds_folder` (it writes both)"
        );
        for doc in docs(&root().join("crds").join(&file)) {
            check(&doc, &file);
        }
    }
}

/// The leaves of a YAML mapping, as dotted paths (lists are leaves).
fn leaves(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(v, &format!("{prefix}{k}."), out);
            }
        }
        _ => {
            out.insert(prefix.trim_end_matches('.').to_owned());
        }
    }
}

/// Every key of `values.yaml` has a comment above it (or is in a block a comment
/// describes), and `values.schema.json` declares exactly the keys `values.yaml` has.
#[test]
fn chart_values_are_documented_and_in_the_schema() {
    let text = std::fs::read_to_string(root().join("charts/kortex/values.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if key_line(line).is_some() {
            assert!(
                documented(&lines, i),
                "values.yaml line {}: `{}` has no comment",
                i + 1,
                line.trim()
            );
        }
    }

    let values: Value = serde_saphyr::from_str(&text).unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("charts/kortex/values.schema.json"))
            .unwrap_or_default(),
    )
    .expect("values.schema.json");
    let mut in_values = BTreeSet::new();
    leaves(&values, "", &mut in_values);
    for path in &in_values {
        let mut node = &schema;
        for part in path.split('.') {
            if node["additionalProperties"] == false || node["properties"].is_object() {
                assert!(
                    node["properties"][part].is_object(),
                    "values.schema.json does not declare {path}"
                );
                node = &node["properties"][part];
            } else {
                break;
            }
        }
    }
    // And the schema declares no key values.yaml lacks (each would be undocumented).
    fn declared(schema: &Value, prefix: &str, values: &Value, out: &mut Vec<String>) {
        for (k, v) in schema["properties"].as_object().into_iter().flatten() {
            let path = format!("{prefix}{k}");
            if k == "global" {
                continue;
            }
            if values.get(k).is_none() {
                out.push(path);
            } else if v["additionalProperties"] == false {
                declared(v, &format!("{path}."), &values[k], out);
            }
        }
    }
    let mut missing = Vec::new();
    declared(&schema, "", &values, &mut missing);
    assert!(
        missing.is_empty(),
        "declared in the schema, not in values.yaml: {missing:?}"
    );
    // The schema is strict at the top: an unknown key fails.
    assert_eq!(schema["additionalProperties"], false);
}

/// The indentation and value of a `key: value` line of values.yaml (not a comment or a
/// list item).
fn key_line(line: &str) -> Option<(usize, &str)> {
    let trimmed = line.trim_start();
    let (key, value) = trimmed.split_once(':')?;
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    plain.then(|| (line.len() - trimmed.len(), value.trim()))
}

fn comment_at(line: &str, indent: usize) -> bool {
    line.trim_start().starts_with('#') && line.len() - line.trim_start().len() == indent
}

/// A key is documented by a comment right above it at its indentation; a section heading
/// (`image:`) by the comments of its children; a key inside a documented mapping value
/// (`resources.requests.cpu`) by its ancestor's comment.
fn documented(lines: &[&str], i: usize) -> bool {
    let Some((indent, value)) = key_line(lines[i]) else {
        return false;
    };
    if i > 0 && comment_at(lines[i - 1], indent) {
        return true;
    }
    let section = value.is_empty()
        && lines
            .get(i + 1)
            .is_some_and(|next| next.trim_start().starts_with('#'));
    if section {
        return true;
    }
    // The nearest ancestor key: documented directly and not a section.
    let mut want = indent;
    for j in (0..i).rev() {
        let line = lines[j];
        let line_indent = line.len() - line.trim_start().len();
        if line.trim().is_empty() || line.trim_start().starts_with('#') || line_indent >= want {
            continue;
        }
        want = line_indent;
        if let Some((parent_indent, parent_value)) = key_line(line) {
            let commented = j > 0 && comment_at(lines[j - 1], parent_indent);
            let parent_section = parent_value.is_empty()
                && lines
                    .get(j + 1)
                    .is_some_and(|next| next.trim_start().starts_with('#'));
            if commented && !parent_section {
                return true;
            }
            if parent_section {
                return false;
            }
        }
    }
    false
}

#[test]
fn chart_lints_and_every_rendered_object_is_valid() {
    let Some(helm) = helm() else { return };
    run(
        &helm,
        &["lint", CHART, "--strict", "--namespace", NAMESPACE],
    )
    .unwrap_or_else(|e| panic!("helm lint:\n{e}"));
    for file in VALUES_FILES {
        run(&helm, &["lint", CHART, "--strict", "-f", file])
            .unwrap_or_else(|e| panic!("helm lint -f {file}:\n{e}"));
    }
    let mut kinds = BTreeSet::new();
    for (name, objects) in renderings(&helm) {
        let mut seen = BTreeSet::new();
        for o in &objects {
            validate_object(o, &name);
            assert!(seen.insert(key(o)), "{name}: {} rendered twice", key(o));
            kinds.insert(o["kind"].as_str().unwrap_or_default().to_owned());
            let namespaced = !matches!(
                o["kind"].as_str(),
                Some(
                    "ClusterRole"
                        | "ClusterRoleBinding"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                )
            );
            // Everything namespaced is in the release's namespace, but the grants of
            // triggers.runAs, which live where those ServiceAccounts do.
            let run_as = o["metadata"]["name"] == "kortex-trigger-runas";
            if !run_as {
                assert_eq!(
                    o["metadata"]["namespace"].as_str(),
                    namespaced.then_some(NAMESPACE),
                    "{name}: {}",
                    key(o)
                );
            }
        }
        let args: Vec<&str> = if name == "defaults" {
            vec![]
        } else {
            vec!["-f", name.as_str()]
        };
        kubernetes_validate(&template_text(&helm, &args).unwrap_or_default(), &name);
    }
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Deployment",
        "Service",
        "Ingress",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "PersistentVolumeClaim",
    ] {
        assert!(kinds.contains(kind), "no rendering has a {kind}");
    }
}

/// The chart's RBAC is config/rbac's (same rules), covers every call the code makes, and
/// grants impersonation only in single sign-on's impersonate mode, of the listed groups, and
/// for Slack when asked, of the listed users and groups.
#[test]
fn chart_rbac_is_config_rbac_and_covers_every_call() {
    let Some(helm) = helm() else { return };
    let config: Vec<Value> = [
        "role.yaml",
        "approver_role.yaml",
        "user_role.yaml",
        "trigger_role.yaml",
        "admin_role.yaml",
    ]
    .iter()
    .flat_map(|f| docs(&root().join("config/rbac").join(f)))
    .collect();
    let rules_of = |objects: &[Value]| -> BTreeMap<String, Value> {
        objects
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")))
            .map(|o| (key(o), o["rules"].clone()))
            .collect()
    };
    for (name, objects) in renderings(&helm) {
        let roles: Vec<Value> = objects
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")))
            .cloned()
            .collect();
        // Kortex's own roles: the ClusterRole bound to its ServiceAccount and the Lease Role.
        let own: Vec<Value> = roles
            .iter()
            .filter(|r| key(r) == "ClusterRole/kortex" || key(r) == "Role/kortex-leader-election")
            .cloned()
            .collect();
        assert_eq!(own.len(), 2, "{name}");
        assert_rbac_covers_calls(&own, &name);
        // A token of a ServiceAccount only from triggers.runAs: in its namespace, by name.
        for role in &roles {
            if !granted(
                std::slice::from_ref(role),
                "create",
                "",
                "serviceaccounts/token",
            ) {
                continue;
            }
            assert_eq!(key(role), "Role/kortex-trigger-runas", "{name}");
            let names = &role["rules"][0]["resourceNames"];
            assert!(
                names.as_array().is_some_and(|n| !n.is_empty()),
                "{name}: {names}"
            );
        }
        for role in &roles {
            // Single sign-on's impersonate mode alone grants impersonation: of users, and
            // of exactly the groups listed, never a system: one.
            if key(role) == "ClusterRole/kortex-sso-impersonate" {
                assert_eq!(name, "charts/kortex/ci/sso-values.yaml");
                // config/rbac/sso_impersonate.yaml's rules, with the values' groups.
                let mut rules =
                    docs(&root().join("config/rbac/sso_impersonate.yaml"))[0]["rules"].clone();
                rules[1]["resourceNames"] = json!(["oidc:oncall", "oidc:platform"]);
                assert_eq!(role["rules"], rules, "{name}");
                continue;
            }
            // Slack's grant alone besides: exactly the users and groups listed.
            if key(role) == "ClusterRole/kortex-slack-impersonate" {
                assert_eq!(name, "charts/kortex/ci/slack-values.yaml");
                let rules =
                    docs(&root().join("config/rbac/slack_impersonate.yaml"))[0]["rules"].clone();
                assert_eq!(role["rules"], rules, "{name}");
                assert_eq!(
                    container(&objects)["args"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|a| a == &&json!("--slack-impersonate-groups=oncall"))
                        .count(),
                    1,
                    "{name}: Kortex is told the groups it may impersonate"
                );
                continue;
            }
            for what in [
                "users",
                "groups",
                "serviceaccounts",
                "uids",
                "userextras/scopes",
            ] {
                assert!(
                    !granted(std::slice::from_ref(role), "impersonate", "", what)
                        && !granted(
                            std::slice::from_ref(role),
                            "impersonate",
                            "authentication.k8s.io",
                            what
                        ),
                    "{name}: {} grants impersonation",
                    key(role)
                );
            }
        }
        let chart_rules = rules_of(&objects);
        let user_roles = name != "charts/kortex/ci/sqlite-persistent-values.yaml";
        for (k, rules) in rules_of(&config) {
            if !user_roles && k != "ClusterRole/kortex" && k != "Role/kortex-leader-election" {
                assert!(
                    !chart_rules.contains_key(&k),
                    "{name}: {k} with rbac.createUserRoles=false"
                );
                continue;
            }
            assert_eq!(
                chart_rules.get(&k),
                Some(&rules),
                "{name}: {k} differs from config/rbac"
            );
        }
        // The bindings name the ServiceAccount the Deployment runs as.
        let sa =
            one(&objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].clone();
        assert_eq!(
            one(&objects, "ServiceAccount")["metadata"]["name"],
            sa,
            "{name}"
        );
        for binding in find(&objects, "ClusterRoleBinding")
            .into_iter()
            .chain(find(&objects, "RoleBinding"))
        {
            assert_eq!(binding["subjects"][0]["name"], sa, "{name}");
            assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE, "{name}");
        }
        // The admission policy trusts exactly that ServiceAccount.
        let trusted = format!(
            "system:serviceaccount:{NAMESPACE}:{}",
            sa.as_str().unwrap_or_default()
        );
        let policy = one(&objects, "ValidatingAdmissionPolicy");
        assert!(
            policy["spec"]["variables"][0]["expression"]
                .as_str()
                .is_some_and(|e| e.contains(&format!("'{trusted}'"))),
            "{name}: the admission policy must trust {trusted}"
        );
        assert_eq!(
            one(&objects, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"],
            policy["metadata"]["name"]
        );
    }
    // triggers.runAs: one Role and RoleBinding per namespace, for the named ServiceAccounts.
    let dir = tempfile::tempdir().unwrap();
    let values = |name: &str, yaml: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        path.to_string_lossy().into_owned()
    };
    let two = values(
        "runas.yaml",
        "triggers:\n  runAs:\n    - {namespace: shop, serviceAccounts: [investigator]}\n    - {namespace: billing, serviceAccounts: [a, b]}\n",
    );
    let run_as = template(&helm, &["-f", &two]);
    let mut granted_in: Vec<(String, Value)> = find(&run_as, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["name"] == "kortex-trigger-runas")
        .map(|r| {
            (
                r["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                r["rules"].clone(),
            )
        })
        .collect();
    granted_in.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        granted_in,
        vec![
            (
                "billing".to_owned(),
                serde_json::json!([{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"], "resourceNames": ["a", "b"]}])
            ),
            (
                "shop".to_owned(),
                serde_json::json!([{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"], "resourceNames": ["investigator"]}])
            ),
        ]
    );
    let bound: Vec<&Value> = find(&run_as, "RoleBinding")
        .into_iter()
        .filter(|b| b["metadata"]["name"] == "kortex-trigger-runas")
        .collect();
    assert_eq!(bound.len(), 2);
    for b in bound {
        assert_eq!(b["roleRef"]["name"], "kortex-trigger-runas");
        assert_eq!(b["subjects"][0]["name"], "kortex");
        assert_eq!(b["subjects"][0]["namespace"], NAMESPACE);
    }
    // A runAs entry without ServiceAccount names is refused (no namespace-wide grant).
    let unnamed = values(
        "unnamed.yaml",
        "triggers:\n  runAs:\n    - {namespace: shop}\n",
    );
    let refused = template_text(&helm, &["-f", &unnamed]);
    assert!(refused.is_err(), "{refused:?}");
    // rbac.create=false leaves Kortex's own RBAC to you; admissionPolicy.enabled=false
    // leaves out the policy.
    let bare = template(
        &helm,
        &[
            "--set",
            "rbac.create=false",
            "--set",
            "rbac.createUserRoles=false",
            "--set",
            "admissionPolicy.enabled=false",
        ],
    );
    for kind in [
        "ClusterRole",
        "Role",
        "ClusterRoleBinding",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            find(&bare, kind).is_empty(),
            "{kind} rendered although disabled"
        );
    }
}

/// SQLite is one file: refused with more than one replica or without `Recreate`; other
/// inconsistent values are refused with the reason too.
#[test]
fn chart_refuses_unsafe_database_settings() {
    let Some(helm) = helm() else { return };
    for (sets, expected) in [
        (
            vec!["replicaCount=2"],
            "database.type sqlite allows one replica only, not replicaCount=2",
        ),
        (
            vec!["updateStrategy.type=RollingUpdate"],
            "database.type sqlite needs updateStrategy.type=Recreate",
        ),
        (
            vec!["database.type=postgres"],
            "database.type postgres needs database.postgres.existingSecret",
        ),
        (
            vec!["auth.proxy.header=X-Forwarded-User"],
            "auth.proxy.header needs auth.proxy.from",
        ),
        (
            vec!["sso.issuer=https://dex.example.com"],
            "sso.issuer needs sso.clientId",
        ),
        (
            vec![
                "sso.issuer=https://dex.example.com",
                "sso.clientId=kortex",
                "sso.kubernetes=impersonate",
            ],
            "sso.kubernetes=impersonate needs sso.impersonation.groups",
        ),
    ] {
        let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
        let err = template_text(&helm, &args)
            .err()
            .unwrap_or_else(|| panic!("{sets:?} must be refused"));
        assert!(err.contains(expected), "{sets:?}: {err}");
    }
    // PostgreSQL: any number of replicas, rolled; the URL comes from the Secret.
    let pg = template(&helm, &["-f", VALUES_FILES[0]]);
    let deployment = one(&pg, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        env(&pg)["DATABASE_URL"]["valueFrom"]["secretKeyRef"],
        json!({"name": "kortex-db", "key": "url"})
    );
    assert!(find(&pg, "PersistentVolumeClaim").is_empty());
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert!(
        !volumes.to_string().contains("\"data\""),
        "no SQLite volume with PostgreSQL: {volumes}"
    );
    assert_eq!(one(&pg, "PodDisruptionBudget")["spec"]["minAvailable"], 2);
    // SQLite on a claim the chart creates.
    let lite = template(&helm, &["-f", VALUES_FILES[2]]);
    let pvc = one(&lite, "PersistentVolumeClaim");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "5Gi");
    assert_eq!(pvc["spec"]["storageClassName"], "standard");
    assert_eq!(
        one(&lite, "Deployment")["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"]
            ["claimName"],
        pvc["metadata"]["name"]
    );
    assert_eq!(
        env_value(&lite, "DATABASE_URL").as_deref(),
        Some("sqlite:///var/lib/kortex/kortex.db")
    );
    assert_eq!(
        container(&lite)["image"],
        "registry.example/kortex@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    // An existing claim is used, not created.
    let existing = template(
        &helm,
        &[
            "--set",
            "database.sqlite.persistence.enabled=true",
            "--set",
            "database.sqlite.persistence.existingClaim=mine",
        ],
    );
    assert!(find(&existing, "PersistentVolumeClaim").is_empty());
    assert!(
        one(&existing, "Deployment")
            .to_string()
            .contains("\"claimName\":\"mine\"")
    );
}

/// values.schema.json refuses wrong types, unknown keys and bad enums at install time.
#[test]
fn chart_schema_refuses_bad_values() {
    let Some(helm) = helm() else { return };
    for (set, expected) in [
        ("replicaCount=two", "replicaCount"),
        ("replicaCuont=2", "replicaCuont"),
        ("database.type=mysql", "database/type"),
        ("log.format=yaml", "log/format"),
        ("image.pullPolicy=Sometimes", "image/pullPolicy"),
        ("service.port=0", "service/port"),
        ("probeInterval=often", "probeInterval"),
        ("prometheusUrl=prometheus:9090", "prometheusUrl"),
        ("ingress.enabeld=true", "enabeld"),
        ("updateStrategy.type=OnDelete", "updateStrategy/type"),
        ("prometheusRule.budgetThreshold=80", "budgetThreshold"),
        ("sso.issuer=http://dex.example.com", "sso/issuer"),
        ("sso.kubernetes=always", "sso/kubernetes"),
        (
            "sso.impersonation.groups={system:masters}",
            "sso/impersonation/groups/0",
        ),
    ] {
        let err = template_text(&helm, &["--set", set])
            .err()
            .unwrap_or_else(|| panic!("--set {set} must be refused"));
        assert!(err.contains(expected), "--set {set}: {err}");
    }
}

/// The pod runs hardened, with probes on /healthz and /readyz, and leader election wired.
#[test]
fn chart_deployment_is_hardened_and_probed() {
    let Some(helm) = helm() else { return };
    for (name, objects) in renderings(&helm) {
        let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
        let c = container(&objects);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(pod["securityContext"]["runAsUser"], 65532, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"], false,
            "{name}"
        );
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{name}"
        );
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            json!(["ALL"]),
            "{name}"
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(c["ports"][0]["containerPort"], 8080, "{name}");
        assert!(
            c["resources"]["requests"].is_object()
                && c["resources"]["limits"]["memory"].is_string()
        );
        assert_eq!(c["args"][0], "run", "{name}");
        // Leader election: the Lease identity and namespace come from the pod.
        let e = env(&objects);
        assert_eq!(
            e["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.name"
        );
        assert_eq!(
            e["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        assert_eq!(
            env_value(&objects, "KORTEX_LISTEN").as_deref(),
            Some("0.0.0.0:8080")
        );
        // The Service and NetworkPolicy select the pods and expose the HTTP port.
        let labels = &pod_labels(&objects);
        let svc = one(&objects, "Service");
        assert!(selects(&svc["spec"]["selector"], labels), "{name}");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
        if let Some(np) = find(&objects, "NetworkPolicy").first() {
            assert!(selects(&np["spec"]["podSelector"]["matchLabels"], labels));
            assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], "http");
        }
        if let Some(pdb) = find(&objects, "PodDisruptionBudget").first() {
            assert!(selects(&pdb["spec"]["selector"]["matchLabels"], labels));
        }
        if let Some(sm) = find(&objects, "ServiceMonitor").first() {
            assert!(selects(
                &sm["spec"]["selector"]["matchLabels"],
                &svc["metadata"]["labels"]
            ));
            assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
        }
        if let Some(ing) = find(&objects, "Ingress").first() {
            let backend = &ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
            assert_eq!(backend["name"], svc["metadata"]["name"]);
            assert_eq!(backend["port"]["name"], "http");
        }
    }
}

fn pod_labels(objects: &[Value]) -> Value {
    one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].clone()
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Each value reaches the flag or variable it documents, and every flag and variable the
/// chart sets is one `kortex run` knows.
#[test]
fn chart_values_map_to_real_flags_and_variables() {
    use clap::CommandFactory;
    let Some(helm) = helm() else { return };
    let cli = kortex::cli::Cli::command();
    let run_cmd = cli
        .find_subcommand("run")
        .expect("no run subcommand")
        .clone();
    let mut known_env: BTreeSet<String> = run_cmd
        .get_arguments()
        .chain(cli.get_arguments())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    // Read by the logger and the trace exporter (telemetry/), not by clap.
    known_env.insert("RUST_LOG".into());
    known_env.extend(
        kortex::telemetry::export::VARIABLES
            .iter()
            .map(|v| (*v).to_owned()),
    );
    for (name, objects) in renderings(&helm) {
        let c = container(&objects);
        let extra: BTreeSet<&str> = ["HTTPS_PROXY", "NO_PROXY"].into();
        for (var, _) in env(&objects) {
            assert!(
                known_env.contains(&var) || extra.contains(var.as_str()),
                "{name}: the chart sets {var}, which kortex does not read"
            );
        }
        let args: Vec<String> = c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().unwrap_or_default().to_owned())
            .collect();
        let argv = std::iter::once("kortex".to_owned()).chain(args.iter().cloned());
        kortex::cli::Cli::command()
            .try_get_matches_from(argv)
            .unwrap_or_else(|e| panic!("{name}: kortex does not accept {args:?}: {e}"));
    }
    let defaults = template(&helm, &[]);
    assert_eq!(
        env_value(&defaults, "KORTEX_LOG_FORMAT").as_deref(),
        Some("json")
    );
    assert_eq!(env_value(&defaults, "RUST_LOG").as_deref(), Some("info"));
    assert_eq!(
        env_value(&defaults, "DATABASE_URL").as_deref(),
        Some("sqlite:///var/lib/kortex/kortex.db")
    );
    assert_eq!(env_value(&defaults, "KORTEX_PROMETHEUS_URL"), None);
    // Traces are off unless an endpoint is set; then the standard variables say the rest.
    assert_eq!(env_value(&defaults, "OTEL_EXPORTER_OTLP_ENDPOINT"), None);
    let traced = template(&helm, &["-f", VALUES_FILES[1]]);
    assert_eq!(
        env_value(&traced, "OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://otel-collector.observability:4318")
    );
    assert_eq!(
        env_value(&traced, "OTEL_TRACES_SAMPLER_ARG").as_deref(),
        Some("0.25")
    );
    assert_eq!(
        env_value(&traced, "OTEL_RESOURCE_ATTRIBUTES").as_deref(),
        Some("k8s.namespace.name=kortex,k8s.pod.name=$(POD_NAME),deployment.environment.name=ci")
    );
    assert_eq!(
        env(&traced)["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"],
        json!({"name": "otlp-auth", "key": "headers"})
    );
    assert_eq!(env_value(&defaults, "KORTEX_WATCH_NAMESPACE"), None);
    assert_eq!(
        container(&defaults)["image"],
        format!("kortex:{}", env!("CARGO_PKG_VERSION"))
    );
    // The claude-code flavour is the Dockerfile's claude-code target, tagged so.
    let flavoured = template(&helm, &["--set", "image.flavor=claude-code"]);
    assert_eq!(
        container(&flavoured)["image"],
        format!("kortex:{}-claude-code", env!("CARGO_PKG_VERSION"))
    );
    let pinned = template(
        &helm,
        &[
            "--set",
            "image.flavor=claude-code",
            "--set",
            "image.tag=mine",
        ],
    );
    assert_eq!(container(&pinned)["image"], "kortex:mine");
    assert_eq!(
        one(&defaults, "Deployment")["spec"]["strategy"]["type"],
        "Recreate"
    );
    for kind in [
        "Ingress",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "PersistentVolumeClaim",
    ] {
        assert!(find(&defaults, kind).is_empty(), "{kind} is off by default");
    }

    let all = template(&helm, &["-f", VALUES_FILES[1]]);
    let e = |n: &str| env_value(&all, n);
    assert_eq!(
        e("KORTEX_PROMETHEUS_URL").as_deref(),
        Some("http://prometheus-operated.monitoring:9090")
    );
    assert_eq!(e("KORTEX_WATCH_NAMESPACE").as_deref(), Some("team-a"));
    let key = container(&all)["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "KORTEX_ERASURE_KEY")
        .map(|v| v["valueFrom"]["secretKeyRef"].clone());
    assert_eq!(key, Some(json!({"name": "kortex-erasure", "key": "key"})));
    assert_eq!(
        e("KORTEX_CLUSTER_DOMAIN").as_deref(),
        Some("cluster.example")
    );
    assert_eq!(e("KORTEX_LOG_FORMAT").as_deref(), Some("text"));
    assert_eq!(e("RUST_LOG").as_deref(), Some("info,kortex=debug"));
    assert_eq!(
        e("HTTPS_PROXY").as_deref(),
        Some("http://proxy.example:3128")
    );
    assert_eq!(
        container(&all)["args"],
        json!([
            "run",
            "--probe-interval=2m",
            "--auth-proxy-header=X-Forwarded-User",
            "--auth-proxy-groups-header=X-Forwarded-Groups",
            "--auth-proxy-from=10.0.12.0/24",
            "--auth-proxy-from=10.0.13.0/24",
            "--retention-sessions=30d",
            "--retention-failed-runs=30d",
            "--retention-tool-results=7d",
            "--retention-usage=400d",
            "--retention-audit=180d",
            "--retention-max-stored-bytes-per-user=104857600",
            "--cluster-domain=cluster.example"
        ])
    );
    let ingress = one(&all, "Ingress");
    assert_eq!(ingress["spec"]["ingressClassName"], "nginx");
    assert_eq!(ingress["spec"]["tls"][0]["secretName"], "kortex-tls");
    assert_eq!(
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"],
        "off"
    );
    let sm = one(&all, "ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "15s");
    let rule = one(&all, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let alerts: Vec<&Value> = rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(alerts.len(), 5, "{alerts:#?}");
    for a in &alerts {
        assert_eq!(a["for"], "5m");
        assert_eq!(a["labels"]["severity"], "critical");
    }
    assert!(
        alerts
            .iter()
            .any(|a| a["expr"].as_str().is_some_and(|x| x.contains("0.9")))
    );
    let dashboard = one(&all, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "Kortex"
    );
    let np = one(&all, "NetworkPolicy");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "ingress-nginx"
    );
    let pod = &one(&all, "Deployment")["spec"]["template"];
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/team"],
        "platform"
    );
    assert_eq!(pod["spec"]["nodeSelector"]["kubernetes.io/os"], "linux");
    // Alerts can be left out one by one.
    let fewer = template(
        &helm,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "prometheusRule.alerts.budgetNearLimit=false",
        ],
    );
    assert!(
        !one(&fewer, "PrometheusRule")
            .to_string()
            .contains("KortexBudgetNearLimit")
    );
    let lite = template(&helm, &["-f", VALUES_FILES[2]]);
    assert!(find(&lite, "PodDisruptionBudget").is_empty());
    assert_eq!(
        one(&lite, "ServiceAccount")["metadata"]["annotations"]["example.com/owner"],
        "platform"
    );
    assert_eq!(
        one(&lite, "Deployment")["spec"]["template"]["spec"]["imagePullSecrets"],
        json!([{"name": "regcred"}])
    );
}

/// The Grafana dashboard JSON in the chart parses and queries only metrics Kortex exports;
/// the PrometheusRule's alerts likewise.
#[test]
fn chart_dashboard_and_alerts_use_real_metrics() {
    let text =
        std::fs::read_to_string(root().join("charts/kortex/dashboards/kortex.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard");
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 6));
    let rules = std::fs::read_to_string(root().join("charts/kortex/templates/prometheusrule.yaml"))
        .unwrap_or_default();
    let re = regex::Regex::new(r"kortex_[a-z_]+").unwrap();
    let mut used = BTreeSet::new();
    for m in re.find_iter(&text).chain(re.find_iter(&rules)) {
        used.insert(m.as_str().to_owned());
    }
    assert!(used.len() >= 8, "{used:?}");
    for name in &used {
        assert!(
            is_exported(name),
            "{name} is not a metric Kortex exports ({:?})",
            registered_metrics()
        );
    }
}

/// The metric names Kortex registers (`kortex_` + the names in metrics.rs), which is also
/// what docs/metrics.md must describe.
pub fn registered_metrics() -> Vec<String> {
    let source = std::fs::read_to_string(root().join("operator/src/metrics.rs")).unwrap();
    let re = regex::Regex::new(r#"registry\.register\(\s*"([a-z_]+)""#).unwrap();
    re.captures_iter(&source)
        .map(|c| format!("kortex_{}", &c[1]))
        .collect()
}

/// Whether `name` (as a query writes it) is a sample of a registered metric.
fn is_exported(name: &str) -> bool {
    let registered = registered_metrics();
    let base = ["_total", "_bucket", "_sum", "_count", "_info"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    registered.iter().any(|r| r == base || r == name)
}

/// `kubectl kustomize config/default` installs what the chart's defaults do: the same
/// objects (by kind and name) and the same RBAC rules, admission rules, container
/// (image tag, args, env, probes, resources, security) and pod settings.
#[test]
fn config_default_is_the_chart_defaults() {
    let Some(helm) = helm() else { return };
    let Ok(kubectl) = std::env::var("KORTEX_TEST_KUBECTL") else {
        eprintln!(
            "skipping: KORTEX_TEST_KUBECTL is not set (scripts/test.sh sets it when kubectl is installed)"
        );
        return;
    };
    let text = match run(&kubectl, &["kustomize", "config/default"]) {
        Ok(t) => t,
        Err(e) => panic!("kubectl kustomize config/default: {e}"),
    };
    kubernetes_validate(&text, "kubectl kustomize config/default");
    let kustomized = parse(&text, "kubectl kustomize config/default");
    // (The CRDs are crds/'s files, checked above; kustomize writes `100.0` as `100`.)
    for o in kustomized
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
    {
        check(o, "kubectl kustomize config/default");
    }
    let chart = template(&helm, &[]);
    let keys = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .filter(|o| {
                !matches!(
                    o["kind"].as_str(),
                    Some("Namespace" | "CustomResourceDefinition")
                )
            })
            .map(key)
            .collect()
    };
    assert_eq!(keys(&kustomized), keys(&chart));
    // CRDs: the chart installs crds/ (checked byte for byte above); kustomize too.
    assert_eq!(find(&kustomized, "CustomResourceDefinition").len(), 4);

    let by_key = |objects: &[Value]| -> BTreeMap<String, Value> {
        objects.iter().map(|o| (key(o), o.clone())).collect()
    };
    let (k, c) = (by_key(&kustomized), by_key(&chart));
    for (name, object) in &k {
        let Some(other) = c.get(name) else {
            continue; // the Namespace and the CRDs, compared above
        };
        match object["kind"].as_str().unwrap_or_default() {
            "ClusterRole" | "Role" => assert_eq!(object["rules"], other["rules"], "{name}"),
            "ClusterRoleBinding" | "RoleBinding" => {
                assert_eq!(object["roleRef"], other["roleRef"], "{name}");
                assert_eq!(object["subjects"], other["subjects"], "{name}");
            }
            "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding" => {
                assert_eq!(object["spec"], other["spec"], "{name}")
            }
            "Deployment" => {
                let (a, b) = (&object["spec"], &other["spec"]);
                assert_eq!(a["replicas"], b["replicas"]);
                assert_eq!(a["strategy"], b["strategy"]);
                let (pa, pb) = (&a["template"]["spec"], &b["template"]["spec"]);
                for field in [
                    "serviceAccountName",
                    "securityContext",
                    "volumes",
                    "terminationGracePeriodSeconds",
                ] {
                    assert_eq!(pa[field], pb[field], "Deployment pod {field}");
                }
                let (ca, cb) = (&pa["containers"][0], &pb["containers"][0]);
                for field in [
                    "name",
                    "image",
                    "imagePullPolicy",
                    "args",
                    "env",
                    "ports",
                    "readinessProbe",
                    "livenessProbe",
                    "resources",
                    "securityContext",
                    "volumeMounts",
                ] {
                    assert_eq!(ca[field], cb[field], "Deployment container {field}");
                }
            }
            "Service" => {
                assert_eq!(object["spec"]["ports"], other["spec"]["ports"]);
                assert_eq!(object["spec"]["type"], other["spec"]["type"]);
            }
            "PodDisruptionBudget" => {
                assert_eq!(
                    object["spec"]["maxUnavailable"],
                    other["spec"]["maxUnavailable"]
                );
                assert_eq!(
                    object["spec"]["minAvailable"],
                    other["spec"]["minAvailable"]
                );
            }
            "NetworkPolicy" => {
                assert_eq!(object["spec"]["ingress"], other["spec"]["ingress"]);
                assert_eq!(object["spec"]["policyTypes"], other["spec"]["policyTypes"]);
            }
            "ServiceAccount" => {}
            other => panic!("{name}: {other} not compared"),
        }
    }
    // Both run in the namespace kortex.
    assert!(kustomized.iter().any(|o| key(o) == "Namespace/kortex"));
}

/// The Dockerfile (not built here: no container engine) keeps its promises on paper: both
/// binaries, a locked static (musl) build with a dependency layer, a non-root distroless
/// base, and a .dockerignore that lets in everything the build includes.
#[test]
fn dockerfile_builds_both_binaries_statically_as_non_root() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap_or_default();
    for needle in [
        "--locked",
        "unknown-linux-musl",
        "COPY Cargo.toml Cargo.lock ./",
        "release/kortex\"",
        "release/kubectl-kortex\"",
        "distroless/static",
        "USER 65532:65532",
        "ENTRYPOINT [\"/usr/local/bin/kortex\"]",
    ] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle}");
    }
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap_or_default();
    // What the sources include at compile time must be in the build context.
    for path in [
        "operator/src/**",
        "operator/assets/**",
        "migrations/**",
        "Cargo.lock",
    ] {
        assert!(
            ignore.contains(&format!("!{path}")),
            ".dockerignore must let in {path}"
        );
    }
    let sources =
        std::fs::read_to_string(root().join("operator/src/http/dashboard.rs")).unwrap_or_default();
    assert!(sources.contains("../../assets/dashboard/"));
}

/// The chart's admission policy, as rendered for the default release and for another
/// release in another namespace: every expression evaluates on requests shaped as the API
/// server builds them, and the trust rules hold for the ServiceAccount the chart runs
/// Kortex as (admission.rs has the requests and the rules).
#[test]
fn chart_admission_policy_evaluates_and_enforces_the_trust_rules() {
    use super::admission::{Policy, User, enforces_the_trust_rules, evaluates_everywhere};
    let Some(helm) = helm() else { return };
    for (release, namespace) in [("kortex", NAMESPACE), ("ops", "platform")] {
        let text = run(
            &helm,
            &["template", release, CHART, "--namespace", namespace],
        )
        .unwrap_or_else(|e| panic!("helm template {release}: {e}"));
        let objects = parse(&text, &format!("helm template {release}"));
        let sa = one(&objects, "ServiceAccount")["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let policy = Policy::from_object(one(&objects, "ValidatingAdmissionPolicy"));
        evaluates_everywhere(&policy);
        enforces_the_trust_rules(&policy, &User::service_account(namespace, &sa));
    }
}
