-- Single sign-on (docs/sso.md). A sign-in under way: found by the SHA-256 of its `state`,
-- taken once (a replayed state finds nothing); its nonce and PKCE verifier are sealed with
-- the session key. Also the one-time codes `kortex login` exchanges for a session.
CREATE TABLE sign_ins (
    state_hash      TEXT PRIMARY KEY,
    sealed          TEXT NOT NULL,
    expires_at      BIGINT NOT NULL
);
-- A signed-in browser or CLI: found by the SHA-256 of the id its cookie or bearer token
-- holds; the provider's tokens sealed with the session key (`key_id` names the key, so a
-- replica with another one says so). `version` orders the refreshes of every replica.
CREATE TABLE auth_sessions (
    id_hash         TEXT PRIMARY KEY,
    subject         TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    groups          TEXT NOT NULL,
    sealed          TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    token_expires   BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    version         BIGINT NOT NULL
);
CREATE INDEX auth_sessions_user ON auth_sessions (user_name);
