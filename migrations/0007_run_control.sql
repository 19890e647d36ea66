-- Run control: a run paused at a step boundary is parked (`status = 'paused'`, no task, no
-- provider connection) until it is resumed on any replica, cancelled, or expires; a
-- redirect is kept until the run consumes it, exactly once, at its next step boundary.
ALTER TABLE chat_runs ADD COLUMN paused_at BIGINT;
CREATE TABLE run_intents (
    id              TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES chat_runs (id) ON DELETE CASCADE,
    session_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    message         TEXT NOT NULL,
    rewind_to       BIGINT,
    user_name       TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    consumed_at     BIGINT
);
-- Steps a redirect rewound past: kept in the transcript, left out of what the model sees.
ALTER TABLE chat_messages ADD COLUMN superseded BIGINT NOT NULL DEFAULT 0;
CREATE INDEX run_intents_run ON run_intents (run_id, consumed_at);
-- Plans a model states with submit_plan before its first tool call (ChatPolicy
-- runControl.planning): the latest of a run governs it.
CREATE TABLE run_plans (
    id              TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES chat_runs (id) ON DELETE CASCADE,
    session_id      TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    steps           TEXT NOT NULL,
    status          TEXT NOT NULL,
    approved_steps  TEXT,
    decided_by      TEXT,
    created_at      BIGINT NOT NULL,
    decided_at      BIGINT
);
CREATE INDEX run_plans_run ON run_plans (run_id, created_at);
