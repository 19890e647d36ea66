-- Tool results larger than their cap, kept whole so the model can read them in chunks
-- (read_result_chunk) instead of overflowing its context.
CREATE TABLE tool_results (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    call_id         TEXT NOT NULL,
    tool            TEXT NOT NULL,
    content         TEXT NOT NULL,
    created_at      BIGINT NOT NULL
);
CREATE INDEX tool_results_session ON tool_results (session_id);
