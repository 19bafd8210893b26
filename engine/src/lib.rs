//! Belay's engine (coordinator).
//!
//! - [`definitions`]: parse and validate `.tools.abl` and YAML definitions (pure).
//! - [`machine`]: the pure run state machine (events in, decisions out).
//! - [`store`]: every SQL statement; PostgreSQL.
//! - [`coordinator`]: drives the machine through the store; leases, sweeper.
//! - [`api`]: the gRPC services (`belay.v1`), health and reflection.

pub mod api;
pub mod coordinator;
pub mod definitions;
pub mod machine;
pub mod store;
