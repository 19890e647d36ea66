-- Kortex as an MCP server.
-- Tool calls that come in over MCP belong to a session like chat's (for audit rows, kept
-- large results and proposals), one per user, namespace and session name; `origin` keeps
-- those out of the chat session list.
ALTER TABLE chat_sessions ADD COLUMN origin TEXT NOT NULL DEFAULT 'chat';
-- MCP transport sessions (`Mcp-Session-Id`): who opened each one (only they may use it) and
-- the client's `initialize` parameters, so any replica can carry the session on.
CREATE TABLE mcp_sessions (
    id              TEXT PRIMARY KEY,
    user_name       TEXT,
    state           TEXT,
    created_at      BIGINT NOT NULL,
    used_at         BIGINT NOT NULL
);
CREATE INDEX mcp_sessions_used ON mcp_sessions (used_at);
