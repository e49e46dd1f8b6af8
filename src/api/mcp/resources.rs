//! Resources and prompts (SPEC §23): the monitor (`agentd://monitor`, with update
//! notifications to subscribers), each session's trail (`agentd://sessions/{session}/trail`),
//! the workspace's memory files (`agentd://memory/<path>`, read-only), and one prompt per skill.
//! Reads are bounded; a memory file is read only when the listing names it, so no URI reaches
//! outside the workspace's memory files.

use std::path::{Path, PathBuf};

use rmcp::ErrorData as McpError;
use rmcp::model::{
    GetPromptResult, Prompt, PromptMessage, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, Role,
};
use serde_json::Value;

use super::McpOptions;
use super::handler::AgentdMcp;

pub(super) const MONITOR_URI: &str = "agentd://monitor";
const MEMORY_PREFIX: &str = "agentd://memory/";
const TRAIL_PREFIX: &str = "agentd://sessions/";
const TRAIL_SUFFIX: &str = "/trail";
/// Memory files listed at most, and the bytes of one read at most.
const MAX_MEMORY_FILES: usize = 200;
const MAX_READ_BYTES: usize = 256 * 1024;
/// The last events of a trail a read returns at most.
const MAX_TRAIL_EVENTS: usize = 500;

/// The workspace's memory files: `MEMORY.md` and the `.md` files under `memory/` (regular
/// files only, no symlinks), relative paths, sorted, bounded.
fn memory_files(workspace: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let regular = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| m.file_type().is_file())
            .unwrap_or(false)
    };
    if regular(&workspace.join("MEMORY.md")) {
        out.push("MEMORY.md".to_string());
    }
    let mut stack = vec![PathBuf::from("memory")];
    while let Some(rel) = stack.pop() {
        let Ok(dir) = std::fs::read_dir(workspace.join(&rel)) else {
            continue;
        };
        for e in dir.flatten() {
            let (Ok(ft), Some(name)) = (e.file_type(), e.file_name().to_str().map(str::to_owned))
            else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let child = rel.join(&name);
            if ft.is_dir() && stack.len() < MAX_MEMORY_FILES {
                stack.push(child);
            } else if ft.is_file() && name.ends_with(".md") {
                out.push(child.to_string_lossy().into_owned());
            }
            if out.len() >= MAX_MEMORY_FILES {
                break;
            }
        }
    }
    out.sort();
    out.truncate(MAX_MEMORY_FILES);
    out
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

pub(super) async fn list(opts: &McpOptions) -> Vec<Resource> {
    let mut out = vec![
        Resource::new(MONITOR_URI, "monitor")
            .with_description("What agentd is doing now (monitor.json); subscribe for changes")
            .with_mime_type("application/json"),
    ];
    let ws = opts.workspace.clone();
    for f in blocking(move || memory_files(&ws))
        .await
        .unwrap_or_default()
    {
        out.push(
            Resource::new(format!("{MEMORY_PREFIX}{f}"), f.clone())
                .with_description("a workspace memory file (read-only)")
                .with_mime_type("text/markdown"),
        );
    }
    out
}

pub(super) fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(format!("{TRAIL_PREFIX}{{session}}{TRAIL_SUFFIX}"), "trail")
            .with_description("A session's trail (its events), by session id or key")
            .with_mime_type("application/json"),
    ]
}

fn text(uri: &str, body: String, mime: &str) -> ReadResourceResult {
    ReadResourceResult::new(vec![ResourceContents::text(body, uri).with_mime_type(mime)])
}

fn not_found(uri: &str) -> McpError {
    McpError::resource_not_found(
        format!("no resource {}", crate::control::escaped_preview(uri)),
        None,
    )
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

pub(super) async fn read(server: &AgentdMcp, uri: &str) -> Result<ReadResourceResult, McpError> {
    if uri == MONITOR_URI {
        let v = server
            .backend
            .monitor()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        return Ok(text(uri, pretty(&v), "application/json"));
    }
    if let Some(rel) = uri.strip_prefix(MEMORY_PREFIX) {
        let ws = server.opts.workspace.clone();
        let rel = rel.to_string();
        let body = blocking(move || {
            if !memory_files(&ws).contains(&rel) {
                return None;
            }
            let bytes = std::fs::read(ws.join(&rel)).ok()?;
            let cut = &bytes[..bytes.len().min(MAX_READ_BYTES)];
            Some(String::from_utf8_lossy(cut).into_owned())
        })
        .await
        .flatten()
        .ok_or_else(|| not_found(uri))?;
        return Ok(text(uri, body, "text/markdown"));
    }
    if let Some(target) = uri
        .strip_prefix(TRAIL_PREFIX)
        .and_then(|r| r.strip_suffix(TRAIL_SUFFIX))
    {
        if !crate::control::valid_id(target) && !crate::channels::intake::valid_key(target) {
            return Err(not_found(uri));
        }
        let id = super::tools::resolve_session(server, target).await;
        if !crate::control::valid_id(&id) {
            return Err(not_found(uri));
        }
        let mut v = match server.backend.history(id, true).await {
            Ok(Some(v)) => v,
            Ok(None) => return Err(not_found(uri)),
            Err(e) => return Err(McpError::internal_error(e.to_string(), None)),
        };
        if let Some(events) = v["events"].as_array_mut() {
            let over = events.len().saturating_sub(MAX_TRAIL_EVENTS);
            events.drain(..over);
        }
        return Ok(text(uri, pretty(&v), "application/json"));
    }
    Err(not_found(uri))
}

pub(super) async fn prompts(opts: &McpOptions) -> Vec<Prompt> {
    let Some(dir) = opts.skills_dir.clone() else {
        return Vec::new();
    };
    blocking(move || crate::skills::scan(&dir))
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|s| Prompt::new(s.name, Some(s.description), None))
        .collect()
}

pub(super) async fn prompt(opts: &McpOptions, name: &str) -> Result<GetPromptResult, McpError> {
    let Some(dir) = opts.skills_dir.clone() else {
        return Err(McpError::invalid_params("no skills directory", None));
    };
    let skill = blocking(move || crate::skills::scan(&dir))
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            McpError::invalid_params(
                format!("no skill {}", crate::control::escaped_preview(name)),
                None,
            )
        })?;
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, skill.body)])
            .with_description(skill.description),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only `MEMORY.md` and `.md` files under `memory/` are listed: no symlink (which could
    /// point anywhere), no other file of the workspace, no hidden file.
    #[test]
    fn memory_files_are_the_notes_only() {
        let ws = tempfile::tempdir().unwrap();
        let p = ws.path();
        std::fs::write(p.join("MEMORY.md"), "m").unwrap();
        std::fs::write(p.join("SOUL.md"), "s").unwrap();
        std::fs::create_dir_all(p.join("memory/deep")).unwrap();
        std::fs::write(p.join("memory/a.md"), "a").unwrap();
        std::fs::write(p.join("memory/deep/b.md"), "b").unwrap();
        std::fs::write(p.join("memory/c.txt"), "c").unwrap();
        std::fs::write(p.join("memory/.hidden.md"), "h").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("memory/link.md")).unwrap();
        assert_eq!(
            memory_files(p),
            ["MEMORY.md", "memory/a.md", "memory/deep/b.md"]
        );
    }
}
