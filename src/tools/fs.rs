//! File tools. `read`: numbered lines of a text file inside `filesystem.allowed_paths`
//! (SPEC §11). The path rule lives in `paths.rs`.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::open_for_read;
use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;

/// Lines returned when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 2000;
/// Longer lines are cut to this many characters, with a marker.
pub const MAX_LINE_CHARS: usize = 2000;
/// At most this many bytes of a file are read.
pub const MAX_READ_BYTES: u64 = 10 * 1024 * 1024;
/// A NUL byte in this many leading bytes marks a file as binary.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;
/// Default character budget of one answer. Kept below the default `output_truncation` (30000)
/// so the "use offset=M" note survives instead of the registry's blunt truncation marker.
pub const DEFAULT_OUTPUT_BUDGET: usize = 25_000;

/// The `read` tool.
#[derive(Debug, Clone)]
pub struct ReadTool {
    output_budget: usize,
}

impl Default for ReadTool {
    fn default() -> Self {
        ReadTool {
            output_budget: DEFAULT_OUTPUT_BUDGET,
        }
    }
}

impl ReadTool {
    pub fn new() -> ReadTool {
        ReadTool::default()
    }

    /// Stop adding lines once the answer would exceed `chars` characters (at least one line is
    /// always returned); the trailing note then says where to continue.
    pub fn with_output_budget(chars: usize) -> ReadTool {
        ReadTool {
            output_budget: chars,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl Tool for ReadTool {
    /// A file's content may come from anywhere (downloads, a cloned repository): marked
    /// untrusted by the registry.
    fn untrusted_output(&self) -> bool {
        true
    }

    fn effects(&self, args: &Value, ctx: &ToolContext) -> super::effects::Effects {
        match args["path"].as_str() {
            Some(p) => {
                super::effects::Effects::reading(vec![super::effects::resolve(&ctx.workspace, p)])
            }
            None => Default::default(),
        }
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read".into(),
            description: format!(
                "Read a text file. Returns its lines numbered like `cat -n`, starting at line \
                 `offset` (1-based, default 1), at most `limit` lines (default {DEFAULT_LIMIT}). \
                 Lines longer than {MAX_LINE_CHARS} characters are shortened. Only files inside \
                 the allowed paths can be read; relative paths start at the workspace."
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "minLength": 1,
                        "description": "File path, absolute or relative to the workspace."
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "1-based number of the first line to return (default 1)."
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": format!("Maximum number of lines to return (default {DEFAULT_LIMIT}).")
                    }
                },
                "required": ["path"],
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
            let args: ReadArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments for read: {e}")))?;
            let offset = usize::try_from(args.offset.unwrap_or(1).max(1)).unwrap_or(usize::MAX);
            let limit = usize::try_from(args.limit.unwrap_or(DEFAULT_LIMIT as u64).max(1))
                .unwrap_or(usize::MAX);
            let workspace = ctx.workspace.clone();
            let allowed = ctx.allowed_paths.clone();
            let protected = ctx.protected.clone();
            let budget = self.output_budget;
            tokio::task::spawn_blocking(move || {
                let (_, file) = open_for_read(&args.path, &workspace, &allowed, &protected)?;
                let (bytes, size) = read_text_file(file, &args.path)?;
                render(&bytes, size, offset, limit, budget, &args.path)
            })
            .await
            .map_err(|e| ToolError::Failed(format!("read task failed: {e}")))?
        })
    }
}

/// Check the handle is a regular file, then read at most `MAX_READ_BYTES`, refusing binary
/// content. Returns the bytes and the file's full size.
fn read_text_file(file: File, shown: &str) -> Result<(Vec<u8>, u64), ToolError> {
    let meta = file
        .metadata()
        .map_err(|e| ToolError::Failed(format!("cannot stat '{shown}': {e}")))?;
    if meta.is_dir() {
        return Err(ToolError::Invalid(format!(
            "'{shown}' is a directory, not a file; read takes a file path"
        )));
    }
    if !meta.is_file() {
        return Err(ToolError::Invalid(format!(
            "'{shown}' is not a regular file (a FIFO, socket or device); read only reads \
             regular files"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_READ_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Failed(format!("cannot read '{shown}': {e}")))?;
    let sniff = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if sniff.contains(&0) {
        return Err(ToolError::Invalid(format!(
            "'{shown}' looks like a binary file (it has a NUL byte in its first 8 KiB); read \
             only shows text files"
        )));
    }
    Ok((bytes, meta.len()))
}

/// Number the requested lines. Pure, so the formatting is tested without a file system.
fn render(
    bytes: &[u8],
    file_size: u64,
    offset: usize,
    limit: usize,
    budget: usize,
    shown: &str,
) -> Result<String, ToolError> {
    let text = String::from_utf8_lossy(bytes);
    let total = text.lines().count();
    if total == 0 {
        return Ok(format!("[{shown} is empty]"));
    }
    if offset > total {
        return Err(ToolError::Invalid(format!(
            "offset {offset} is past the end of '{shown}', which has {total} lines; use an \
             offset from 1 to {total}"
        )));
    }
    let mut out = String::new();
    let mut used = 0usize;
    let mut next = offset;
    for (index, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        let number = index + 1;
        let mut rendered = String::new();
        let _ = write!(rendered, "{number:>6}\t");
        push_line(&mut rendered, line);
        rendered.push('\n');
        let chars = rendered.chars().count();
        if used > 0 && used + chars > budget {
            break;
        }
        used += chars;
        out.push_str(&rendered);
        next = number + 1;
    }
    let remaining = total + 1 - next;
    if remaining > 0 {
        let _ = writeln!(out, "[... {remaining} more lines; use offset={next}]");
    }
    if file_size > MAX_READ_BYTES {
        let _ = writeln!(
            out,
            "[file is {file_size} bytes; only its first {} MiB were read]",
            MAX_READ_BYTES / (1024 * 1024)
        );
    }
    // Drop the final newline: the model sees a block of lines, not a trailing blank.
    if out.ends_with('\n') {
        out.pop();
    }
    Ok(out)
}

/// Append `line`, shortened to `MAX_LINE_CHARS` characters with a marker.
fn push_line(out: &mut String, line: &str) {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None => out.push_str(line),
        Some((cut, _)) => {
            let total = MAX_LINE_CHARS + line[cut..].chars().count();
            out.push_str(&line[..cut]);
            let _ = write!(out, " [... line shortened: {total} characters]");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{SessionStatus, StatusSource};
    use std::path::PathBuf;
    use std::sync::Arc;

    struct NoStatus;
    impl StatusSource for NoStatus {
        fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
            Box::pin(async { Err("none".to_string()) })
        }
    }

    struct Ws {
        _tmp: tempfile::TempDir,
        base: PathBuf,
        ctx: ToolContext,
    }

    fn workspace() -> Ws {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonicalize");
        let ws = base.join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        let ctx = ToolContext {
            session_id: "s".into(),
            session_key: "k".into(),
            workspace: ws.clone(),
            allowed_paths: vec![ws],
            protected: Default::default(),
            reply_to: None,
            status: Arc::new(NoStatus),
            sees_images: false,
        };
        Ws {
            _tmp: tmp,
            base,
            ctx,
        }
    }

    impl Ws {
        fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) {
            std::fs::write(self.ctx.workspace.join(rel), bytes).expect("write");
        }
    }

    async fn read(ws: &Ws, args: Value) -> Result<String, ToolError> {
        ReadTool::new().call(args, &ws.ctx).await
    }

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[tokio::test]
    async fn numbers_lines_like_cat_n() {
        let ws = workspace();
        ws.write("a.txt", "alpha\nbeta\n\ngamma");
        let out = read(&ws, json!({"path": "a.txt"})).await.unwrap();
        assert_eq!(out, "     1\talpha\n     2\tbeta\n     3\t\n     4\tgamma");
    }

    #[tokio::test]
    async fn absolute_path_inside_works() {
        let ws = workspace();
        ws.write("a.txt", "x\n");
        let abs = ws.ctx.workspace.join("a.txt");
        let out = read(&ws, json!({"path": abs})).await.unwrap();
        assert_eq!(out, "     1\tx");
    }

    #[tokio::test]
    async fn offset_and_limit_select_lines_and_say_what_remains() {
        let ws = workspace();
        ws.write("n.txt", numbered(10));
        let out = read(&ws, json!({"path": "n.txt", "offset": 3, "limit": 2}))
            .await
            .unwrap();
        assert_eq!(
            out,
            "     3\tline 3\n     4\tline 4\n[... 6 more lines; use offset=5]"
        );
        let out = read(&ws, json!({"path": "n.txt", "offset": 9}))
            .await
            .unwrap();
        assert_eq!(out, "     9\tline 9\n    10\tline 10");
    }

    #[tokio::test]
    async fn default_limit_is_2000_lines() {
        let ws = workspace();
        ws.write("big.txt", "x\n".repeat(2500));
        let out = read(&ws, json!({"path": "big.txt"})).await.unwrap();
        assert!(out.contains("  2000\tx\n"));
        assert!(!out.contains("  2001\t"));
        assert!(
            out.ends_with("[... 500 more lines; use offset=2001]"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn offset_past_eof_is_an_error() {
        let ws = workspace();
        ws.write("n.txt", numbered(3));
        let err = read(&ws, json!({"path": "n.txt", "offset": 4}))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("offset 4") && msg.contains("3 lines"), "{msg}");
    }

    #[tokio::test]
    async fn empty_file_says_so() {
        let ws = workspace();
        ws.write("e.txt", "");
        let out = read(&ws, json!({"path": "e.txt"})).await.unwrap();
        assert_eq!(out, "[e.txt is empty]");
    }

    #[tokio::test]
    async fn path_outside_is_denied() {
        let ws = workspace();
        std::fs::write(ws.base.join("secret"), "s3cret\n").unwrap();
        let err = read(&ws, json!({"path": "../secret"})).await.unwrap_err();
        assert!(matches!(err, ToolError::Denied(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret"));
        std::os::unix::fs::symlink(ws.base.join("secret"), ws.ctx.workspace.join("l")).unwrap();
        let err = read(&ws, json!({"path": "l"})).await.unwrap_err();
        assert!(matches!(err, ToolError::Denied(_)), "{err:?}");
    }

    /// Issue #12 finding 14: a hard link inside the allowed path to a file outside it is
    /// refused (checked on the opened file), with an error naming the path and the reason.
    #[tokio::test]
    async fn hard_link_to_a_file_outside_is_refused() {
        let ws = workspace();
        std::fs::write(ws.base.join("secret"), "s3cret\n").unwrap();
        std::fs::hard_link(
            ws.base.join("secret"),
            ws.ctx.workspace.join("innocent.txt"),
        )
        .unwrap();
        let err = read(&ws, json!({"path": "innocent.txt"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::Denied(_)), "{err:?}");
        let msg = err.to_string();
        assert!(!msg.contains("s3cret"), "{msg}");
        assert!(
            msg.contains("innocent.txt") && msg.contains("hard link"),
            "{msg}"
        );
        // Once the other name is gone, the file is an ordinary one-link file again.
        std::fs::remove_file(ws.base.join("secret")).unwrap();
        let out = read(&ws, json!({"path": "innocent.txt"})).await.unwrap();
        assert_eq!(out, "     1\ts3cret");
    }

    #[tokio::test]
    async fn missing_file_is_a_clear_error() {
        let ws = workspace();
        let err = read(&ws, json!({"path": "nope.txt"})).await.unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
    }

    #[tokio::test]
    async fn directory_is_refused() {
        let ws = workspace();
        std::fs::create_dir(ws.ctx.workspace.join("d")).unwrap();
        let err = read(&ws, json!({"path": "d"})).await.unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[tokio::test]
    async fn binary_file_is_refused() {
        let ws = workspace();
        ws.write("b.bin", b"\x7fELF\x02\x01\x01\x00\x00rest");
        let err = read(&ws, json!({"path": "b.bin"})).await.unwrap_err();
        assert!(err.to_string().contains("binary"), "{err}");
    }

    #[tokio::test]
    async fn fifo_is_refused_without_hanging() {
        let ws = workspace();
        let fifo = ws.ctx.workspace.join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read(&ws, json!({"path": "pipe"})).await.unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[tokio::test]
    async fn long_lines_are_shortened_with_a_marker() {
        let ws = workspace();
        ws.write("long.txt", format!("{}\nshort\n", "é".repeat(2500)));
        let out = read(&ws, json!({"path": "long.txt"})).await.unwrap();
        let first = out.lines().next().unwrap();
        assert!(first.starts_with(&format!("     1\t{}", "é".repeat(2000))));
        assert!(
            first.ends_with(" [... line shortened: 2500 characters]"),
            "{first}"
        );
        assert!(out.ends_with("     2\tshort"));
    }

    #[tokio::test]
    async fn invalid_utf8_is_shown_lossily() {
        let ws = workspace();
        ws.write("latin1.txt", b"caf\xe9\n");
        let out = read(&ws, json!({"path": "latin1.txt"})).await.unwrap();
        assert_eq!(out, "     1\tcaf\u{fffd}");
    }

    #[tokio::test]
    async fn output_budget_stops_early_and_says_where_to_continue() {
        let ws = workspace();
        ws.write("n.txt", numbered(100));
        let tool = ReadTool::with_output_budget(50);
        let out = tool.call(json!({"path": "n.txt"}), &ws.ctx).await.unwrap();
        // Each rendered line is 14 characters ("     1\tline 1\n"): three fit in 50.
        assert_eq!(
            out,
            "     1\tline 1\n     2\tline 2\n     3\tline 3\n[... 97 more lines; use offset=4]"
        );
        // At least one line even when it alone exceeds the budget.
        let tool = ReadTool::with_output_budget(1);
        let out = tool
            .call(json!({"path": "n.txt", "offset": 7}), &ws.ctx)
            .await
            .unwrap();
        assert!(out.starts_with("     7\tline 7\n[... 93 more lines; use offset=8]"));
    }

    #[test]
    fn render_notes_files_larger_than_the_cap() {
        let out = render(b"a\nb\n", MAX_READ_BYTES + 5, 1, 10, 1000, "f").unwrap();
        assert!(out.ends_with("only its first 10 MiB were read]"), "{out}");
    }

    #[test]
    fn spec_schema_compiles_and_refuses_bad_offsets() {
        let spec = ReadTool::new().spec();
        let v = crate::tools::arg_schema::ArgSchema::compile(&spec.input_schema).unwrap();
        assert!(v.is_valid(&json!({"path": "a"})));
        assert!(v.is_valid(&json!({"path": "a", "offset": 1, "limit": 5})));
        assert!(!v.is_valid(&json!({"path": "a", "offset": 0})));
        assert!(!v.is_valid(&json!({"path": "a", "limit": 0})));
        assert!(!v.is_valid(&json!({"path": "a", "extra": 1})));
        assert!(!v.is_valid(&json!({"offset": 1})));
    }
}
