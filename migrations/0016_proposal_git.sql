-- A proposal delivered through Git (docs/gitops.md): its branch, commit, change request
-- and the request's state, as the leader last saw them (JSON, like preview and undo).
ALTER TABLE proposals ADD COLUMN git TEXT;
