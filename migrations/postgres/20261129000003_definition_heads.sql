-- The newest registration of a definition wins, even when its content
-- equals an older version: registering A, then B, then A again makes A (v1)
-- current again instead of leaving B current. `registered_at` moves on every
-- registration of identical content; new runs pin the definition with the
-- latest `registered_at`.
ALTER TABLE definitions ADD COLUMN registered_at timestamptz NOT NULL DEFAULT now();
UPDATE definitions SET registered_at = created_at;
CREATE INDEX definitions_current ON definitions (tenant, kind, name, registered_at DESC, version DESC);
