//! The manifest source: reads `--manifests` paths (files, or folders of `.yaml`, `.yml`
//! and `.json` files, not recursive, like `kubectl apply -f`), keeps per-object metadata
//! stable across reloads, and serves the last good version of an object whose document
//! broke.

use super::manifest::{self, Identity, Object, Origin, Problem, Severity};
use crate::catalog::ObjectSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Resolves `${VAR}` in Secrets.
pub type EnvLookup = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A `--manifests` path that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The path does not exist.
    #[error("manifest path {0} does not exist")]
    Missing(PathBuf),
}

/// What one load produced.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The objects to compile (including last good versions of broken ones).
    pub objects: ObjectSet,
    /// Errors and warnings, by file and document.
    pub problems: Vec<Problem>,
    /// Where each object was defined.
    pub origins: BTreeMap<Identity, Origin>,
    /// Objects served from their last good version because their document broke.
    pub stale: BTreeSet<Identity>,
    /// Files read.
    pub files: Vec<PathBuf>,
}

impl Snapshot {
    /// Whether any problem is an error (warnings do not count).
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.severity == Severity::Error)
    }
}

struct MetaState {
    uid: String,
    created: jiff::Timestamp,
    generation: i64,
    fingerprint: String,
    resource_version: u64,
}

/// Change detector for the watched files: path, size, modification time and inode.
pub type Fingerprint = Vec<(PathBuf, Option<(u64, Option<std::time::SystemTime>, u64)>)>;

/// Reads manifests and remembers what it read.
pub struct ManifestSource {
    paths: Vec<PathBuf>,
    env: EnvLookup,
    last_good: BTreeMap<Identity, (Origin, Object)>,
    meta: BTreeMap<Identity, MetaState>,
    next_version: u64,
    /// The files as they were just before the last `load` read them.
    loaded: Fingerprint,
}

impl ManifestSource {
    /// A source over `paths`, which must exist. `env` resolves `${VAR}` in Secrets.
    pub fn new(paths: Vec<PathBuf>, env: EnvLookup) -> Result<Self, SourceError> {
        if let Some(missing) = paths.iter().find(|p| !p.exists()) {
            return Err(SourceError::Missing(missing.clone()));
        }
        Ok(Self {
            paths,
            env,
            last_good: BTreeMap::new(),
            meta: BTreeMap::new(),
            next_version: 1,
            loaded: Fingerprint::new(),
        })
    }

    /// The files the paths currently stand for, sorted within each folder.
    fn files(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut files = Vec::new();
        let mut missing = Vec::new();
        for path in &self.paths {
            if path.is_dir() {
                let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| is_manifest_file(p))
                    .collect();
                entries.sort();
                files.extend(entries);
            } else if path.is_file() {
                files.push(path.clone());
            } else {
                missing.push(path.clone());
            }
        }
        (files, missing)
    }

    /// What changes when a watched file is edited, added, removed or replaced.
    pub fn fingerprint(&self) -> Fingerprint {
        let (files, missing) = self.files();
        let mut fp: Fingerprint = files
            .into_iter()
            .map(|f| {
                let meta = std::fs::metadata(&f)
                    .ok()
                    .map(|m| (m.len(), m.modified().ok(), inode(&m)));
                (f, meta)
            })
            .collect();
        fp.extend(missing.into_iter().map(|m| (m, None)));
        fp
    }

    /// The fingerprint of the files the last `load` read; a watcher compares with it, so
    /// a change made between a load and the watcher's start is not missed.
    pub fn loaded(&self) -> &Fingerprint {
        &self.loaded
    }

    /// Reads every file and returns the objects to serve. `now` becomes the
    /// `creationTimestamp` of objects seen for the first time.
    // Long because one pass over the files: read, parse, keep last good versions of broken documents and
    // report duplicates, all over the same maps.
    pub fn load(&mut self, now: jiff::Timestamp) -> Snapshot {
        // Taken before reading: a file changed while it is read shows as a change later.
        self.loaded = self.fingerprint();
        let (files, missing) = self.files();
        let mut problems = Vec::new();
        for m in missing {
            problems.push(file_problem(
                &m,
                "path does not exist any more; serving its last good objects".into(),
            ));
        }
        let mut current: BTreeMap<Identity, (Origin, Object)> = BTreeMap::new();
        let mut failed = Vec::new();
        let mut unreadable: Vec<PathBuf> = Vec::new();
        for file in &files {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(file_problem(file, format!("cannot read file: {e}")));
                    unreadable.push(file.clone());
                    continue;
                }
            };
            let outcome = manifest::parse_file(file, &text, &*self.env);
            problems.extend(outcome.problems);
            failed.extend(outcome.failed);
            for (origin, id, object) in outcome.objects {
                if let Some((first, _)) = current.get(&id) {
                    problems.push(Problem {
                        severity: Severity::Error,
                        origin: origin.clone(),
                        line: None,
                        object: Some(id.clone()),
                        field: Some("metadata.name".into()),
                        message: format!(
                            "Duplicate value: {id} is already defined in {}:{} (document {}); this one is ignored",
                            first.file.display(),
                            first.line,
                            first.document
                        ),
                    });
                    continue;
                }
                current.insert(id, (origin, object));
            }
        }

        // Serve the last good version of whatever broke.
        let mut stale = BTreeSet::new();
        let gone_files: BTreeSet<&Path> = unreadable
            .iter()
            .map(PathBuf::as_path)
            .chain(
                self.paths
                    .iter()
                    .filter(|p| !p.exists())
                    .map(PathBuf::as_path),
            )
            .collect();
        for (id, (origin, object)) in &self.last_good {
            if current.contains_key(id) {
                continue;
            }
            let broke = failed.iter().any(|f| match &f.identity {
                Some(fid) => fid == id,
                None => f.origin.file == origin.file && f.origin.document == origin.document,
            }) || gone_files.iter().any(|g| origin.file.starts_with(g));
            if broke {
                stale.insert(id.clone());
                current.insert(id.clone(), (origin.clone(), object.clone()));
            }
        }
        for id in &stale {
            if let Some((origin, _)) = current.get(id) {
                problems.push(Problem {
                    severity: Severity::Warning,
                    origin: origin.clone(),
                    line: None,
                    object: Some(id.clone()),
                    field: None,
                    message:
                        "serving the last good version of this object until its document is fixed"
                            .into(),
                });
            }
        }

        // Stable metadata: uid and creationTimestamp from the first sighting; generation
        // and resourceVersion move when the content does.
        self.meta.retain(|id, _| current.contains_key(id));
        for (id, (_, object)) in current.iter_mut() {
            let fingerprint = object.content_fingerprint();
            let version = &mut self.next_version;
            let state = self.meta.entry(id.clone()).or_insert_with(|| {
                *version += 1;
                MetaState {
                    uid: uid_for(id),
                    created: now,
                    generation: 1,
                    fingerprint: fingerprint.clone(),
                    resource_version: *version,
                }
            });
            if state.fingerprint != fingerprint {
                *version += 1;
                state.generation += 1;
                state.fingerprint = fingerprint;
                state.resource_version = *version;
            }
            let is_secret = matches!(object, Object::Secret(_));
            let meta = object.meta_mut();
            meta.uid = Some(state.uid.clone());
            meta.creation_timestamp = Some(Time(state.created));
            meta.resource_version = Some(state.resource_version.to_string());
            if !is_secret {
                meta.generation = Some(state.generation);
            }
        }
        self.last_good = current
            .iter()
            .filter(|(id, _)| !stale.contains(*id))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for id in &stale {
            if let Some(v) = current.get(id) {
                self.last_good.insert(id.clone(), v.clone());
            }
        }

        let mut snapshot = Snapshot {
            problems,
            stale,
            files,
            ..Default::default()
        };
        for (id, (origin, object)) in current {
            snapshot.origins.insert(id, origin);
            let set = &mut snapshot.objects;
            match object {
                Object::LLMProvider(o) => set.providers.push(*o),
                Object::KortexTool(o) => set.tools.push(*o),
                Object::ChatPolicy(o) => set.policies.push(*o),
                Object::ActionProposal(o) => set.proposals.push(*o),
                Object::Secret(mut o) => {
                    // Whoever writes the manifest folder owns its Secrets: they are opted in.
                    o.metadata.labels.get_or_insert_default().insert(
                        crate::catalog::secrets::USE_LABEL.to_owned(),
                        "true".to_owned(),
                    );
                    set.secrets.push(*o)
                }
            }
        }
        snapshot
    }
}

fn is_manifest_file(p: &Path) -> bool {
    let hidden = p
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
    !hidden && matches!(ext, "yaml" | "yml" | "json") && p.is_file()
}

#[cfg(unix)]
fn inode(m: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    m.ino()
}

#[cfg(not(unix))]
fn inode(_: &std::fs::Metadata) -> u64 {
    0
}

fn file_problem(file: &Path, message: String) -> Problem {
    Problem {
        severity: Severity::Error,
        origin: Origin {
            file: file.to_path_buf(),
            document: 0,
            line: 1,
        },
        line: None,
        object: None,
        field: None,
        message,
    }
}

/// A stable, UUID-shaped uid per identity, so the same object keeps its uid across restarts.
fn uid_for(id: &Identity) -> String {
    let h =
        crate::catalog::secrets::hex(&crate::catalog::secrets::sha256(id.to_string().as_bytes()));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        if let Err(e) = std::fs::write(dir.join(name), text) {
            panic!("write {name}: {e}");
        }
    }

    fn source(dir: &Path) -> ManifestSource {
        match ManifestSource::new(vec![dir.to_path_buf()], Box::new(|_| None)) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap_or_default()
    }

    const PROVIDER: &str = "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: local}\nspec: {type: ollama, defaultModel: MODEL}\n";

    #[test]
    fn broken_edit_keeps_last_good_version_and_generation_tracks_spec() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        write(dir.path(), "p.yaml", &PROVIDER.replace("MODEL", "llama3"));
        write(dir.path(), "notes.txt", "not a manifest");
        let mut src = source(dir.path());
        let first = src.load(ts(1));
        assert!(first.problems.is_empty(), "{:?}", first.problems);
        assert_eq!(first.files.len(), 1);
        let p = &first.objects.providers[0];
        assert_eq!(p.metadata.generation, Some(1));
        let uid = p.metadata.uid.clone();

        // Same content: nothing moves.
        let again = src.load(ts(2));
        assert_eq!(again.objects.providers[0].metadata.generation, Some(1));
        assert_eq!(
            again.objects.providers[0].metadata.creation_timestamp,
            Some(Time(ts(1)))
        );

        // A broken edit keeps serving the good version, flagged stale.
        write(
            dir.path(),
            "p.yaml",
            "apiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata: {name: local}\nspec: {type: olama}\n",
        );
        let broken = src.load(ts(3));
        assert!(broken.has_errors());
        assert_eq!(broken.objects.providers.len(), 1);
        assert_eq!(
            broken.objects.providers[0].spec.default_model.as_deref(),
            Some("llama3")
        );
        assert_eq!(broken.stale.len(), 1);

        // Even unparsable YAML keeps it (matched by file and document).
        write(dir.path(), "p.yaml", "spec: [\n");
        let garbage = src.load(ts(4));
        assert_eq!(garbage.objects.providers.len(), 1);

        // A good edit bumps the generation and keeps uid and creation time.
        write(dir.path(), "p.yaml", &PROVIDER.replace("MODEL", "qwen3"));
        let fixed = src.load(ts(5));
        assert!(fixed.problems.is_empty());
        let p = &fixed.objects.providers[0];
        assert_eq!(p.spec.default_model.as_deref(), Some("qwen3"));
        assert_eq!(p.metadata.generation, Some(2));
        assert_eq!(p.metadata.uid, uid);
        assert_eq!(p.metadata.creation_timestamp, Some(Time(ts(1))));

        // Removing the file removes the object.
        if let Err(e) = std::fs::remove_file(dir.path().join("p.yaml")) {
            panic!("{e}");
        }
        assert!(src.load(ts(6)).objects.providers.is_empty());
    }

    #[test]
    fn duplicates_keep_the_first_and_say_where() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        write(dir.path(), "a.yaml", &PROVIDER.replace("MODEL", "one"));
        write(dir.path(), "b.yaml", &PROVIDER.replace("MODEL", "two"));
        let snap = source(dir.path()).load(ts(1));
        assert_eq!(snap.objects.providers.len(), 1);
        assert_eq!(
            snap.objects.providers[0].spec.default_model.as_deref(),
            Some("one")
        );
        let msg = snap.problems[0].to_string();
        assert!(
            msg.contains(
                "b.yaml:1: document 1 (LLMProvider default/local): metadata.name: Duplicate value"
            ),
            "{msg}"
        );
        assert!(msg.contains("a.yaml:1"), "{msg}");
    }

    #[test]
    fn fingerprint_changes_on_edit_add_and_remove() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        write(dir.path(), "a.yaml", "a: 1\n");
        let src = source(dir.path());
        let f1 = src.fingerprint();
        write(dir.path(), "a.yaml", "a: 12\n");
        let f2 = src.fingerprint();
        assert_ne!(f1, f2);
        write(dir.path(), "b.yml", "b: 1\n");
        let f3 = src.fingerprint();
        assert_ne!(f2, f3);
        assert_eq!(f3, src.fingerprint());
        assert!(ManifestSource::new(vec![dir.path().join("nope")], Box::new(|_| None)).is_err());
    }
}
