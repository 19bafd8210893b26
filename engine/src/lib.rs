//! Belay's engine (coordinator).
//!
//! - [`definitions`]: parse and validate `.tools.abl` and YAML definitions (pure).
//! - [`machine`]: the pure run state machine (events in, decisions out).
//! - [`store`]: every SQL statement; PostgreSQL.
//! - [`coordinator`]: drives the machine through the store; leases, sweeper.
//! - [`api`]: the gRPC services (`belay.v1`), health and reflection.
//! - [`admin`]: the admin HTTP endpoint (uncertain outcomes, run controls).
//! - [`callbacks`]: the callback HTTP endpoint of `type: async_webhook` tools.
//! - [`notify`]: webhook delivery of operator notifications.

pub mod admin;
pub mod api;
pub mod callbacks;
pub mod coordinator;
pub mod definitions;
pub mod machine;
pub mod notify;
pub mod store;
