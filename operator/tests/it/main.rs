//! Integration tests: one binary (it links once), one module per area.

mod binary;
mod chat;
mod common;
mod http;
mod llm;
mod plugins;
mod samples;
mod store;
mod tools;
