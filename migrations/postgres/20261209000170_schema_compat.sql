-- Rolling upgrades (issue 22; engine/store/src/schema.rs): the oldest
-- engine schema (the newest migration an engine binary knows) that can run
-- against this database. Additive migrations leave it; a migration that
-- drops what older engines need (contract, a later release than the one
-- that stopped needing it) raises it. An engine that finds migrations it
-- does not know runs beside them while it is at least this, and refuses to
-- start, naming the versions, when it is older.
CREATE TABLE schema_compat (
    id                 smallint PRIMARY KEY CHECK (id = 1),
    oldest_compatible  bigint NOT NULL
);
-- Every engine from the one that knows this migration on.
INSERT INTO schema_compat (id, oldest_compatible) VALUES (1, 20261209000170);
