//! (stub: filled in by its owner)
pub struct ToolRegistry;
