-- Callback tokens of `type: async_webhook` tool calls.
--
-- The dispatch transition of an async webhook call mints a random token,
-- gives it to the worker once (inside the callback URL) and keeps only its
-- SHA-256 here and in the run's `callback_issued` event. `POST
-- /callbacks/v1/{token}` hashes the token it is given and finds the run
-- here; the run's state decides whether the token is still unused.
CREATE TABLE callbacks (
    token_sha256  text PRIMARY KEY,
    run_id        uuid NOT NULL REFERENCES runs (run_id),
    call_id       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT belay_now()
);
