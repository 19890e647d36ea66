//! Integration tests: one binary (it links once), one module per area.

mod admission;
mod binary;
mod chat;
mod cluster;
mod common;
mod config;
mod http;
mod investigation;
mod llm;
mod operator;
mod plugins;
mod prometheus;
mod samples;
mod store;
mod tools;
