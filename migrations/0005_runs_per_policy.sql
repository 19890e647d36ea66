-- The policy (`namespace/name`) that governed each run, so a policy's runs in flight can be
-- counted against its `budget.maxConcurrentRuns`.
ALTER TABLE chat_runs ADD COLUMN policy TEXT;
CREATE INDEX chat_runs_policy ON chat_runs (policy, status);
