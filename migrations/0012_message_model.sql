-- Which provider and model wrote each assistant message (docs/chat.md#events), so the
-- transcript says who answered: a failover or a frugal escalation changes it mid-session.
ALTER TABLE chat_messages ADD COLUMN provider TEXT;
ALTER TABLE chat_messages ADD COLUMN model TEXT;
