-- Notifications (docs/notifications.md). An event is written in the same transaction as
-- what caused it (a proposal changing phase); the leader fans it out to one delivery per
-- target of its policy and sends each, retrying for up to 24 hours.
CREATE TABLE notify_events (
    id              TEXT PRIMARY KEY,
    event_type      TEXT NOT NULL,
    policy          TEXT NOT NULL,
    subject         TEXT NOT NULL,
    data            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    fanned_at       BIGINT
);
CREATE INDEX notify_events_fan ON notify_events (fanned_at, created_at);

CREATE TABLE notify_deliveries (
    id              TEXT PRIMARY KEY,
    event_id        TEXT NOT NULL,
    policy          TEXT NOT NULL,
    target          TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_at         BIGINT NOT NULL,
    delivered_at    BIGINT,
    failed_at       BIGINT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL
);
CREATE INDEX notify_deliveries_due ON notify_deliveries (delivered_at, failed_at, next_at);
