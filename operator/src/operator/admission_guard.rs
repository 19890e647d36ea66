//! Whether the API server enforces the trust rules of ActionProposals before Kortex acts on
//! a decision. `spec.decision.by` and `groups` are authenticated only by the admission
//! policy (`config/admission/policy.yaml`); without it anyone allowed to patch a proposal
//! could write a decision in the name of someone with more rights, and the approver
//! SubjectAccessReview would vouch for that name. So the leader executes a proposal only
//! while a ValidatingAdmissionPolicy with the shipped rules, trusting Kortex's own
//! identity, is bound with `Deny` to the proposal's namespace; otherwise the proposal stops
//! at `Approved`, saying why, and `kortex_admission_policy_enforced` is 0.
//!
//! The comparison is pure ([`unenforced`]); [`AdmissionGuard`] reads the policies, bindings,
//! Kortex's own username (a SelfSubjectReview) and, when a binding selects namespaces, the
//! namespace's labels, at most every [`REFRESH`].

use super::error::Error;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// The shipped policy, compiled in: the rules a policy on the cluster must carry.
const SHIPPED_POLICY: &str = include_str!("../../../config/admission/policy.yaml");
/// The username the shipped policy trusts; replaced by Kortex's own when comparing.
const SHIPPED_USER: &str = "system:serviceaccount:kortex:kortex";
/// How long a reading of the cluster's policies is used.
const REFRESH: Duration = Duration::from_secs(30);

/// The rules a policy must carry, for Kortex's username.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    variables: Vec<(String, String)>,
    validations: Vec<Value>,
}

/// The shipped rules with `kortex_user` as the trusted identity.
fn expected(kortex_user: &str) -> Result<Expected, String> {
    let doc = SHIPPED_POLICY
        .split("\n---\n")
        .next()
        .ok_or("the shipped admission policy is empty")?;
    let vap: Value = serde_saphyr::from_str(doc)
        .map_err(|e| format!("the shipped admission policy does not parse: {e}"))?;
    let variables = vap["spec"]["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_owned(),
                v["expression"]
                    .as_str()
                    .unwrap_or_default()
                    .replace(SHIPPED_USER, kortex_user),
            )
        })
        .collect();
    let validations = vap["spec"]["validations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(Expected {
        variables,
        validations,
    })
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`; an
/// absent or empty selector selects everything.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expression = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let value = labels.get(key).map(String::as_str);
            match e["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                _ => false,
            }
        });
    by_label && by_expression
}

fn is_empty_selector(selector: &Value) -> bool {
    selector.is_null()
        || selector.as_object().is_some_and(|o| {
            o.get("matchLabels")
                .is_none_or(|m| m.as_object().is_none_or(|m| m.is_empty()))
                && o.get("matchExpressions")
                    .is_none_or(|m| m.as_array().is_none_or(|m| m.is_empty()))
        })
}

fn has_items(v: &Value) -> bool {
    v.as_array().is_some_and(|a| !a.is_empty())
}

fn contains_any(list: &Value, wanted: &[&str]) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|s| s == "*" || wanted.contains(&s))
}

/// Why `policy` does not carry the expected rules for every proposal write, if it does not.
fn policy_differs(policy: &Value, expected: &Expected) -> Option<String> {
    let spec = &policy["spec"];
    if spec["failurePolicy"].as_str().unwrap_or("Fail") != "Fail" {
        return Some("its failurePolicy is not Fail".into());
    }
    if !spec["paramKind"].is_null() || has_items(&spec["matchConditions"]) {
        return Some("it has paramKind or matchConditions".into());
    }
    let variables: Vec<(String, String)> = spec["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_owned(),
                v["expression"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    if variables != expected.variables {
        return Some(
            "its variables are not the shipped ones for Kortex's ServiceAccount (does it trust another identity?)"
                .into(),
        );
    }
    let validations: Vec<&Value> = spec["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let same = |a: &Value, b: &Value| {
        ["expression", "message", "messageExpression", "reason"]
            .iter()
            .all(|k| a[*k] == b[*k])
    };
    if let Some(missing) = expected
        .validations
        .iter()
        .find(|e| !validations.iter().any(|v| same(v, e)))
    {
        return Some(format!(
            "it lacks the rule '{}'",
            missing["message"]
                .as_str()
                .or(missing["messageExpression"].as_str())
                .or(missing["expression"].as_str())
                .unwrap_or_default()
        ));
    }
    let constraints = &spec["matchConstraints"];
    if !is_empty_selector(&constraints["namespaceSelector"])
        || !is_empty_selector(&constraints["objectSelector"])
        || has_items(&constraints["excludeResourceRules"])
    {
        return Some("its matchConstraints leave some proposals out".into());
    }
    let covers = |resource: &str| {
        constraints["resourceRules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| {
                contains_any(&r["apiGroups"], &["kortex.dev"])
                    && contains_any(&r["resources"], &[resource])
                    && ["CREATE", "UPDATE"]
                        .iter()
                        .all(|op| contains_any(&r["operations"], &[op]))
            })
    };
    if !covers("actionproposals") || !covers("actionproposals/status") {
        return Some(
            "it does not match CREATE and UPDATE of actionproposals and actionproposals/status"
                .into(),
        );
    }
    None
}

/// Why `binding` (of the policy in question) does not apply it with `Deny` to proposals in
/// a namespace with `labels` (`None` for the labels: only a binding for every namespace
/// will do).
fn binding_differs(binding: &Value, labels: Option<&BTreeMap<String, String>>) -> Option<String> {
    let spec = &binding["spec"];
    let denies = spec["validationActions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "Deny"));
    if !denies {
        return Some(format!(
            "binding {} does not Deny",
            binding["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    let matches = &spec["matchResources"];
    if !is_empty_selector(&matches["objectSelector"])
        || has_items(&matches["excludeResourceRules"])
        || has_items(&matches["resourceRules"])
        || !spec["paramRef"].is_null()
    {
        return Some(format!(
            "binding {} leaves some proposals out",
            binding["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    let namespaces = &matches["namespaceSelector"];
    let covered = match labels {
        _ if is_empty_selector(namespaces) => true,
        Some(labels) => selects(namespaces, labels),
        None => false,
    };
    if !covered {
        return Some(format!(
            "binding {} does not select the namespace",
            binding["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    None
}

/// Why proposals in a namespace with `labels` (`None`: in every namespace) are not guarded
/// by the admission policy, or `None` when they are: some policy with the expected rules
/// is bound with `Deny` there.
pub fn unenforced(
    expected: &Expected,
    policies: &[Value],
    bindings: &[Value],
    labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let mut reasons = Vec::new();
    for policy in policies {
        let name = policy["metadata"]["name"].as_str().unwrap_or_default();
        let about_proposals = policy["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| contains_any(&r["resources"], &["actionproposals"]));
        if !about_proposals {
            continue;
        }
        if let Some(why) = policy_differs(policy, expected) {
            reasons.push(format!("ValidatingAdmissionPolicy {name}: {why}"));
            continue;
        }
        let bound: Vec<Option<String>> = bindings
            .iter()
            .filter(|b| b["spec"]["policyName"].as_str() == Some(name))
            .map(|b| binding_differs(b, labels))
            .collect();
        if bound.iter().any(Option::is_none) {
            return None;
        }
        if bound.is_empty() {
            reasons.push(format!(
                "ValidatingAdmissionPolicy {name} has no ValidatingAdmissionPolicyBinding"
            ));
        }
        reasons.extend(
            bound
                .into_iter()
                .flatten()
                .map(|why| format!("{name}: {why}")),
        );
    }
    if reasons.is_empty() {
        reasons.push("no ValidatingAdmissionPolicy for actionproposals is installed".into());
    }
    Some(format!(
        "the admission policy that authenticates decisions is not enforced ({}); install config/admission or the chart's admissionPolicy",
        reasons.join("; ")
    ))
}

/// What the guard last read of the cluster.
#[derive(Clone, Debug)]
struct Reading {
    expected: Expected,
    policies: Vec<Value>,
    bindings: Vec<Value>,
}

/// Reads and caches the cluster's admission policies for the leader.
#[derive(Clone)]
pub struct AdmissionGuard {
    client: kube::Client,
    cache: Arc<Mutex<Option<(Instant, Reading)>>>,
}

impl AdmissionGuard {
    /// A guard reading with `client` (Kortex's own identity).
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Arc::default(),
        }
    }

    async fn read(&self) -> Result<Reading, Error> {
        let mut cache = self.cache.lock().await;
        if let Some((at, reading)) = cache.as_ref()
            && at.elapsed() < REFRESH
        {
            return Ok(reading.clone());
        }
        // A failed reading is not kept: the next check asks the API server again.
        let reading = self.fetch().await?;
        *cache = Some((Instant::now(), reading.clone()));
        Ok(reading)
    }

    async fn fetch(&self) -> Result<Reading, Error> {
        let review = Api::<SelfSubjectReview>::all(self.client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(Error::api(
                "cannot tell Kortex's own username (SelfSubjectReview)",
            ))?;
        let user = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .ok_or(Error::Unusable(
                "the API server did not say who Kortex is (SelfSubjectReview)".into(),
            ))?;
        let list = |kind: &str, plural: &str| {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
                plural,
            );
            Api::<DynamicObject>::all_with(self.client.clone(), &resource)
        };
        let values = |items: Vec<DynamicObject>| -> Vec<Value> {
            items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect()
        };
        let policies = list("ValidatingAdmissionPolicy", "validatingadmissionpolicies")
            .list(&ListParams::default())
            .await
            .map_err(Error::api_hinted("cannot list ValidatingAdmissionPolicies", "Kortex's ClusterRole needs list on validatingadmissionpolicies (config/rbac, the chart's rbac.yaml)"))?;
        let bindings = list(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        )
        .list(&ListParams::default())
        .await
        .map_err(Error::api_hinted("cannot list ValidatingAdmissionPolicyBindings", "Kortex's ClusterRole needs list on validatingadmissionpolicybindings (config/rbac, the chart's rbac.yaml)"))?;
        Ok(Reading {
            expected: expected(&user).map_err(Error::Unusable)?,
            policies: values(policies.items),
            bindings: values(bindings.items),
        })
    }

    /// Why a decision on a proposal in `namespace` (`None`: any namespace) must not be
    /// executed (`Ok(Some)`), `Ok(None)` when the API server enforces the rules there, or
    /// `Err` when that could not be checked now (a passing fault: ask again later, decide
    /// nothing final on it).
    pub async fn unenforced(&self, namespace: Option<&str>) -> Result<Option<String>, Error> {
        let Reading {
            policies,
            bindings,
            expected,
        } = self.read().await?;
        // Labels are read only when no binding covers every namespace.
        let Some(why) = unenforced(&expected, &policies, &bindings, None) else {
            return Ok(None);
        };
        let Some(namespace) = namespace else {
            return Ok(Some(why));
        };
        let labels = match Api::<Namespace>::all(self.client.clone())
            .get_opt(namespace)
            .await
        {
            Ok(ns) => ns.and_then(|n| n.metadata.labels).unwrap_or_default(),
            Err(e) => {
                return Err(Error::api(format!(
                    "cannot read namespace {namespace}'s labels"
                ))(e));
            }
        };
        Ok(unenforced(&expected, &policies, &bindings, Some(&labels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KORTEX: &str = "system:serviceaccount:ops:kortex";

    /// The shipped policy and binding as the API server returns them (defaults filled in),
    /// trusting `user`.
    fn shipped(user: &str) -> (Value, Value) {
        let mut docs = SHIPPED_POLICY.split("\n---\n");
        let mut policy: Value = serde_saphyr::from_str(docs.next().unwrap_or_default()).unwrap();
        let binding: Value = serde_saphyr::from_str(docs.next().unwrap_or_default()).unwrap();
        for v in policy["spec"]["variables"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if let Some(e) = v["expression"].as_str() {
                v["expression"] = json!(e.replace(SHIPPED_USER, user));
            }
        }
        policy["spec"]["matchConstraints"]["matchPolicy"] = json!("Equivalent");
        policy["spec"]["matchConstraints"]["namespaceSelector"] = json!({});
        policy["spec"]["matchConstraints"]["objectSelector"] = json!({});
        policy["spec"]["matchConstraints"]["resourceRules"][0]["scope"] = json!("*");
        (policy, binding)
    }

    fn labels(ns: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut l: BTreeMap<String, String> = extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        l.insert("kubernetes.io/metadata.name".into(), ns.into());
        l
    }

    #[test]
    fn the_shipped_policy_bound_everywhere_is_enforced() {
        let expected = expected(KORTEX).unwrap();
        let (policy, binding) = shipped(KORTEX);
        assert_eq!(
            unenforced(
                &expected,
                std::slice::from_ref(&policy),
                std::slice::from_ref(&binding),
                None
            ),
            None
        );
        // Under any name (the chart's is <release>-actionproposals), with an extra rule.
        let mut renamed = policy.clone();
        renamed["metadata"]["name"] = json!("ops-actionproposals");
        renamed["spec"]["validations"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("validations"))
            .push(json!({"expression": "true", "message": "extra"}));
        let mut rebound = binding.clone();
        rebound["spec"]["policyName"] = json!("ops-actionproposals");
        rebound["spec"]["validationActions"] = json!(["Deny", "Audit"]);
        assert_eq!(unenforced(&expected, &[renamed], &[rebound], None), None);
    }

    #[test]
    fn every_way_of_weakening_the_policy_stops_execution() {
        let expected = expected(KORTEX).unwrap();
        let (policy, binding) = shipped(KORTEX);
        let refused = |policies: &[Value], bindings: &[Value], expect: &str| {
            let why = unenforced(&expected, policies, bindings, Some(&labels("shop", &[])))
                .unwrap_or_else(|| panic!("{expect}: should not be enforced"));
            assert!(why.contains(expect), "{why}");
        };
        refused(&[], &[], "no ValidatingAdmissionPolicy for actionproposals");
        refused(
            std::slice::from_ref(&policy),
            &[],
            "has no ValidatingAdmissionPolicyBinding",
        );
        // Trusting another identity (e.g. installed for another Kortex).
        let (other, _) = shipped("system:serviceaccount:kortex:kortex");
        refused(
            &[other],
            std::slice::from_ref(&binding),
            "trust another identity",
        );
        let mut ignore = policy.clone();
        ignore["spec"]["failurePolicy"] = json!("Ignore");
        refused(
            &[ignore],
            std::slice::from_ref(&binding),
            "failurePolicy is not Fail",
        );
        let mut lax = policy.clone();
        lax["spec"]["validations"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("validations"))
            .remove(2);
        refused(
            &[lax],
            std::slice::from_ref(&binding),
            "must be your own username",
        );
        let mut loose = policy.clone();
        loose["spec"]["validations"][2]["expression"] = json!("true");
        refused(&[loose], std::slice::from_ref(&binding), "lacks the rule");
        let mut conditional = policy.clone();
        conditional["spec"]["matchConditions"] =
            json!([{"name": "skip", "expression": "request.userInfo.username != 'mallory'"}]);
        refused(
            &[conditional],
            std::slice::from_ref(&binding),
            "matchConditions",
        );
        let mut narrow = policy.clone();
        narrow["spec"]["matchConstraints"]["resourceRules"][0]["resources"] =
            json!(["actionproposals"]);
        refused(
            &[narrow],
            std::slice::from_ref(&binding),
            "actionproposals/status",
        );
        let mut selective = policy.clone();
        selective["spec"]["matchConstraints"]["objectSelector"] =
            json!({"matchLabels": {"checked": "yes"}});
        refused(
            &[selective],
            std::slice::from_ref(&binding),
            "leave some proposals out",
        );
        let mut warn = binding.clone();
        warn["spec"]["validationActions"] = json!(["Warn", "Audit"]);
        refused(std::slice::from_ref(&policy), &[warn], "does not Deny");
        let mut elsewhere = binding.clone();
        elsewhere["spec"]["matchResources"] =
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}});
        refused(
            std::slice::from_ref(&policy),
            &[elsewhere],
            "does not select the namespace",
        );
        let mut by_object = binding.clone();
        by_object["spec"]["matchResources"] =
            json!({"objectSelector": {"matchLabels": {"checked": "yes"}}});
        refused(
            std::slice::from_ref(&policy),
            &[by_object],
            "leaves some proposals out",
        );
    }

    #[test]
    fn a_binding_for_some_namespaces_guards_those_only() {
        let expected = expected(KORTEX).unwrap();
        let (policy, mut binding) = shipped(KORTEX);
        binding["spec"]["matchResources"] = json!({"namespaceSelector": {"matchExpressions": [
            {"key": "team", "operator": "In", "values": ["shop", "pay"]}]}});
        let (p, b) = (&[policy], &[binding]);
        assert_eq!(
            unenforced(&expected, p, b, Some(&labels("shop", &[("team", "shop")]))),
            None
        );
        assert!(unenforced(&expected, p, b, Some(&labels("dev", &[("team", "dev")]))).is_some());
        assert!(unenforced(&expected, p, b, Some(&labels("x", &[]))).is_some());
        // Not for "every namespace" (the metric's question).
        assert!(unenforced(&expected, p, b, None).is_some());
    }

    #[test]
    fn label_selectors_select_as_kubernetes_does() {
        let l = labels("shop", &[("tier", "web")]);
        assert!(selects(&json!({}), &l));
        assert!(selects(&Value::Null, &l));
        assert!(selects(&json!({"matchLabels": {"tier": "web"}}), &l));
        assert!(!selects(&json!({"matchLabels": {"tier": "db"}}), &l));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}),
            &l
        ));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]}),
            &l
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}, {"key": "x", "operator": "Exists"}]}),
            &l
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "tier", "operator": "Bogus"}]}),
            &l
        ));
    }
}
