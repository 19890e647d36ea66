-- Hand-over (docs/chat.md#sharing): a session shared with users or groups, to read or to
-- continue; and who wrote each user message.
CREATE TABLE session_shares (
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    kind            TEXT NOT NULL,
    principal       TEXT NOT NULL,
    access          TEXT NOT NULL,
    created_by      TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (session_id, kind, principal)
);
CREATE INDEX session_shares_principal ON session_shares (kind, principal);
ALTER TABLE chat_messages ADD COLUMN author TEXT;
