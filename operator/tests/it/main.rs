//! Integration tests: one binary (it links once), one module per area, and `support/`, the
//! harness they share.

// A panic is how a test fails: helpers unwrap as `#[test]` functions may (clippy.toml
// allows it only inside those).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod a2a;
mod admission;
mod binary;
mod budget;
mod canaries;
mod chart;
mod chat;
mod claude_code;
mod cluster;
mod config;
mod dashboard;
mod docs;
mod egress;
mod evals;
mod faults;
mod first_run;
mod fuzz;
mod gateway;
mod gitops;
mod gitops_forge;
mod gitops_git;
mod http;
mod investigation;
mod leader;
mod limits;
mod llm;
mod local_models;
mod mcp_conformance;
mod mcp_door;
mod notify;
mod oauth;
mod operator;
mod plugins;
mod policy;
mod prometheus;
mod real_model;
mod retention;
mod run_control;
mod samples;
mod session_tools;
mod sharing;
mod slack;
mod sso;
mod sso_browser;
mod standalone_actions;
mod store;
mod support;
mod tools;
mod traces;
mod triggers;
