//! Signing people in with the company's OpenID Connect provider (`docs/sso.md`): the
//! verification of ID tokens against the provider's keys ([`jwt`]), the provider's
//! discovery, keys, token and userinfo endpoints ([`provider`]), and the key that seals
//! what a sign-in keeps ([`seal`]). The HTTP side (the sign-in routes, the session cookie)
//! is `http::sso`'s; the session rows are the store's.
//!
//! Imports only `egress`, `llm`, `catalog` and below (docs/architecture.md).

pub mod jwt;
pub mod provider;
pub mod seal;

pub use provider::{Identity, Provider, Settings, SsoError, Tokens};
pub use seal::SessionKey;
