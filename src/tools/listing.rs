//! `list` and `glob`: what is in a directory, and which files match a pattern, inside
//! `filesystem.allowed_paths` and under the same rule as `read` (SPEC §11, `paths.rs`). A
//! model without them retried `read` on a directory and gave up. Both are bounded: entries
//! shown, directories walked, depth; symlinks are listed, never followed.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::effects::{Effects, resolve};
use super::paths::{Access, resolve_read};
use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;

/// Entries `list` shows, and matches `glob` returns, at most.
pub const MAX_ENTRIES: usize = 500;
/// Directory entries `glob` looks at, at most.
const MAX_VISITED: usize = 20_000;
/// How deep `glob` descends.
const MAX_DEPTH: usize = 16;

/// The `list` tool.
/// The directory a `path` argument names: the workspace (`.`) when it is left out or empty
/// (a real small model sent `"path": ""` for "everything").
fn dir_arg(path: Option<&str>) -> &str {
    path.filter(|p| !p.trim().is_empty()).unwrap_or(".")
}

pub struct ListTool;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    path: Option<String>,
}

impl Tool for ListTool {
    /// File names come from outside (anyone who can create a file).
    fn untrusted_output(&self) -> bool {
        true
    }

    fn effects(&self, args: &Value, ctx: &ToolContext) -> Effects {
        Effects::reading(vec![resolve(
            &ctx.workspace,
            dir_arg(args["path"].as_str()),
        )])
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list".into(),
            description: format!(
                "List a directory: each entry's name, type (file, dir, link) and size, sorted by \
                 name (at most {MAX_ENTRIES}). `path` is absolute or relative to the workspace; \
                 leave it out for the workspace itself."
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory to list (default: the workspace)."}
                },
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: ListArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments: {e}")))?;
            let shown = dir_arg(args.path.as_deref()).to_string();
            let ctx = ctx.clone();
            tokio::task::spawn_blocking(move || {
                let dir = directory(&shown, &ctx)?;
                list(&dir, &shown)
            })
            .await
            .map_err(|e| ToolError::Failed(format!("list failed: {e}")))?
        })
    }
}

/// The `glob` tool.
pub struct GlobTool;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    path: Option<String>,
}

impl Tool for GlobTool {
    /// File names come from outside (anyone who can create a file).
    fn untrusted_output(&self) -> bool {
        true
    }

    fn effects(&self, args: &Value, ctx: &ToolContext) -> Effects {
        Effects::reading(vec![resolve(
            &ctx.workspace,
            dir_arg(args["path"].as_str()),
        )])
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "glob".into(),
            description: format!(
                "Find files whose path (relative to `path`, default the workspace) matches a \
                 glob pattern: `*` within a name, `**` across directories, `?`, `[abc]`; e.g. \
                 `**/*.md`. Returns the matching paths, sorted (at most {MAX_ENTRIES})."
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "maxLength": 500, "description": "Glob pattern, e.g. **/*.md"},
                    "path": {"type": "string", "description": "Directory to search (default: the workspace)."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: GlobArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments: {e}")))?;
            let pattern = glob::Pattern::new(&args.pattern).map_err(|e| {
                ToolError::Invalid(format!("pattern {:?} is not a glob: {e}", args.pattern))
            })?;
            let shown = dir_arg(args.path.as_deref()).to_string();
            let ctx = ctx.clone();
            tokio::task::spawn_blocking(move || {
                let dir = directory(&shown, &ctx)?;
                find(&dir, &pattern, &ctx)
            })
            .await
            .map_err(|e| ToolError::Failed(format!("glob failed: {e}")))?
        })
    }
}

/// `shown` resolved under the read rule, and a directory.
fn directory(shown: &str, ctx: &ToolContext) -> Result<PathBuf, ToolError> {
    let (dir, _) = resolve_read(shown, &ctx.workspace, &ctx.allowed_paths, &ctx.protected)?;
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(ToolError::Invalid(format!(
            "'{shown}' is a file, not a directory; read it with `read`"
        ))),
        Err(e) => Err(ToolError::Failed(format!("cannot list '{shown}': {e}"))),
    }
}

fn list(dir: &Path, shown: &str) -> Result<String, ToolError> {
    let mut entries: Vec<(String, &'static str, u64)> = std::fs::read_dir(dir)
        .map_err(|e| ToolError::Failed(format!("cannot list '{shown}': {e}")))?
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (kind, size) = match e.metadata() {
                Ok(m) if m.file_type().is_symlink() => ("link", 0),
                Ok(m) if m.is_dir() => ("dir", 0),
                Ok(m) => ("file", m.len()),
                Err(_) => ("?", 0),
            };
            (name, kind, size)
        })
        .collect();
    entries.sort();
    let total = entries.len();
    let mut out = format!("{} ({total} entries)\n", dir.display());
    for (name, kind, size) in entries.iter().take(MAX_ENTRIES) {
        let line = match *kind {
            "dir" => format!("{name}/  dir\n"),
            "file" => format!("{name}  file  {size} bytes\n"),
            other => format!("{name}  {other}\n"),
        };
        out.push_str(&line);
    }
    if total > MAX_ENTRIES {
        out.push_str(&format!(
            "… {} more not shown; list a subdirectory or use `glob`\n",
            total - MAX_ENTRIES
        ));
    }
    Ok(out)
}

fn find(dir: &Path, pattern: &glob::Pattern, ctx: &ToolContext) -> Result<String, ToolError> {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let mut matches = Vec::new();
    let mut visited = 0usize;
    let mut cut = false;
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in read.flatten() {
            visited += 1;
            if visited > MAX_VISITED || matches.len() >= MAX_ENTRIES {
                cut = true;
                break;
            }
            let path = e.path();
            let Ok(rel) = path.strip_prefix(dir) else {
                continue;
            };
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if pattern.matches_path_with(rel, options) {
                matches.push(rel.display().to_string() + if is_dir { "/" } else { "" });
            }
            // Not into protected directories (the state and config directories), nor deeper
            // than the bound; symlinks are not directories here, so they are not followed.
            if is_dir && depth < MAX_DEPTH && ctx.protected.check(&path, Access::Read, "").is_ok() {
                stack.push((path, depth + 1));
            }
        }
        if cut {
            break;
        }
    }
    matches.sort();
    let mut out = format!("{} match(es) under {}\n", matches.len(), dir.display());
    for m in &matches {
        out.push_str(m);
        out.push('\n');
    }
    if cut {
        out.push_str(&format!(
            "… stopped after {} matches or {MAX_VISITED} entries; narrow the pattern or the path\n",
            matches.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tools::{SessionStatus, StatusSource};

    struct NoStatus;
    impl StatusSource for NoStatus {
        fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
            Box::pin(async { Err("none".to_string()) })
        }
    }

    fn ctx(dir: &Path) -> ToolContext {
        ToolContext {
            session_id: "s".into(),
            session_key: "k".into(),
            workspace: dir.to_path_buf(),
            allowed_paths: vec![dir.to_path_buf()],
            protected: crate::tools::paths::Protected::new(dir.join("state"), dir.join("config")),
            reply_to: None,
            status: Arc::new(NoStatus),
            sees_images: false,
        }
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("notes/old")).unwrap();
        std::fs::create_dir_all(root.join("state/sessions")).unwrap();
        std::fs::write(root.join("MEMORY.md"), "m").unwrap();
        std::fs::write(root.join("notes/a.md"), "aaa").unwrap();
        std::fs::write(root.join("notes/old/b.md"), "b").unwrap();
        std::fs::write(root.join("notes/c.txt"), "c").unwrap();
        std::fs::write(root.join("state/sessions/secret.md"), "s").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
        d
    }

    #[tokio::test]
    async fn list_shows_entries_with_type_and_size() {
        let d = tree();
        let c = ctx(&std::fs::canonicalize(d.path()).unwrap());
        let out = ListTool.call(json!({}), &c).await.unwrap();
        assert!(out.contains("MEMORY.md  file  1 bytes"), "{out}");
        // An empty path, as a real 1.5B model sent it, is the workspace too.
        let empty = ListTool.call(json!({"path": ""}), &c).await.unwrap();
        assert_eq!(empty, out);
        assert!(out.contains("notes/  dir"), "{out}");
        assert!(out.contains("etc-link  link"), "{out}");
        let out = ListTool.call(json!({"path": "notes"}), &c).await.unwrap();
        assert!(
            out.contains("a.md  file  3 bytes") && out.contains("old/  dir"),
            "{out}"
        );
        let e = ListTool
            .call(json!({"path": "MEMORY.md"}), &c)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let e = ListTool
            .call(json!({"path": "/etc"}), &c)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("outside the allowed paths"), "{e}");
        assert!(ListTool.call(json!({"path": "state"}), &c).await.is_err());
    }

    #[tokio::test]
    async fn glob_matches_across_directories_and_skips_protected_ones() {
        let d = tree();
        let c = ctx(&std::fs::canonicalize(d.path()).unwrap());
        let out = GlobTool
            .call(json!({"pattern": "**/*.md"}), &c)
            .await
            .unwrap();
        assert!(out.starts_with("3 match(es)"), "{out}");
        for f in ["MEMORY.md", "notes/a.md", "notes/old/b.md"] {
            assert!(out.contains(f), "{f} in {out}");
        }
        assert!(
            !out.contains("secret.md"),
            "the state directory is not searched: {out}"
        );
        let out = GlobTool
            .call(json!({"pattern": "*.txt", "path": "notes"}), &c)
            .await
            .unwrap();
        assert!(out.contains("c.txt") && out.starts_with("1 match"), "{out}");
        let e = GlobTool
            .call(json!({"pattern": "[unclosed"}), &c)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a glob"), "{e}");
    }
}
