//! Tools that run only as MCP tasks (MCP 2025-11-25: `execution.taskSupport: "required"`).
//! agentd calls tools directly, so such a tool always fails: it is not offered
//! ([`super::proxy::expose`] refuses it). rmcp's `Tool` has no `execution` field any more (its
//! tasks follow a later extension), so the stdio pump reads it from the raw `tools/list`
//! answers ([`TaskOnly::observe`]) before rmcp parses them. An HTTP server's task-only tools
//! cannot be seen this way: they are offered and fail when called.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde::Deserialize;

/// The names of one server's tools that its latest listing marked task-only.
#[derive(Debug, Default)]
pub(super) struct TaskOnly(Mutex<BTreeSet<String>>);

#[derive(Deserialize)]
struct Answer {
    result: Listing,
}

#[derive(Deserialize)]
struct Listing {
    tools: Vec<Listed>,
}

#[derive(Deserialize)]
struct Listed {
    name: String,
    #[serde(default)]
    execution: Option<Execution>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Execution {
    #[serde(default)]
    task_support: Option<String>,
}

impl TaskOnly {
    /// Take one message of the server: a `tools/list` answer (page) updates the set for the
    /// tools it lists. Only a line that mentions `taskSupport` is parsed.
    pub(super) fn observe(&self, line: &[u8]) {
        const NEEDLE: &[u8] = b"\"taskSupport\"";
        if !line.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
            return;
        }
        let Ok(answer) = serde_json::from_slice::<Answer>(line) else {
            return;
        };
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for tool in answer.result.tools {
            let required = tool
                .execution
                .and_then(|e| e.task_support)
                .is_some_and(|t| t == "required");
            match required {
                true => set.insert(tool.name),
                false => set.remove(&tool.name),
            };
        }
    }

    /// Whether the tool named `remote` runs only as a task.
    pub(super) fn contains(&self, remote: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_marks_and_unmarks_task_only_tools() {
        let t = TaskOnly::default();
        t.observe(
            br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[
            {"name":"a","inputSchema":{},"execution":{"taskSupport":"required"}},
            {"name":"b","inputSchema":{},"execution":{"taskSupport":"optional"}},
            {"name":"c","inputSchema":{}}]}}"#,
        );
        assert!(t.contains("a"));
        assert!(!t.contains("b") && !t.contains("c"));
        // A later listing that no longer requires a task frees it.
        t.observe(
            br#"{"jsonrpc":"2.0","id":3,"result":{"tools":[
            {"name":"a","inputSchema":{},"execution":{"taskSupport":"forbidden"}}]}}"#,
        );
        assert!(!t.contains("a"));
        // Other messages change nothing, whatever they say.
        t.observe(br#"{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"\"taskSupport\""}]}}"#);
        t.observe(b"not json \"taskSupport\"");
        assert!(!t.contains("a"));
    }
}
