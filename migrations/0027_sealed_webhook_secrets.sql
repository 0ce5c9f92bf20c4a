-- Outgoing webhook secrets are sealed at rest with SHOPFLOOR_SECRET_KEY, like the signing keys
-- (0015): XChaCha20-Poly1305, bound to the subscription's id. `secret` keeps the plaintext of
-- the rows an earlier release wrote until a process holding the key seals them at start
-- (`serve`, `api`, `engine`, `migrate`), which clears it in the same statement.
ALTER TABLE webhook_subscriptions ADD COLUMN sealed_secret bytea;
ALTER TABLE webhook_subscriptions ALTER COLUMN secret DROP NOT NULL;
ALTER TABLE webhook_subscriptions ADD CONSTRAINT webhook_subscriptions_secret_kept CHECK (secret IS NOT NULL OR sealed_secret IS NOT NULL);
