-- A console session made from a pasted token names that token, so that revoking the token
-- ends the sessions made from it, and the sessions made from those (a session's own token can
-- be pasted too).
ALTER TABLE api_tokens ADD COLUMN issued_from uuid REFERENCES api_tokens;
CREATE INDEX api_tokens_by_parent ON api_tokens (issued_from) WHERE issued_from IS NOT NULL;
