-- Slack (docs/slack.md): the Events API deliveries taken, by Slack's event id, so that a
-- delivery Slack retries (it did not see the answer within 3 seconds) runs once on any
-- replica. Rows older than a day are forgotten (Slack retries for minutes, at most a day).
CREATE TABLE slack_events (
    event_id        TEXT PRIMARY KEY,
    received_at     BIGINT NOT NULL
);
