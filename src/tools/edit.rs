//! `edit`: replace an exact string in a text file (SPEC §11), written back atomically under the
//! same path rule as `read` and `write`.

use std::io::Read;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{Access, Protected, open_read_beneath, resolve_write};
use super::write::{MAX_WRITE_BYTES, write_checked};
use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;

/// The `edit` tool.
#[derive(Debug, Clone, Default)]
pub struct EditTool;

impl EditTool {
    pub fn new() -> EditTool {
        EditTool
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

impl Tool for EditTool {
    fn effects(&self, args: &Value, ctx: &ToolContext) -> super::effects::Effects {
        match args["path"].as_str() {
            Some(p) => super::effects::Effects::writing(super::effects::resolve(&ctx.workspace, p)),
            None => Default::default(),
        }
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "edit".into(),
            description: "Edit a text file by replacing `old_string` with `new_string`. The \
                          match is exact (whitespace included) and must be unique unless \
                          `replace_all` is true. The file is written back atomically. Only \
                          files inside the allowed paths; relative paths start at the \
                          workspace."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "minLength": 1,
                        "description": "File path, absolute or relative to the workspace."
                    },
                    "old_string": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Exact text to replace."
                    },
                    "new_string": {
                        "type": "string",
                        "description": "Replacement text."
                    },
                    "replace_all": {
                        "type": "boolean",
                        "description": "Replace every occurrence (default false: the match must be unique)."
                    }
                },
                "required": ["path", "old_string", "new_string"],
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
            let args: EditArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments for edit: {e}")))?;
            let workspace = ctx.workspace.clone();
            let allowed = ctx.allowed_paths.clone();
            let protected = ctx.protected.clone();
            tokio::task::spawn_blocking(move || {
                let resolved = resolve_write(&args.path, &workspace, &allowed, &protected)?;
                let text = read_for_edit(&resolved, &allowed, &protected, &args.path)?;
                let (new_text, count) = apply_edit(
                    &text,
                    &args.old_string,
                    &args.new_string,
                    args.replace_all,
                    &args.path,
                )?;
                write_checked(
                    &resolved,
                    new_text.as_bytes(),
                    &allowed,
                    &protected,
                    &args.path,
                )?;
                let noun = if count == 1 {
                    "occurrence"
                } else {
                    "occurrences"
                };
                Ok(format!("replaced {count} {noun} in '{}'", args.path))
            })
            .await
            .map_err(|e| ToolError::Failed(format!("edit task failed: {e}")))?
        })
    }
}

/// Read the whole file as UTF-8 (edit refuses binary and oversized files).
fn read_for_edit(
    resolved: &std::path::Path,
    allowed: &[std::path::PathBuf],
    protected: &Protected,
    shown: &str,
) -> Result<String, ToolError> {
    let file = open_read_beneath(resolved, allowed)?;
    protected.check_opened(&file, Access::Write, shown)?;
    let meta = file
        .metadata()
        .map_err(|e| ToolError::Failed(format!("cannot stat '{shown}': {e}")))?;
    if meta.is_dir() {
        return Err(ToolError::Invalid(format!(
            "'{shown}' is a directory; edit takes a file path"
        )));
    }
    if !meta.is_file() {
        return Err(ToolError::Invalid(format!(
            "'{shown}' is not a regular file (a FIFO, socket or device); edit only changes \
             regular files"
        )));
    }
    if meta.len() > MAX_WRITE_BYTES as u64 {
        return Err(ToolError::Invalid(format!(
            "'{shown}' is {} bytes; edit handles files up to {MAX_WRITE_BYTES} bytes",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_WRITE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Failed(format!("cannot read '{shown}': {e}")))?;
    if bytes.contains(&0) {
        return Err(ToolError::Invalid(format!(
            "'{shown}' looks like a binary file (it has a NUL byte); edit only changes text files"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        ToolError::Invalid(format!(
            "'{shown}' is not valid UTF-8; edit only changes UTF-8 text files"
        ))
    })
}

/// Replace `old` by `new` in `text`. Pure. Returns the new text and the number of replacements.
fn apply_edit(
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    shown: &str,
) -> Result<(String, usize), ToolError> {
    if old.is_empty() {
        return Err(ToolError::Invalid(
            "old_string is empty; give the exact text to replace".into(),
        ));
    }
    if old == new {
        return Err(ToolError::Invalid(
            "old_string and new_string are identical; nothing would change".into(),
        ));
    }
    let count = text.matches(old).count();
    if count == 0 {
        return Err(ToolError::Invalid(format!(
            "old_string was not found in '{shown}'; it must match exactly, whitespace and \
             line breaks included (read the file first)"
        )));
    }
    if count > 1 && !replace_all {
        return Err(ToolError::Invalid(format!(
            "old_string occurs {count} times in '{shown}'; add surrounding text to make it \
             unique, or set replace_all to true"
        )));
    }
    let out = if replace_all {
        text.replace(old, new)
    } else {
        text.replacen(old, new, 1)
    };
    Ok((out, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::write::tests::{Ws, workspace};
    use std::os::unix::fs::symlink;

    async fn edit(ws: &Ws, args: Value) -> Result<String, ToolError> {
        EditTool::new().call(args, &ws.ctx).await
    }

    fn put(ws: &Ws, rel: &str, text: &str) {
        std::fs::write(ws.ctx.workspace.join(rel), text).unwrap();
    }

    fn get(ws: &Ws, rel: &str) -> String {
        std::fs::read_to_string(ws.ctx.workspace.join(rel)).unwrap()
    }

    /// A hard link in the workspace to a file outside (`outside/secret` holds "secret"):
    /// editing it would copy the outside content into a fresh workspace file, so it is
    /// refused like `read` refuses it (issue #12 finding 14).
    #[tokio::test]
    async fn hard_link_to_a_file_outside_is_refused() {
        let ws = workspace();
        std::fs::hard_link(
            ws.base.join("outside/secret"),
            ws.ctx.workspace.join("l.txt"),
        )
        .unwrap();
        let err = edit(
            &ws,
            json!({"path": "l.txt", "old_string": "secret", "new_string": "mine"}),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ToolError::Denied(_)), "{err:?}");
        assert!(err.to_string().contains("hard links"), "{err}");
        assert_eq!(
            std::fs::metadata(ws.ctx.workspace.join("l.txt"))
                .map(|m| std::os::unix::fs::MetadataExt::nlink(&m))
                .unwrap(),
            2,
            "the link was not replaced by a copy"
        );
    }

    #[tokio::test]
    async fn replaces_a_unique_match() {
        let ws = workspace();
        put(&ws, "a.txt", "fn main() {\n    old();\n}\n");
        let out = edit(
            &ws,
            json!({"path": "a.txt", "old_string": "old()", "new_string": "new()"}),
        )
        .await
        .unwrap();
        assert_eq!(out, "replaced 1 occurrence in 'a.txt'");
        assert_eq!(get(&ws, "a.txt"), "fn main() {\n    new();\n}\n");
    }

    #[tokio::test]
    async fn not_found_is_an_error_and_leaves_the_file() {
        let ws = workspace();
        put(&ws, "a.txt", "alpha\n");
        let err = edit(
            &ws,
            json!({"path": "a.txt", "old_string": "Alpha", "new_string": "b"}),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
        assert_eq!(get(&ws, "a.txt"), "alpha\n");
    }

    #[tokio::test]
    async fn multiple_matches_need_replace_all_and_say_how_many() {
        let ws = workspace();
        put(&ws, "a.txt", "x x x");
        let err = edit(
            &ws,
            json!({"path": "a.txt", "old_string": "x", "new_string": "y"}),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("occurs 3 times"), "{err}");
        assert_eq!(get(&ws, "a.txt"), "x x x");
        let out = edit(
            &ws,
            json!({"path": "a.txt", "old_string": "x", "new_string": "y", "replace_all": true}),
        )
        .await
        .unwrap();
        assert_eq!(out, "replaced 3 occurrences in 'a.txt'");
        assert_eq!(get(&ws, "a.txt"), "y y y");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let ws = workspace();
        symlink(ws.base.join("outside/secret"), ws.ctx.workspace.join("l")).unwrap();
        symlink(ws.base.join("outside"), ws.ctx.workspace.join("d")).unwrap();
        let sibling = ws.base.join("ws2/secret");
        for path in [
            "../outside/secret",
            "l",
            "d/secret",
            "../ws2/secret",
            sibling.to_str().unwrap(),
        ] {
            let err = edit(
                &ws,
                json!({"path": path, "old_string": "secret", "new_string": "pwned"}),
            )
            .await
            .unwrap_err();
            assert!(matches!(err, ToolError::Denied(_)), "{path}: {err:?}");
        }
        assert_eq!(
            std::fs::read_to_string(ws.base.join("outside/secret")).unwrap(),
            "secret\n"
        );
        assert_eq!(std::fs::read_to_string(&sibling).unwrap(), "sibling\n");
    }

    #[tokio::test]
    async fn missing_file_directory_and_binary_are_errors() {
        let ws = workspace();
        let args = |p: &str| json!({"path": p, "old_string": "a", "new_string": "b"});
        let err = edit(&ws, args("nope.txt")).await.unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
        std::fs::create_dir(ws.ctx.workspace.join("dir")).unwrap();
        let err = edit(&ws, args("dir")).await.unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        std::fs::write(ws.ctx.workspace.join("b.bin"), b"a\0b").unwrap();
        let err = edit(&ws, args("b.bin")).await.unwrap_err();
        assert!(err.to_string().contains("binary"), "{err}");
    }

    #[test]
    fn apply_edit_is_exact() {
        assert_eq!(
            apply_edit("a\r\nb", "a\nb", "z", false, "f")
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            "old_string was not found in 'f'; it must match exactly, whitespace and line breaks \
             included (read the file first)"
        );
        assert_eq!(
            apply_edit("aaa", "aa", "b", true, "f").unwrap(),
            ("ba".into(), 1)
        );
        assert!(apply_edit("a", "a", "a", false, "f").is_err());
    }
}
