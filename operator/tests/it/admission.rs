//! The ValidatingAdmissionPolicy shipped in `config/admission/policy.yaml` (and rendered by
//! the chart, see `chart.rs`), evaluated with the Kubernetes CEL libraries (kube-cel) the
//! way the API server evaluates it: variables in order, then every validation, and a
//! failed validation's `messageExpression`; a request is denied when any validation is
//! false or any expression fails (`failurePolicy: Fail`).
//!
//! The inputs are shaped as the API server builds them, because that is where a policy
//! that passed a hand-written test broke on a real cluster: `request` is the
//! `admission/v1` `AdmissionRequest` turned into a map with omitempty honoured
//! (`subResource` is absent, not `""`, on the main resource; a user without uid, groups
//! or extra has no such keys), `oldObject` is null on CREATE, and objects carry only the
//! keys that were written (no `labels` or `annotations` unless set; a nullable field may
//! be present as null). Every expression is evaluated against every combination of
//! request and object shapes, and none may fail to evaluate. (The e2e suite checks the
//! same rules against a real API server.)

use kube_cel::KubeCelExt;
use kube_cel::cel::{self, Context, Program, Value as CelValue};
use serde_json::{Map, Value, json};

/// The ServiceAccount the shipped policy trusts.
pub const KORTEX: &str = "system:serviceaccount:kortex:kortex";

/// A compiled ValidatingAdmissionPolicy.
pub struct Policy {
    variables: Vec<(String, Program, String)>,
    validations: Vec<Validation>,
}

struct Validation {
    source: String,
    expression: Program,
    message: String,
    message_expression: Option<Program>,
}

impl Policy {
    /// Compiles the expressions of a `ValidatingAdmissionPolicy` object.
    pub fn from_object(vap: &Value) -> Self {
        assert_eq!(vap["kind"], "ValidatingAdmissionPolicy");
        let compile = |e: &Value| {
            let source = e.as_str().unwrap_or_else(|| panic!("expression: {e}"));
            Program::compile(source).unwrap_or_else(|e| panic!("{source}: {e:?}"))
        };
        let variables = vap["spec"]["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or_default().to_owned(),
                    compile(&v["expression"]),
                    v["expression"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let validations = vap["spec"]["validations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| Validation {
                source: v["expression"].as_str().unwrap_or_default().to_owned(),
                expression: compile(&v["expression"]),
                message: v["message"].as_str().unwrap_or_default().to_owned(),
                message_expression: v.get("messageExpression").map(compile),
            })
            .collect();
        Self {
            variables,
            validations,
        }
    }

    /// What the API server answers: `Ok(denial messages)` (empty: admitted), or the
    /// expressions that failed to evaluate (which the API server turns into a denial
    /// "expression '…' resulted in error: …").
    pub fn review(
        &self,
        request: &Value,
        object: &Value,
        old: Option<&Value>,
    ) -> Result<Vec<String>, Vec<String>> {
        let mut ctx = Context::default().with_all();
        let value = |v: &Value| cel::to_value(v).unwrap();
        ctx.add_variable_from_value("request", value(request));
        ctx.add_variable_from_value("object", value(object));
        ctx.add_variable_from_value("oldObject", old.map_or(CelValue::Null, value));
        let mut errors = Vec::new();
        let mut variables = std::collections::HashMap::<String, CelValue>::new();
        for (name, program, source) in &self.variables {
            match program.execute(&ctx) {
                Ok(v) => {
                    variables.insert(name.clone(), v);
                }
                Err(e) => errors.push(format!("variable {name} '{source}': {e:?}")),
            }
            ctx.add_variable_from_value("variables", CelValue::from(variables.clone()));
        }
        let mut denied = Vec::new();
        for v in &self.validations {
            match v.expression.execute(&ctx) {
                Ok(CelValue::Bool(true)) => {}
                Ok(CelValue::Bool(false)) => match &v.message_expression {
                    Some(m) => match m.execute(&ctx) {
                        Ok(CelValue::String(s)) => denied.push(s.to_string()),
                        other => {
                            errors.push(format!("messageExpression of '{}': {other:?}", v.source))
                        }
                    },
                    None => denied.push(v.message.clone()),
                },
                other => errors.push(format!("'{}': {other:?}", v.source)),
            }
        }
        if errors.is_empty() {
            Ok(denied)
        } else {
            Err(errors)
        }
    }

    /// [`Policy::review`] that must evaluate cleanly.
    pub fn admit(&self, request: &Value, object: &Value, old: Option<&Value>) -> Vec<String> {
        self.review(request, object, old)
            .unwrap_or_else(|errors| panic!("evaluation errors for {request}:\n{errors:#?}"))
    }
}

/// The shipped policy (`config/admission/policy.yaml`).
pub fn shipped() -> Policy {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/admission/policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc = text.split("\n---\n").next().unwrap_or_default();
    let vap: Value = serde_saphyr::from_str(doc).unwrap();
    Policy::from_object(&vap)
}

/// Who sends a request, as the API server's authenticators describe them (the
/// `user.Info` that becomes `request.userInfo`).
#[derive(Clone, Debug)]
pub struct User {
    /// What kind of credential (for messages).
    pub how: &'static str,
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: Map<String, Value>,
}

impl User {
    /// A ServiceAccount token from a pod (bound token: uid and the pod in `extra`).
    pub fn service_account(namespace: &str, name: &str) -> Self {
        let extra = json!({
            "authentication.kubernetes.io/credential-id": ["JTI=5b5c4a61-2f5e-4d42-9a0e-4b9f3c1d2e3f"],
            "authentication.kubernetes.io/node-name": ["node-1"],
            "authentication.kubernetes.io/node-uid": ["9c2b0a6e-3d2b-4b5e-8f7a-1a2b3c4d5e6f"],
            "authentication.kubernetes.io/pod-name": [format!("{name}-7d9f8b6c5d-x2x4z")],
            "authentication.kubernetes.io/pod-uid": ["0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"],
        });
        Self {
            how: "ServiceAccount token",
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: Some("3f0c6e0e-8c1a-4b8e-9d7e-2b4a6c8e0f12".into()),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: extra.as_object().cloned().unwrap_or_default(),
        }
    }

    /// A client certificate: CN the username, O the groups; no uid.
    pub fn x509(cn: &str, orgs: &[&str]) -> Self {
        let mut groups: Vec<String> = orgs.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".into());
        let extra = json!({"authentication.kubernetes.io/credential-id": ["X509SHA256=4d3c2b1a"]});
        Self {
            how: "client certificate",
            username: cn.to_owned(),
            uid: None,
            groups,
            extra: extra.as_object().cloned().unwrap_or_default(),
        }
    }

    /// An OIDC token with the usual `oidc:` prefixes; neither uid nor extra.
    pub fn oidc(email: &str, groups: &[&str]) -> Self {
        let mut all: Vec<String> = groups.iter().map(|g| format!("oidc:{g}")).collect();
        all.push("system:authenticated".into());
        Self {
            how: "OIDC token",
            username: format!("oidc:{email}"),
            uid: None,
            groups: all,
            extra: Map::new(),
        }
    }

    /// A user from an authenticator that names no group at all (a webhook or a front
    /// proxy may): `groups` is absent from the request.
    pub fn bare(name: &str) -> Self {
        Self {
            how: "authenticator with no groups",
            username: name.to_owned(),
            uid: None,
            groups: Vec::new(),
            extra: Map::new(),
        }
    }

    /// Its username as written in a decision.
    pub fn name(&self) -> &str {
        &self.username
    }

    /// `request.userInfo`: `authentication/v1.UserInfo`, every field omitempty.
    fn user_info(&self) -> Value {
        let mut info = Map::new();
        if !self.username.is_empty() {
            info.insert("username".into(), json!(self.username));
        }
        if let Some(uid) = &self.uid {
            info.insert("uid".into(), json!(uid));
        }
        if !self.groups.is_empty() {
            info.insert("groups".into(), json!(self.groups));
        }
        if !self.extra.is_empty() {
            info.insert("extra".into(), Value::Object(self.extra.clone()));
        }
        Value::Object(info)
    }
}

/// The operation and subresource of a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    Update,
    UpdateStatus,
}

/// `request` as the API server builds it for a policy (`CreateAdmissionRequest`, then
/// `ToUnstructured`): `uid` is always there (empty: policies get no request uid),
/// `subResource` and `requestSubResource` only for a subresource, `name` only when known,
/// `dryRun` always (a pointer), `options` the operation's options.
pub fn request(user: &User, op: Op, object: &Value) -> Value {
    let gvk = json!({"group": "kortex.dev", "version": "v1alpha1", "kind": "ActionProposal"});
    let gvr = json!({"group": "kortex.dev", "version": "v1alpha1", "resource": "actionproposals"});
    let (operation, options) = match op {
        Op::Create => (
            "CREATE",
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kortex"}),
        ),
        Op::Update | Op::UpdateStatus => (
            "UPDATE",
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-patch"}),
        ),
    };
    let mut r = json!({
        "uid": "",
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "operation": operation,
        "userInfo": user.user_info(),
        "dryRun": false,
        "options": options,
    });
    if op == Op::UpdateStatus {
        r["subResource"] = json!("status");
        r["requestSubResource"] = json!("status");
    }
    if let Some(name) = object["metadata"]["name"].as_str() {
        r["name"] = json!(name);
    }
    if let Some(ns) = object["metadata"]["namespace"].as_str() {
        r["namespace"] = json!(ns);
    }
    r
}

/// A proposal as Kortex creates it: labels, annotations, every optional field Kortex
/// writes, no status (the status subresource drops it on CREATE).
pub fn proposal() -> Value {
    json!({"apiVersion": "kortex.dev/v1alpha1", "kind": "ActionProposal",
        "metadata": {"name": "restart-api-x", "namespace": "shop",
            "uid": "6a1f0e1c-0b2d-4c3e-9f4a-5b6c7d8e9f00", "generation": 1,
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"kortex.dev/session": "s1", "kortex.dev/require-distinct-approver": "true"},
            "annotations": {"kortex.dev/proposal-id": "id1", "kortex.dev/approver-groups": "sre,admins"}},
        "spec": {"action": "restart", "rationale": "r", "blastRadius": "one Deployment", "reversible": false,
            "model": {"provider": "local", "model": "m"},
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "api"},
            "session": {"id": "s1", "name": "incident-1", "user": "alice"}}})
}

fn with_phase(p: &Value, phase: &str) -> Value {
    let mut p = p.clone();
    p["status"] = json!({"phase": phase, "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": phase, "message": "",
            "lastTransitionTime": "2026-11-25T10:00:01Z", "observedGeneration": 1}]});
    p
}

fn decided(p: &Value, by: &str, groups: Option<Value>) -> Value {
    let mut d = p.clone();
    d["spec"]["decision"] = json!({"verdict": "Approve", "by": by});
    if let Some(g) = groups {
        d["spec"]["decision"]["groups"] = g;
    }
    d
}

/// The object shapes a real API server can hand the policy for one proposal: as Kortex
/// writes it, with no labels or annotations (a proposal written by an older Kortex or by
/// hand), with nullable fields present as null, and with or without a status or decision.
fn shapes() -> Vec<(&'static str, Value)> {
    let full = proposal();
    let mut bare = full.clone();
    if let Some(m) = bare["metadata"].as_object_mut() {
        m.remove("labels");
        m.remove("annotations");
    }
    if let Some(s) = bare["spec"].as_object_mut() {
        for k in ["blastRadius", "reversible", "model", "target", "params"] {
            s.remove(k);
        }
    }
    let mut nulls = full.clone();
    for k in ["blastRadius", "reversible", "model", "target", "decision"] {
        nulls["spec"][k] = Value::Null;
    }
    let mut empty_status = full.clone();
    empty_status["status"] = json!({});
    let mut null_status = full.clone();
    null_status["status"] = Value::Null;
    let mut undo = with_phase(&full, "Succeeded");
    undo["metadata"]["annotations"]["kortex.dev/undo-requested-by"] = json!("bob");
    vec![
        ("as created", full.clone()),
        ("no labels, annotations or optional fields", bare.clone()),
        ("nullable fields null", nulls.clone()),
        ("empty status", empty_status),
        ("null status", null_status),
        ("pending", with_phase(&full, "Pending")),
        ("pending, bare", with_phase(&bare, "Pending")),
        ("pending, nulls", with_phase(&nulls, "Pending")),
        (
            "decided",
            decided(&with_phase(&full, "Pending"), "bob", Some(json!(["sre"]))),
        ),
        (
            "decided, bare",
            decided(&with_phase(&bare, "Pending"), "bob", None),
        ),
        ("decision with null reason", {
            let mut d = decided(&with_phase(&nulls, "Pending"), "bob", None);
            d["spec"]["decision"]["reason"] = Value::Null;
            d
        }),
        ("undo requested", undo),
    ]
}

/// Everyone who may send a request about a proposal.
fn users() -> Vec<User> {
    vec![
        User::service_account("kortex", "kortex"),
        User::service_account("shop", "ci-bot"),
        User::x509("kubernetes-admin", &["system:masters"]),
        User::x509("bob", &["sre"]),
        User::x509("alice", &[]),
        User::oidc("bob@example.com", &["sre"]),
        User::bare("bob"),
        User {
            how: "anonymous",
            username: "system:anonymous".into(),
            uid: None,
            groups: vec!["system:unauthenticated".into()],
            extra: Map::new(),
        },
    ]
}

/// Every expression of `policy` evaluates (to a verdict, never an error) for every user,
/// operation, subresource and object shape; returns how many requests were reviewed.
pub fn evaluates_everywhere(policy: &Policy) -> usize {
    let shapes = shapes();
    let mut reviewed = 0;
    let mut failures = Vec::new();
    for user in users() {
        for (name, object) in &shapes {
            let create = request(&user, Op::Create, object);
            if let Err(e) = policy.review(&create, object, None) {
                failures.push(format!("{} CREATE {name}: {e:?}", user.how));
            }
            reviewed += 1;
            for (old_name, old) in &shapes {
                for op in [Op::Update, Op::UpdateStatus] {
                    let r = request(&user, op, object);
                    if let Err(e) = policy.review(&r, object, Some(old)) {
                        failures.push(format!(
                            "{} ({}) {op:?} {old_name} -> {name}: {e:?}",
                            user.how, user.username
                        ));
                    }
                    reviewed += 1;
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {reviewed} reviews failed to evaluate (the API server would refuse them with an error), e.g.:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    reviewed
}

/// The trust rules hold for the policy trusting `kortex`, whichever way users sign in.
pub fn enforces_the_trust_rules(policy: &Policy, kortex: &User) {
    let kortex_writes = |op, object: &Value, old: Option<&Value>| {
        policy.admit(&request(kortex, op, object), object, old)
    };
    let p = proposal();
    let pending = with_phase(&p, "Pending");
    // Kortex creates, writes status, links an undo proposal.
    assert_eq!(kortex_writes(Op::Create, &p, None), Vec::<String>::new());
    assert_eq!(
        kortex_writes(Op::UpdateStatus, &pending, Some(&p)),
        Vec::<String>::new()
    );
    let mut approved = pending.clone();
    approved["status"]["phase"] = json!("Approved");
    assert_eq!(
        kortex_writes(Op::UpdateStatus, &approved, Some(&pending)),
        Vec::<String>::new()
    );
    let done = with_phase(&p, "Succeeded");
    let mut linked = done.clone();
    linked["metadata"]["annotations"]["kortex.dev/undo-proposal"] = json!("undo-x");
    assert_eq!(
        kortex_writes(Op::Update, &linked, Some(&done)),
        Vec::<String>::new()
    );

    for person in [
        User::x509("bob", &["sre"]),
        User::oidc("bob@example.com", &["sre"]),
        User::service_account("oncall", "bob"),
    ] {
        let how = person.how;
        let admit = |op, object: &Value, old: Option<&Value>| {
            policy.admit(&request(&person, op, object), object, old)
        };
        let member = |p: &User| {
            p.groups
                .iter()
                .find(|g| g.ends_with("sre"))
                .cloned()
                .unwrap_or_else(|| "system:serviceaccounts".into())
        };
        // The approver groups are the person's own (an OIDC user's are prefixed).
        let mut p = p.clone();
        p["metadata"]["annotations"]["kortex.dev/approver-groups"] =
            json!(format!("{},admins", member(&person)));
        let pending = with_phase(&p, "Pending");
        let mut approved = pending.clone();
        approved["status"]["phase"] = json!("Approved");
        let done = with_phase(&p, "Succeeded");
        // Approving as oneself on the main resource: admitted (the bug that shipped:
        // request.subResource is absent here, and the policy failed to evaluate).
        let all_groups = Some(json!(person.groups));
        let ok = decided(&pending, person.name(), all_groups.clone());
        assert_eq!(
            admit(Op::Update, &ok, Some(&pending)),
            Vec::<String>::new(),
            "{how}: approving as oneself"
        );
        // An approval without the approver's groups (a plain `kubectl patch`), or with only
        // some: refused when written, not at execution (issue 44: "kubernetes-admin may not
        // patch deployments" minutes later, the groups that grant it left out).
        let needs_groups = "an approval must list all your groups in spec.decision.groups: Kortex checks with them that you may carry out the action yourself before it executes. Approve with kubectl kortex approve NAME -n NAMESPACE (or the dashboard), which fills them in";
        for (what, groups) in [
            ("without groups", None),
            ("with some of them", Some(json!([member(&person)]))),
        ] {
            let partial = decided(&pending, person.name(), groups);
            assert_eq!(
                admit(Op::Update, &partial, Some(&pending)),
                [needs_groups],
                "{how}: an approval {what}"
            );
        }
        // A rejection executes nothing: it needs no groups.
        let mut rejected = decided(&pending, person.name(), None);
        rejected["spec"]["decision"]["verdict"] = json!("Reject");
        assert_eq!(
            admit(Op::Update, &rejected, Some(&pending)),
            Vec::<String>::new(),
            "{how}: a rejection without groups"
        );
        // Creating a proposal or forging its status.
        assert_eq!(
            admit(Op::Create, &p, None),
            ["only Kortex's ServiceAccount creates ActionProposals"],
            "{how}"
        );
        assert_eq!(
            admit(Op::UpdateStatus, &approved, Some(&pending)),
            ["only Kortex writes the status of an ActionProposal"],
            "{how}"
        );
        // In someone else's name.
        let forged = decided(&pending, "mallory", all_groups.clone());
        assert_eq!(
            admit(Op::Update, &forged, Some(&pending)),
            [format!(
                "spec.decision.by must be your own username: {}",
                person.name()
            )],
            "{how}"
        );
        // Claiming a group one is not in.
        let mut claimed = person.groups.clone();
        claimed.push("admins".into());
        let claims = decided(&pending, person.name(), Some(json!(claimed)));
        assert_eq!(
            admit(Op::Update, &claims, Some(&pending)),
            ["spec.decision.groups may only name groups you belong to"],
            "{how}"
        );
        // Too late: no longer Pending (or no status at all).
        for old in [with_phase(&p, "Expired"), p.clone()] {
            let late = decided(&old, person.name(), all_groups.clone());
            assert_eq!(
                admit(Op::Update, &late, Some(&old)),
                ["a decision can be written only while the proposal is Pending"],
                "{how}"
            );
        }
        // An undo request in one's own name; nothing else.
        let mut undo = done.clone();
        undo["metadata"]["annotations"]["kortex.dev/undo-requested-by"] = json!(person.name());
        assert_eq!(
            admit(Op::Update, &undo, Some(&done)),
            Vec::<String>::new(),
            "{how}: undo"
        );
        let mut relabelled = done.clone();
        relabelled["metadata"]["labels"]["kortex.dev/require-distinct-approver"] = json!("false");
        assert_eq!(
            admit(Op::Update, &relabelled, Some(&done)),
            ["only Kortex changes the labels of an ActionProposal"],
            "{how}"
        );
        let mut unlabelled = done.clone();
        if let Some(m) = unlabelled["metadata"].as_object_mut() {
            m.remove("labels");
        }
        assert_eq!(
            admit(Op::Update, &unlabelled, Some(&done)),
            ["only Kortex changes the labels of an ActionProposal"],
            "{how}: removing every label"
        );
    }

    // The proposer may not decide when the policy requires someone else.
    let alice = User::x509("alice", &["sre"]);
    let own = decided(&pending, "alice", Some(json!(alice.groups)));
    assert_eq!(
        policy.admit(&request(&alice, Op::Update, &own), &own, Some(&pending)),
        ["the policy requires someone other than the proposer to decide"]
    );
    // Outside approverGroups; with no groups at all.
    for outsider in [User::x509("carol", &["dev"]), User::bare("carol")] {
        let d = decided(&pending, "carol", Some(json!(outsider.groups)));
        assert_eq!(
            policy.admit(&request(&outsider, Op::Update, &d), &d, Some(&pending)),
            ["only members of sre,admins may decide this proposal"],
            "{}",
            outsider.how
        );
    }
    // A proposal without labels or annotations: any authenticated person may decide it as
    // themselves (RBAC decides who may patch it), but still only while Pending.
    let mut bare = pending.clone();
    if let Some(m) = bare["metadata"].as_object_mut() {
        m.remove("labels");
        m.remove("annotations");
    }
    let d = decided(&bare, "alice", Some(json!(alice.groups)));
    assert_eq!(
        policy.admit(&request(&alice, Op::Update, &d), &d, Some(&bare)),
        Vec::<String>::new()
    );
    // Someone else's ServiceAccount is a person here, not Kortex.
    let other = User::service_account("shop", "kortex");
    assert_eq!(
        policy.admit(&request(&other, Op::Create, &p), &p, None),
        ["only Kortex's ServiceAccount creates ActionProposals"]
    );
}

#[test]
fn every_expression_evaluates_on_requests_shaped_as_the_api_server_builds_them() {
    let reviewed = evaluates_everywhere(&shipped());
    assert!(reviewed > 1000, "{reviewed}");
}

#[test]
fn the_shipped_policy_enforces_the_trust_rules() {
    enforces_the_trust_rules(&shipped(), &User::service_account("kortex", "kortex"));
}

/// The checks above catch the bug that shipped: a policy reading `request.subResource`
/// without `has()` fails to evaluate on every write to the main resource.
#[test]
fn an_unguarded_optional_key_is_caught() {
    let vap = json!({"kind": "ValidatingAdmissionPolicy", "spec": {
        "variables": [{"name": "kortex", "expression": format!("request.userInfo.username == '{KORTEX}'")}],
        "validations": [{"expression": "request.subResource != 'status' || variables.kortex",
            "message": "only Kortex writes the status"}]}});
    let policy = Policy::from_object(&vap);
    let bob = User::x509("bob", &["sre"]);
    let pending = with_phase(&proposal(), "Pending");
    let d = decided(&pending, "bob", None);
    let Err(errors) = policy.review(&request(&bob, Op::Update, &d), &d, Some(&pending)) else {
        panic!("request.subResource is absent on the main resource: this must fail to evaluate");
    };
    assert!(
        errors.iter().any(|e| e.contains("subResource")),
        "{errors:?}"
    );
    let caught = std::panic::catch_unwind(|| evaluates_everywhere(&policy));
    assert!(caught.is_err(), "the matrix must fail on this policy");
    // The same for a user without groups, and a missing label map.
    for (expression, user) in [
        ("'sre' in request.userInfo.groups", User::bare("bob")),
        ("request.userInfo.uid != ''", User::x509("bob", &["sre"])),
    ] {
        let vap = json!({"kind": "ValidatingAdmissionPolicy", "spec": {
            "validations": [{"expression": expression, "message": "m"}]}});
        let policy = Policy::from_object(&vap);
        assert!(
            policy
                .review(&request(&user, Op::Update, &d), &d, Some(&pending))
                .is_err(),
            "{expression} must fail for a {}",
            user.how
        );
    }
    let vap = json!({"kind": "ValidatingAdmissionPolicy", "spec": {
        "validations": [{"expression": "object.metadata.labels.size() >= 0", "message": "m"}]}});
    assert!(
        std::panic::catch_unwind(|| evaluates_everywhere(&Policy::from_object(&vap))).is_err(),
        "objects without labels are among the shapes"
    );
}
