-- Kortex schema, portable across PostgreSQL and SQLite: ids are TEXT, timestamps are
-- integer Unix milliseconds, JSON is TEXT, money is DOUBLE PRECISION US dollars, and
-- booleans are BIGINT 0/1 (sqlx's Any driver cannot read SQLite booleans).

CREATE TABLE chat_sessions (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    policy          TEXT,
    status          TEXT NOT NULL DEFAULT 'idle',
    title           TEXT,
    dynamic_tools   TEXT NOT NULL DEFAULT '[]',
    last_event_seq  BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    deleted_at      BIGINT
);
CREATE INDEX chat_sessions_user ON chat_sessions (user_name, updated_at);
CREATE INDEX chat_sessions_name ON chat_sessions (namespace, name);

CREATE TABLE chat_messages (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    seq             BIGINT NOT NULL,
    run_id          TEXT,
    role            TEXT NOT NULL,
    content         TEXT NOT NULL,
    tool_calls      TEXT,
    tool_call_id    TEXT,
    is_error        BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    UNIQUE (session_id, seq)
);

CREATE TABLE chat_runs (
    id              TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    status          TEXT NOT NULL,
    owner           TEXT NOT NULL,
    heartbeat_at    BIGINT NOT NULL,
    started_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    reason          TEXT
);
CREATE INDEX chat_runs_session ON chat_runs (session_id, started_at);
CREATE INDEX chat_runs_active ON chat_runs (status, heartbeat_at);

-- The SSE log: every event of a session with its sequence number, for replay.
CREATE TABLE run_events (
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    seq             BIGINT NOT NULL,
    run_id          TEXT,
    event_type      TEXT NOT NULL,
    data            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- The audit log: one row per LLM call, tool call, proposal and decision. Never deleted with
-- a session.
CREATE TABLE decisions (
    id              TEXT PRIMARY KEY,
    at              BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    namespace       TEXT,
    session_id      TEXT,
    run_id          TEXT,
    user_name       TEXT,
    policy          TEXT,
    subject         TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    detail          TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX decisions_at ON decisions (at, id);
CREATE INDEX decisions_session ON decisions (session_id, at);
CREATE INDEX decisions_kind ON decisions (kind, at);

CREATE TABLE usage_events (
    id              TEXT PRIMARY KEY,
    at              BIGINT NOT NULL,
    day             TEXT NOT NULL,
    source          TEXT NOT NULL,
    policy          TEXT NOT NULL DEFAULT '',
    session_id      TEXT,
    user_name       TEXT NOT NULL DEFAULT '',
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    input_tokens    BIGINT NOT NULL DEFAULT 0,
    output_tokens   BIGINT NOT NULL DEFAULT 0,
    cost_usd        DOUBLE PRECISION NOT NULL DEFAULT 0,
    latency_ms      BIGINT NOT NULL DEFAULT 0,
    outcome         TEXT NOT NULL
);
CREATE INDEX usage_events_at ON usage_events (at);
CREATE INDEX usage_events_session ON usage_events (session_id);

-- Daily roll-ups, updated with each usage event so reports never scan usage_events.
CREATE TABLE usage_daily (
    day             TEXT NOT NULL,
    policy          TEXT NOT NULL,
    provider        TEXT NOT NULL,
    model           TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    requests        BIGINT NOT NULL DEFAULT 0,
    input_tokens    BIGINT NOT NULL DEFAULT 0,
    output_tokens   BIGINT NOT NULL DEFAULT 0,
    cost_usd        DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (day, policy, provider, model, user_name)
);

-- Proposals (standalone mode), or a mirror of ActionProposal objects (cluster mode).
CREATE TABLE proposals (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    session_id      TEXT,
    session_name    TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    policy          TEXT,
    action          TEXT NOT NULL,
    target          TEXT,
    params          TEXT,
    rationale       TEXT NOT NULL,
    blast_radius    TEXT,
    reversible      BIGINT,
    provider        TEXT,
    model           TEXT,
    phase           TEXT NOT NULL,
    decision        TEXT,
    message         TEXT,
    preview         TEXT,
    undo            TEXT,
    expires_at      BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    version         BIGINT NOT NULL DEFAULT 1,
    UNIQUE (namespace, name)
);
CREATE INDEX proposals_phase ON proposals (phase, expires_at);
CREATE INDEX proposals_session ON proposals (session_id);
