//! Slack as a way in (`docs/slack.md`): a Slack app over HTTPS. What every request from
//! Slack goes through before anything else — its signature ([`verify`]) and its parsing
//! ([`inbound`]) — and what Kortex says back: the Web API client ([`api`]), the messages
//! and cards ([`blocks`]), and who a Slack user is ([`identity`]). The doors that use them
//! are `http::slack_api` and `http::slack_conv`; what an app posts on its own,
//! `notify::slack_app`.
//!
//! Imports only `store`, `catalog` and below (docs/architecture.md).

pub mod api;
pub mod blocks;
pub mod identity;
pub mod inbound;
pub mod verify;

pub use inbound::{Inbound, parse};
pub use verify::{Refusal, verify};
