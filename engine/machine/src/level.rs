//! The behaviour levels at which the machine writes an event form that an
//! older release cannot fold (issue 22's expand/contract policy for
//! behaviour, `belay_store::fleet_level`). The store passes the fleet's
//! level in with each transition (`RunState::fleet_level`); the machine
//! writes a form only at or above its level, the older form otherwise, and
//! the fold reads every form of every level.

/// A `set`, `branch` or `succeed` node is one [`Event::NodePassed`]
/// instead of a `NodeStarted` and a `NodeCompleted`.
///
/// [`Event::NodePassed`]: crate::Event::NodePassed
pub const NODE_PASSED: u32 = 2;

/// A tool node's start is folded into its call's `ToolCallScheduled`
/// (`starts_node`) and its end into the call's `ToolCallCompleted`
/// (`ends_node`), where the pair carried the same arguments and result.
pub const FOLDED_TOOL_NODE: u32 = 3;
