//! Integration tests: one binary (it links once), one module per area.

mod common;
mod store;
