-- Hand-over (docs/chat.md#hand-over): whom each run acts for (the person who posted, not
-- always the session's owner), and the notes passing an investigation to the next person.
ALTER TABLE chat_runs ADD COLUMN actor TEXT;
CREATE TABLE session_handovers (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    from_user       TEXT NOT NULL,
    to_user         TEXT NOT NULL,
    note            TEXT NOT NULL,
    summary         TEXT,
    created_at      BIGINT NOT NULL
);
CREATE INDEX session_handovers_session ON session_handovers (session_id, created_at);
