-- Signing keys sealed at rest, and their retirement.
--
-- `sealed` holds the key's secret sealed with SHOPFLOOR_SECRET_KEY (XChaCha20-Poly1305, the
-- kid as associated data: `engine::sealing`). `secret`, the plaintext of earlier releases,
-- becomes optional: `serve`, `api` and `migrate` (with the key) seal every row that still has
-- one and clear it in the same statement; keys made from now on never have one. Expand only:
-- nothing is dropped or renamed here, so the previous release's replicas keep reading the
-- columns they know; dropping `secret` is a later release's contract step.
--
-- What the columns mean from now on:
--   retired_at    the key stopped signing new tokens (a rotation or a retirement set it)
--   verify_until  the key stops verifying the tokens it signed (a retirement sets it, the
--                 grace after it); NULL: until those tokens expire by themselves
ALTER TABLE signing_keys
    ADD COLUMN sealed bytea,
    ADD COLUMN verify_until timestamptz,
    ALTER COLUMN secret DROP NOT NULL,
    ADD CONSTRAINT signing_keys_have_a_secret CHECK (sealed IS NOT NULL OR secret IS NOT NULL);
