//! Kortex: a Kubernetes operator and in-cluster LLM chat server.
//!
//! Rooms by capability, on floors: a room imports only from floors below its own
//! (docs/architecture.md has the diagram; `scripts/layers.py` checks it). From the top:
//! `cli` and `kubectl_plugin` (the command lines; `cli::eval`), `http` (every door: chat
//! API, dashboard, gateway, MCP, alerts), `trigger` (alert- and schedule-started runs),
//! `chat` (sessions, the run loop) and `notify` (notifications), `operator` (cluster mode:
//! watches, statuses, the Lease, `ActionProposal` objects), `proposals` (rules, pins,
//! previews and execution both modes share), `tools` (the router and every tool), `govern`
//! (routing, budgets, limits) and `redact`, `llm` (one trait, a file per provider), `live`
//! (the running configuration), `source` (manifest files), `catalog` (objects → validated
//! configuration; pure), `store` (SQLite and PostgreSQL), `metrics`, and at the bottom
//! `crd` (the four kinds), `telemetry` (logs, traces), `egress` (what may be reached) and
//! `glob`.

pub mod catalog;
pub mod chat;
pub mod cli;
pub mod crd;
pub mod egress;
pub mod gitops;
pub mod glob;
pub mod govern;
pub mod http;
pub mod kubectl_plugin;
pub mod live;
pub mod llm;
pub mod metrics;
pub mod notify;
pub mod oidc;
pub mod operator;
pub mod proposals;
pub mod redact;
pub mod slack;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod trigger;

/// `kortex eval` (it lives under `cli`, the only room that uses it).
pub use cli::eval;
