-- Rolling upgrades (see migrations/postgres/…20261209000170).
CREATE TABLE schema_compat (
    id                 INTEGER PRIMARY KEY CHECK (id = 1),
    oldest_compatible  INTEGER NOT NULL
);
INSERT INTO schema_compat (id, oldest_compatible) VALUES (1, 20261209000170);
