-- Version 5: each write carries a key of its own, so a group committed again
-- after its COMMIT's answer was lost finds what it already wrote instead of
-- writing it twice: a step keeps the key of the write that made it, a claim
-- the key of the claim or take-over that took it. The steps' keys are unique
-- by the index steps_write_key, built after this migration without blocking
-- the table (CREATE UNIQUE INDEX CONCURRENTLY: see CONCURRENT_INDEXES).
ALTER TABLE steps ADD COLUMN write_key TEXT;
ALTER TABLE awaiting ADD COLUMN claim_key TEXT;
-- The server's clock minus the asking host's, when it asked (NULL before):
-- its expiry is compared on the server's clock.
ALTER TABLE awaiting ADD COLUMN clock_offset BIGINT;
