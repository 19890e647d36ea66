//! Where objects come from. Standalone mode reads manifest files (`--manifests`), keeps
//! the last good version of objects whose documents broke, and re-loads on change.

mod files;

pub use files::EnvLookup;
pub mod manifest;
pub mod schema;

pub use files::{ManifestSource, Snapshot};
