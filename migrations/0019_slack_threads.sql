-- Slack (docs/slack.md): the session a thread investigates in. A mention starts one; later
-- messages of the thread continue it, on any replica.
CREATE TABLE slack_threads (
    team_id         TEXT NOT NULL,
    channel         TEXT NOT NULL,
    thread_ts       TEXT NOT NULL,
    session_id      TEXT NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (team_id, channel, thread_ts)
);
