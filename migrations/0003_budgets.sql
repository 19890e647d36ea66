-- Budget counters (SPEC §3 Budgets): one row per budget scope and fixed UTC window, so a
-- check on the request path reads and updates one row. Amounts are integers: micro-USD for
-- spend, counts for requests, tokens for session caps. `reserved` holds the estimates of
-- calls in flight; a reservation is a conditional UPDATE (used + reserved + amount <= limit),
-- which makes concurrent calls and replicas unable to overshoot together.
CREATE TABLE budget_counters (
    scope           TEXT NOT NULL,
    window_start    BIGINT NOT NULL,
    used            BIGINT NOT NULL DEFAULT 0,
    reserved        BIGINT NOT NULL DEFAULT 0,
    alerted         BIGINT NOT NULL DEFAULT 0,
    expires_at      BIGINT NOT NULL,
    PRIMARY KEY (scope, window_start)
);
CREATE INDEX budget_counters_expiry ON budget_counters (expires_at);

-- The reservations behind `reserved`, so a replica that dies mid-call does not hold budget
-- forever: expired ones are released by any replica.
CREATE TABLE budget_reservations (
    id              TEXT NOT NULL,
    scope           TEXT NOT NULL,
    window_start    BIGINT NOT NULL,
    amount          BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    PRIMARY KEY (id, scope, window_start)
);
CREATE INDEX budget_reservations_expiry ON budget_reservations (expires_at);
