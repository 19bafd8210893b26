//! The machine's tests, without a database: one file per topic.

mod agent_loop;
mod cache;
mod pii;
mod retry;
mod sampling;
mod strict;
mod untraced;
mod variant;
mod workflow;
