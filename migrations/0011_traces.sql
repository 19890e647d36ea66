-- Traces (docs/observability.md): the trace each audit row was written in, and each run's
-- trace context (a `traceparent`), so a run taken up again continues its trace and a
-- transcript links to it.
ALTER TABLE decisions ADD COLUMN trace_id TEXT;
ALTER TABLE chat_runs ADD COLUMN traceparent TEXT;
