-- Usage that the provider did not report and Kortex estimated from the text (issue: usage
-- that cannot be dodged). Charged like reported usage; marked so reports can say so.
ALTER TABLE usage_events ADD COLUMN estimated BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE usage_daily ADD COLUMN estimated_requests BIGINT NOT NULL DEFAULT 0;
