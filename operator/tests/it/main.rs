//! Integration tests: one binary (it links once), one module per area.

mod admission;
mod binary;
mod budget;
mod chart;
mod chat;
mod cluster;
mod common;
mod config;
mod dashboard;
mod docs;
mod egress;
mod fuzz;
mod gateway;
mod http;
mod investigation;
mod llm;
mod local_models;
mod manifests;
mod operator;
mod plugins;
mod policy;
mod prometheus;
mod real_model;
mod samples;
mod store;
mod tools;
