//! Who applies an object from Git: Argo CD (the `argocd.argoproj.io/tracking-id`
//! annotation or the `argocd.argoproj.io/instance` label → the `Application`), Flux (the
//! `kustomize.toolkit.fluxcd.io/name|namespace` labels → the `Kustomization` → its
//! `GitRepository`; `helm.toolkit.fluxcd.io/name|namespace` → the `HelmRelease`, itself
//! applied by a `Kustomization`), an HPA owning the replicas, or nobody. Read with the
//! client given — Kortex's own, or the user's where the policy runs tools as the user.
//!
//! The parsing of the objects is pure ([`argo_app_of`], [`argo_sources`], [`flux_of`],
//! [`flux_source`]); [`find`] reads them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Argo CD's tracking annotation: `<app>:<group>/<kind>:<namespace>/<name>`.
pub const ARGO_TRACKING: &str = "argocd.argoproj.io/tracking-id";
/// Argo CD's label-tracking label: the Application's name.
pub const ARGO_INSTANCE: &str = "argocd.argoproj.io/instance";
/// Flux's labels on what a Kustomization applied.
pub const FLUX_KS_NAME: &str = "kustomize.toolkit.fluxcd.io/name";
/// See [`FLUX_KS_NAME`].
pub const FLUX_KS_NAMESPACE: &str = "kustomize.toolkit.fluxcd.io/namespace";
/// Flux's labels on what a HelmRelease installed.
pub const FLUX_HR_NAME: &str = "helm.toolkit.fluxcd.io/name";
/// See [`FLUX_HR_NAME`].
pub const FLUX_HR_NAMESPACE: &str = "helm.toolkit.fluxcd.io/namespace";
/// Where Argo CD keeps its Applications unless the policy says otherwise.
pub const ARGO_NAMESPACE: &str = "argocd";

/// An object named by API version, kind, namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// e.g. `argoproj.io/v1alpha1`.
    pub api_version: String,
    /// e.g. `Application`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ObjectRef {
    fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The plural resource and API group (for a SubjectAccessReview).
    pub fn resource(&self) -> (&'static str, &'static str) {
        match self.kind.as_str() {
            "Application" => ("argoproj.io", "applications"),
            "Kustomization" => ("kustomize.toolkit.fluxcd.io", "kustomizations"),
            "HelmRelease" => ("helm.toolkit.fluxcd.io", "helmreleases"),
            _ => ("source.toolkit.fluxcd.io", "gitrepositories"),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One Git source an owner applies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The repository's URL as the owner names it.
    pub repo_url: String,
    /// The directory in the repository (no leading `./` or `/`; `""` is the root).
    pub path: String,
    /// The branch, tag or commit it follows (`targetRevision`, `ref`), if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Helm value files (relative to the repository root), when it renders a chart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub value_files: Vec<String>,
    /// Value files in another source's repository (`$ref/…`, as `repoURL:path`): Kortex
    /// changes one repository at a time, so such a source gets the evidence only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values_elsewhere: Vec<String>,
    /// Whether it renders a Helm chart.
    pub helm: bool,
    /// Helm values the Application sets itself (`helm.values`, `valuesObject`,
    /// `parameters`): they override every value file.
    pub inline_values: bool,
    /// The HelmRelease (Flux) whose `spec.values` hold the chart's values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helm_release: Option<String>,
    /// Whether the owner says Kustomize (Argo CD's `kustomize:` block).
    pub kustomize: bool,
}

/// What applies the object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// `argocd`, `flux` or `none`.
    pub tool: &'static str,
    /// The Application or Kustomization (the object whose `update` an approver needs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
    /// A HelmRelease between the object and its Kustomization (Flux).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helm_release: Option<ObjectRef>,
    /// Its Git sources (Argo CD may have several).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Source>,
    /// Whether it syncs on its own (Argo CD `syncPolicy.automated`; Flux always).
    pub automated: bool,
    /// Whether it reverts live changes (Argo CD `selfHeal`; Flux always on its interval).
    pub self_heal: bool,
    /// Its sync state as it reports it (`Synced`, `OutOfSync`; Flux: `Ready` or the reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_status: Option<String>,
    /// The revision it last synced (a commit; Flux writes `branch@sha1:…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synced_revision: Option<String>,
    /// Whether its last sync operation failed, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_failure: Option<String>,
    /// The revision that failed to sync (Argo CD `operationState.syncResult.revision`,
    /// Flux `lastAttemptedRevision`), when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_revision: Option<String>,
    /// An HPA that owns the replicas (`name`, `min`, `max`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hpa: Option<Value>,
    /// What could not be read (the owner named by a label that does not exist, no right to
    /// read it), so the model and the person see why the answer is partial.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl Owner {
    /// Whether a GitOps tool applies the object.
    pub fn is_gitops(&self) -> bool {
        self.tool != "none"
    }

    /// The commit of [`Owner::synced_revision`] (Flux's `branch@sha1:abc` → `abc`).
    pub fn synced_commit(&self) -> Option<&str> {
        self.synced_revision.as_deref().map(commit_of)
    }
}

/// The commit in a revision as Argo CD or Flux write it.
pub fn commit_of(revision: &str) -> &str {
    revision
        .rsplit_once(':')
        .map_or(revision, |(_, sha)| sha)
        .rsplit('@')
        .next()
        .unwrap_or(revision)
}

/// The Application (its namespace when the tracking id names one, and name) that tracks
/// `object`: from the tracking annotation, else the instance label.
pub fn argo_app_of(object: &Value) -> Option<(Option<String>, String)> {
    let meta = &object["metadata"];
    // A tracking id copied onto another object (it names the object it was made for) is
    // not believed.
    if let Some(id) = meta["annotations"][ARGO_TRACKING]
        .as_str()
        .filter(|id| tracks(id, object))
    {
        let app = id.split(':').next().unwrap_or_default();
        // Apps in any namespace are tracked as `<namespace>_<name>`.
        return match app.split_once('_') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                Some((Some(ns.to_owned()), name.to_owned()))
            }
            _ if !app.is_empty() => Some((None, app.to_owned())),
            _ => None,
        };
    }
    meta["labels"][ARGO_INSTANCE]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| (None, s.to_owned()))
}

/// Whether tracking id `<app>:<group>/<kind>:<namespace>/<name>` names `object`.
fn tracks(id: &str, object: &Value) -> bool {
    let mut parts = id.splitn(3, ':');
    let (_, Some(group_kind), Some(ns_name)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let kind = group_kind.rsplit('/').next().unwrap_or_default();
    let (ns, name) = ns_name.split_once('/').unwrap_or(("", ns_name));
    let meta = &object["metadata"];
    object["kind"].as_str().is_none_or(|k| k == kind)
        && meta["name"] == name
        && (ns.is_empty() || meta["namespace"].as_str().is_none_or(|n| n == ns))
}

/// The (kind, namespace, name) of the Flux object that applied `object`: a HelmRelease
/// first (it is the nearer owner), else a Kustomization.
pub fn flux_of(object: &Value) -> Option<(&'static str, String, String)> {
    let labels = &object["metadata"]["labels"];
    let own_ns = object["metadata"]["namespace"].as_str().unwrap_or_default();
    for (kind, name, ns) in [
        ("HelmRelease", FLUX_HR_NAME, FLUX_HR_NAMESPACE),
        ("Kustomization", FLUX_KS_NAME, FLUX_KS_NAMESPACE),
    ] {
        if let Some(n) = labels[name].as_str().filter(|s| !s.is_empty()) {
            let namespace = labels[ns].as_str().unwrap_or(own_ns);
            return Some((kind, namespace.to_owned(), n.to_owned()));
        }
    }
    None
}

/// An Application's Git sources (`spec.source` or `spec.sources`), value files resolved
/// against the source's path (`$ref` sources named by their repository).
pub fn argo_sources(app: &Value) -> Vec<Source> {
    let spec = &app["spec"];
    let list: Vec<&Value> = match spec["sources"].as_array() {
        Some(a) if !a.is_empty() => a.iter().collect(),
        _ => spec.get("source").into_iter().collect(),
    };
    let refs: Vec<(&str, &str)> = list
        .iter()
        .filter_map(|s| Some((s["ref"].as_str()?, s["repoURL"].as_str()?)))
        .collect();
    list.iter()
        .filter(|s| s["chart"].as_str().is_none() || s["path"].as_str().is_some())
        .filter_map(|s| {
            let path = clean(s["path"].as_str().unwrap_or_default());
            let helm = s.get("helm").is_some_and(|h| h.is_object());
            let (mut value_files, mut values_elsewhere) = (Vec::new(), Vec::new());
            for f in s["helm"]["valueFiles"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                match value_file(&path, f, &refs) {
                    (None, file) => value_files.push(file),
                    (Some(repo), file) => values_elsewhere.push(format!("{repo}:{file}")),
                }
            }
            Some(Source {
                repo_url: s["repoURL"].as_str()?.to_owned(),
                path,
                revision: s["targetRevision"].as_str().map(str::to_owned),
                value_files,
                values_elsewhere,
                helm,
                inline_values: ["values", "valuesObject", "parameters"]
                    .iter()
                    .any(|k| s["helm"].get(*k).is_some_and(|v| !v.is_null())),
                helm_release: None,
                kustomize: s.get("kustomize").is_some_and(|k| k.is_object()),
            })
        })
        .collect()
}

/// A value file's path from the repository root, and the repository when it is another
/// source's (`$ref/…` names that source's root); anything else is relative to the
/// source's path.
fn value_file<'a>(path: &str, file: &str, refs: &[(&str, &'a str)]) -> (Option<&'a str>, String) {
    if let Some(rest) = file.strip_prefix('$')
        && let Some((name, rel)) = rest.split_once('/')
        && let Some((_, repo)) = refs.iter().find(|(r, _)| *r == name)
    {
        return (Some(repo), clean(rel));
    }
    (None, clean(&format!("{path}/{file}")))
}

/// A path without `./`, leading or trailing `/` and doubled slashes (`..` is kept: it is
/// refused where the path is used).
pub fn clean(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// An Argo CD Application as an owner.
pub fn argo_owner(app: &Value) -> Owner {
    let meta = &app["metadata"];
    let automated = app["spec"]["syncPolicy"]["automated"].is_object()
        && app["spec"]["syncPolicy"]["automated"]["enabled"] != false;
    let operation = &app["status"]["operationState"];
    let failed = matches!(operation["phase"].as_str(), Some("Failed" | "Error"));
    Owner {
        tool: "argocd",
        object: Some(ObjectRef::new(
            "argoproj.io/v1alpha1",
            "Application",
            meta["namespace"].as_str().unwrap_or(ARGO_NAMESPACE),
            meta["name"].as_str().unwrap_or_default(),
        )),
        sources: argo_sources(app),
        automated,
        self_heal: automated && app["spec"]["syncPolicy"]["automated"]["selfHeal"] == true,
        sync_status: app["status"]["sync"]["status"].as_str().map(str::to_owned),
        synced_revision: app["status"]["sync"]["revision"]
            .as_str()
            .or_else(|| app["status"]["sync"]["revisions"][0].as_str())
            .map(str::to_owned),
        sync_failure: failed.then(|| {
            operation["message"]
                .as_str()
                .unwrap_or("the last sync failed")
                .to_owned()
        }),
        failed_revision: failed
            .then(|| {
                operation["syncResult"]["revision"]
                    .as_str()
                    .or_else(|| operation["operation"]["sync"]["revision"].as_str())
                    .map(str::to_owned)
            })
            .flatten(),
        ..Owner::default()
    }
}

/// A Flux Kustomization (and the GitRepository it reads, if that was read) as an owner.
pub fn flux_owner(ks: &Value, repo: Option<&Value>) -> Owner {
    let meta = &ks["metadata"];
    let ready = ks["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let sync_failure = ready
        .filter(|c| c["status"] == "False")
        .map(|c| c["message"].as_str().unwrap_or("not ready").to_owned());
    Owner {
        tool: "flux",
        object: Some(ObjectRef::new(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        )),
        sources: repo.map(|r| vec![flux_source(ks, r)]).unwrap_or_default(),
        automated: ks["spec"]["suspend"] != true,
        self_heal: ks["spec"]["suspend"] != true,
        sync_status: ready.map(|c| {
            if c["status"] == "True" {
                "Ready".to_owned()
            } else {
                c["reason"].as_str().unwrap_or("NotReady").to_owned()
            }
        }),
        synced_revision: ks["status"]["lastAppliedRevision"]
            .as_str()
            .map(str::to_owned),
        failed_revision: sync_failure
            .as_ref()
            .and(ks["status"]["lastAttemptedRevision"].as_str())
            .map(str::to_owned),
        sync_failure,
        ..Owner::default()
    }
}

/// The Git source of a Kustomization: its GitRepository's URL and ref, its own path.
pub fn flux_source(ks: &Value, repo: &Value) -> Source {
    let r = &repo["spec"]["ref"];
    let revision = ["branch", "tag", "semver", "commit", "name"]
        .iter()
        .find_map(|k| r[k].as_str())
        .map(str::to_owned);
    Source {
        repo_url: repo["spec"]["url"].as_str().unwrap_or_default().to_owned(),
        path: clean(ks["spec"]["path"].as_str().unwrap_or_default()),
        revision,
        ..Source::default()
    }
}

/// The HPA among `hpas` that scales `kind`/`name`.
pub fn hpa_of(hpas: &Value, kind: &str, name: &str) -> Option<Value> {
    hpas["items"].as_array()?.iter().find_map(|h| {
        let r = &h["spec"]["scaleTargetRef"];
        (r["kind"] == kind && r["name"] == name).then(|| {
            serde_json::json!({
                "name": h["metadata"]["name"],
                "min": h["spec"]["minReplicas"].as_i64().unwrap_or(1),
                "max": h["spec"]["maxReplicas"],
            })
        })
    })
}

/// Reads JSON at an API path.
async fn get(client: &kube::Client, path: &str) -> Result<Value, kube::Error> {
    let request = axum::http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request::<Value>(request).await
}

fn seg(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn unreadable(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => format!("{what} does not exist"),
        kube::Error::Api(s) if s.code == 403 => format!("{what} may not be read: {}", s.message),
        other => format!("{what} could not be read: {other}"),
    }
}

/// Who applies `object` (as read from the API server), read with `client`. Argo CD's
/// Applications are looked for in `argo_namespace` unless the tracking id names one.
pub async fn find(client: &kube::Client, object: &Value, argo_namespace: &str) -> Owner {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let mut owner = if let Some((ns, app)) = argo_app_of(object) {
        let ns = ns.unwrap_or_else(|| argo_namespace.to_owned());
        let path = format!(
            "/apis/argoproj.io/v1alpha1/namespaces/{}/applications/{}",
            seg(&ns),
            seg(&app)
        );
        match get(client, &path).await {
            Ok(a) => argo_owner(&a),
            Err(e) => Owner {
                tool: "argocd",
                object: Some(ObjectRef::new(
                    "argoproj.io/v1alpha1",
                    "Application",
                    &ns,
                    &app,
                )),
                problems: vec![unreadable(&format!("Application {ns}/{app}"), &e)],
                ..Owner::default()
            },
        }
    } else if let Some((flux_kind, ns, n)) = flux_of(object) {
        flux(client, flux_kind, &ns, &n).await
    } else {
        Owner {
            tool: "none",
            ..Owner::default()
        }
    };
    if matches!(kind, "Deployment" | "StatefulSet") {
        let path = format!(
            "/apis/autoscaling/v2/namespaces/{}/horizontalpodautoscalers",
            seg(namespace)
        );
        match get(client, &path).await {
            Ok(list) => owner.hpa = hpa_of(&list, kind, name),
            Err(e) => owner
                .problems
                .push(unreadable("the HorizontalPodAutoscalers", &e)),
        }
    }
    owner
}

/// The Application or Kustomization `object` as an owner now (its sync state; a
/// Kustomization without its sources): what a delivered change is followed by.
pub async fn read(client: &kube::Client, object: &ObjectRef) -> Result<Owner, String> {
    let (group, plural) = object.resource();
    let version = object.api_version.rsplit_once('/').map_or("v1", |(_, v)| v);
    let path = format!(
        "/apis/{group}/{version}/namespaces/{}/{plural}/{}",
        seg(&object.namespace),
        seg(&object.name)
    );
    let found = get(client, &path)
        .await
        .map_err(|e| unreadable(&object.to_string(), &e))?;
    Ok(match object.kind.as_str() {
        "Application" => argo_owner(&found),
        _ => flux_owner(&found, None),
    })
}

/// A Flux owner: the Kustomization (through a HelmRelease when `kind` is one) and its
/// GitRepository.
async fn flux(client: &kube::Client, kind: &str, ns: &str, name: &str) -> Owner {
    let mut problems = Vec::new();
    let mut helm_release = None;
    let (mut ks_ns, mut ks_name) = (ns.to_owned(), name.to_owned());
    if kind == "HelmRelease" {
        let path = format!(
            "/apis/helm.toolkit.fluxcd.io/v2/namespaces/{}/helmreleases/{}",
            seg(ns),
            seg(name)
        );
        helm_release = Some(ObjectRef::new(
            "helm.toolkit.fluxcd.io/v2",
            "HelmRelease",
            ns,
            name,
        ));
        match get(client, &path).await {
            Ok(hr) => match flux_of(&hr) {
                Some(("Kustomization", n_ns, n)) => (ks_ns, ks_name) = (n_ns, n),
                _ => {
                    let mut owner = Owner {
                        tool: "flux",
                        object: helm_release.clone(),
                        helm_release,
                        automated: true,
                        self_heal: true,
                        ..Owner::default()
                    };
                    owner.problems.push(format!("HelmRelease {ns}/{name} is not applied by a Flux Kustomization: its values are not in a Git repository Kortex can find"));
                    return owner;
                }
            },
            Err(e) => problems.push(unreadable(&format!("HelmRelease {ns}/{name}"), &e)),
        }
    }
    let path = format!(
        "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/{}/kustomizations/{}",
        seg(&ks_ns),
        seg(&ks_name)
    );
    let ks = match get(client, &path).await {
        Ok(ks) => ks,
        Err(e) => {
            problems.push(unreadable(&format!("Kustomization {ks_ns}/{ks_name}"), &e));
            return Owner {
                tool: "flux",
                object: Some(ObjectRef::new(
                    "kustomize.toolkit.fluxcd.io/v1",
                    "Kustomization",
                    &ks_ns,
                    &ks_name,
                )),
                helm_release,
                problems,
                ..Owner::default()
            };
        }
    };
    let source = &ks["spec"]["sourceRef"];
    let repo = if source["kind"] == "GitRepository" {
        let repo_ns = source["namespace"].as_str().unwrap_or(&ks_ns).to_owned();
        let repo_name = source["name"].as_str().unwrap_or_default();
        let path = format!(
            "/apis/source.toolkit.fluxcd.io/v1/namespaces/{}/gitrepositories/{}",
            seg(&repo_ns),
            seg(repo_name)
        );
        get(client, &path)
            .await
            .map_err(|e| {
                problems.push(unreadable(
                    &format!("GitRepository {repo_ns}/{repo_name}"),
                    &e,
                ))
            })
            .ok()
    } else {
        problems.push(format!(
            "Kustomization {ks_ns}/{ks_name} reads a {} (only GitRepository sources are changed through Git)",
            source["kind"].as_str().unwrap_or("source")
        ));
        None
    };
    let mut owner = flux_owner(&ks, repo.as_ref());
    if let Some(hr) = &helm_release {
        for s in &mut owner.sources {
            s.helm = true;
            s.helm_release = Some(hr.name.clone());
        }
    }
    owner.helm_release = helm_release;
    owner.problems.extend(problems);
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn argo_tracking_names_the_application() {
        let tracked = |id: &str| {
            json!({"kind": "Deployment", "metadata": {"name": "api", "namespace": "shop",
                "annotations": {ARGO_TRACKING: id}}})
        };
        let o = tracked("shop:apps/Deployment:shop/api");
        assert_eq!(argo_app_of(&o), Some((None, "shop".into())));
        let o = tracked("team-a_shop:apps/Deployment:shop/api");
        assert_eq!(
            argo_app_of(&o),
            Some((Some("team-a".into()), "shop".into()))
        );
        // Copied from another object: not believed.
        assert_eq!(argo_app_of(&tracked("shop:apps/Deployment:shop/web")), None);
        assert_eq!(
            argo_app_of(&tracked("shop:apps/StatefulSet:shop/api")),
            None
        );
        let o = json!({"metadata": {"labels": {ARGO_INSTANCE: "shop"}}});
        assert_eq!(argo_app_of(&o), Some((None, "shop".into())));
        assert_eq!(argo_app_of(&json!({"metadata": {}})), None);
    }

    #[test]
    fn flux_labels_name_the_nearest_owner() {
        let o = json!({"metadata": {"namespace": "shop", "labels": {
            FLUX_KS_NAME: "apps", FLUX_KS_NAMESPACE: "flux-system",
            FLUX_HR_NAME: "api"}}});
        assert_eq!(
            flux_of(&o),
            Some(("HelmRelease", "shop".into(), "api".into()))
        );
        let o = json!({"metadata": {"namespace": "shop", "labels": {FLUX_KS_NAME: "apps", FLUX_KS_NAMESPACE: "flux-system"}}});
        assert_eq!(
            flux_of(&o),
            Some(("Kustomization", "flux-system".into(), "apps".into()))
        );
    }

    #[test]
    fn argo_sources_resolve_value_files() {
        let app = json!({"metadata": {"name": "shop", "namespace": "argocd"}, "spec": {
            "sources": [
                {"repoURL": "https://git.example/charts.git", "path": "./charts/api", "targetRevision": "main",
                 "helm": {"valueFiles": ["values.yaml", "$values/envs/prod/values.yaml"]}},
                {"repoURL": "https://git.example/envs.git", "ref": "values"}
            ],
            "syncPolicy": {"automated": {"selfHeal": true}}},
            "status": {"sync": {"status": "Synced", "revision": "abc"}}});
        let owner = argo_owner(&app);
        assert!(owner.automated && owner.self_heal);
        assert_eq!(owner.synced_commit(), Some("abc"));
        assert_eq!(owner.sources.len(), 2);
        assert_eq!(owner.sources[0].path, "charts/api");
        assert_eq!(owner.sources[0].value_files, vec!["charts/api/values.yaml"]);
        assert_eq!(
            owner.sources[0].values_elsewhere,
            vec!["https://git.example/envs.git:envs/prod/values.yaml"]
        );
        assert!(owner.sources[0].helm);
        assert!(!owner.sources[0].inline_values);
        let mut inline = app.clone();
        inline["spec"]["sources"][0]["helm"]["valuesObject"] = json!({"replicaCount": 3});
        assert!(argo_owner(&inline).sources[0].inline_values);
    }

    #[test]
    fn flux_revisions_give_their_commit() {
        assert_eq!(commit_of("main@sha1:0123abc"), "0123abc");
        assert_eq!(commit_of("0123abc"), "0123abc");
        let ks = json!({"metadata": {"name": "apps", "namespace": "flux-system"},
            "spec": {"path": "./clusters/prod", "sourceRef": {"kind": "GitRepository", "name": "fleet"}},
            "status": {"lastAppliedRevision": "main@sha1:0123abc",
                "conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded"}]}});
        let repo = json!({"spec": {"url": "https://git.example/fleet", "ref": {"branch": "main"}}});
        let owner = flux_owner(&ks, Some(&repo));
        assert_eq!(owner.synced_commit(), Some("0123abc"));
        assert_eq!(owner.sources[0].path, "clusters/prod");
        assert_eq!(owner.sources[0].revision.as_deref(), Some("main"));
        assert_eq!(owner.sync_status.as_deref(), Some("Ready"));
    }
}
