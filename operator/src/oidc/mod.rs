//! Signing people in with the company's OpenID Connect provider (`docs/sso.md`, issue 47,
//! in progress): so far the verification of ID tokens against the provider's keys
//! ([`jwt`]). Discovery, the key set's cache, the authorization code flow with PKCE and
//! the browser session come next and live here too.
//!
//! Imports only `egress`, `catalog` and below (docs/architecture.md).

pub mod jwt;
