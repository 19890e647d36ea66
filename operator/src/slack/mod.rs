//! Slack as a way in (issue 48, in progress; `docs/slack.md` to come): a Slack app over
//! HTTPS. So far, what every request from Slack goes through before anything else: its
//! signature ([`verify`]) and its parsing ([`inbound`]); retried events are claimed once in
//! the store (`Store::claim_slack_event`).
//!
//! Imports only `store`, `catalog` and below (docs/architecture.md).

pub mod api;
pub mod blocks;
pub mod identity;
pub mod inbound;
pub mod verify;

pub use inbound::{Inbound, parse};
pub use verify::{Refusal, verify};
