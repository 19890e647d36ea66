//! Kortex: a Kubernetes operator and in-cluster LLM chat server.
//!
//! Modules by capability: `crd` (the four kinds), `catalog` (objects → the validated
//! configuration the server runs on; pure), `source` (manifest files), `store` (sqlx),
//! `http` (axum routes), plus the CLI entry points in `cli`.

pub mod catalog;
pub mod chat;
pub mod cli;
pub mod crd;
pub mod egress;
pub mod glob;
pub mod govern;
pub mod http;
pub mod kubectl_plugin;
pub mod live;
pub mod llm;
pub mod metrics;
pub mod notify;
pub mod operator;
pub mod redact;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod trigger;

/// `kortex eval` (it lives under `cli`, the only room that uses it).
pub use cli::eval;
