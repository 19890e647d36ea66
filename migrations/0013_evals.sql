-- Eval results (docs/evals.md#history): one row per configuration an eval ran, written by
-- `kortex eval --record`, read by GET /api/v1/evals and the dashboard's Evals page.
CREATE TABLE eval_runs (
    id              TEXT PRIMARY KEY,
    at              BIGINT NOT NULL,
    label           TEXT NOT NULL,
    kind            TEXT NOT NULL,
    suite           TEXT NOT NULL,
    scenarios       BIGINT NOT NULL,
    attempts        BIGINT NOT NULL,
    passed          BIGINT NOT NULL,
    input_tokens    BIGINT NOT NULL DEFAULT 0,
    output_tokens   BIGINT NOT NULL DEFAULT 0,
    cost_usd        DOUBLE PRECISION NOT NULL DEFAULT 0,
    report          TEXT NOT NULL
);
CREATE INDEX eval_runs_at ON eval_runs (at);
