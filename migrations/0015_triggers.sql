-- Alert-triggered and scheduled investigations (docs/triggers.md). Each alert notification
-- a trigger takes (or a schedule slot it claims) is one row of trigger_events, written in
-- the transaction that answers Alertmanager; the dispatcher starts runs from these rows,
-- so an accepted alert survives a crash and runs once per group change.
CREATE TABLE trigger_events (
    id                TEXT PRIMARY KEY,
    policy            TEXT NOT NULL,
    trigger_name      TEXT NOT NULL,
    kind              TEXT NOT NULL,
    group_key         TEXT NOT NULL,
    caller            TEXT NOT NULL,
    payload           TEXT NOT NULL,
    state             TEXT NOT NULL,
    reason            TEXT,
    session_id        TEXT,
    run_id            TEXT,
    claimed_by        TEXT,
    claimed_until     BIGINT,
    finished_notified BIGINT NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL,
    done_at           BIGINT
);
CREATE INDEX trigger_events_state ON trigger_events (state, created_at);
CREATE INDEX trigger_events_group ON trigger_events (policy, trigger_name, group_key, created_at);
CREATE INDEX trigger_events_runs ON trigger_events (policy, trigger_name, state, done_at);
CREATE INDEX trigger_events_announce ON trigger_events (state, finished_notified);

-- One row per (trigger, Alertmanager groupKey): the session it investigates in while the
-- group fires, and the fingerprints of the alerts that session has seen.
CREATE TABLE trigger_groups (
    policy            TEXT NOT NULL,
    trigger_name      TEXT NOT NULL,
    group_key         TEXT NOT NULL,
    session_id        TEXT,
    fingerprints      TEXT NOT NULL,
    firing            BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (policy, trigger_name, group_key)
);

-- Schedule slots claimed: one replica fires each.
CREATE TABLE trigger_slots (
    policy            TEXT NOT NULL,
    trigger_name      TEXT NOT NULL,
    slot              BIGINT NOT NULL,
    replica           TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    PRIMARY KEY (policy, trigger_name, slot)
);

-- A triggered session is governed by its trigger's policy, whatever its name matches.
ALTER TABLE chat_sessions ADD COLUMN trigger_ref TEXT;
CREATE INDEX chat_sessions_trigger ON chat_sessions (trigger_ref);

-- trigger.skipped is written at most once an hour per trigger: found by this index.
CREATE INDEX notify_events_type_subject ON notify_events (event_type, subject, created_at);
