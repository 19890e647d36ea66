//! The harness every area's tests share: the fakes a test talks to (an LLM provider, the
//! Kubernetes API, Prometheus, plugin upstreams, webhook receivers, a Git server), the real binaries,
//! databases, manifest folders, and the chat API seen from a client. An area's test module
//! imports from here, never from another area's module; what only one area uses stays in
//! it. (Checks that an area owns and the chart re-runs on its own output, such as config's
//! RBAC coverage and admission's trust rules, stay with their area.)

pub mod app;
pub mod browser;
pub mod canned_api;
pub mod chat;
pub mod db;
pub mod fake_api;
pub mod forge;
pub mod git_server;
pub mod manifests;
pub mod net;
pub mod oidc;
pub mod plugins;
pub mod prometheus;
pub mod provider;
pub mod receiver;
pub mod server;
pub mod slack;
pub mod tls_proxy;
pub mod tools;
pub mod yaml;
