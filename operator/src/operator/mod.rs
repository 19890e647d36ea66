//! Cluster mode (`kortex run`): the operator side of Kortex. The custom resources and the
//! Secrets they reference are watched and compiled into the live configuration the chat
//! server runs on; statuses and Events are written by the leader.

pub mod auth;
pub mod executor;
pub mod lease;
pub mod proposals;
pub mod status;
pub mod watch;
