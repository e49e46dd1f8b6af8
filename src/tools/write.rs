//! `write`: replace a file's content atomically (SPEC §11), under the same path rule as `read`
//! (`paths.rs`). Also holds the checked atomic write that `edit` shares.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstatat};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{Access, Protected, resolve_allowed, resolve_write};
use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;

/// Largest content `write` (and the result of `edit`) may hold.
pub const MAX_WRITE_BYTES: usize = 10 * 1024 * 1024;

/// The `write` tool.
#[derive(Debug, Clone, Default)]
pub struct WriteTool;

impl WriteTool {
    pub fn new() -> WriteTool {
        WriteTool
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

impl Tool for WriteTool {
    fn effects(&self, args: &Value, ctx: &ToolContext) -> super::effects::Effects {
        match args["path"].as_str() {
            Some(p) => super::effects::Effects::writing(super::effects::resolve(&ctx.workspace, p)),
            None => Default::default(),
        }
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write".into(),
            description: format!(
                "Write a text file, replacing its content entirely (atomic: readers see the old \
                 or the new file, never a mix). Missing parent directories are created. Only \
                 paths inside the allowed paths; relative paths start at the workspace. At most \
                 {} MiB.",
                MAX_WRITE_BYTES / (1024 * 1024)
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "minLength": 1,
                        "description": "File path, absolute or relative to the workspace."
                    },
                    "content": {
                        "type": "string",
                        "description": "The complete new content of the file."
                    }
                },
                "required": ["path", "content"],
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
            let args: WriteArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments for write: {e}")))?;
            let workspace = ctx.workspace.clone();
            let allowed = ctx.allowed_paths.clone();
            let protected = ctx.protected.clone();
            tokio::task::spawn_blocking(move || {
                let resolved = resolve_write(&args.path, &workspace, &allowed, &protected)?;
                let existed = resolved.exists();
                write_checked(
                    &resolved,
                    args.content.as_bytes(),
                    &allowed,
                    &protected,
                    &args.path,
                )?;
                let verb = if existed { "replaced" } else { "created" };
                Ok(format!(
                    "wrote {} bytes to '{}' ({verb})",
                    args.content.len(),
                    args.path
                ))
            })
            .await
            .map_err(|e| ToolError::Failed(format!("write task failed: {e}")))?
        })
    }
}

/// Atomically replace `resolved` (a path returned by `resolve_allowed`) with `bytes`.
///
/// Refuses content over [`MAX_WRITE_BYTES`], a directory, and anything that is not a regular
/// file (FIFO, socket, device) or is a symlink. Missing parent directories are created and the
/// directory is re-checked, then opened beneath its allowed root without following symlinks;
/// the temp file and the rename are relative to that directory fd (reliability notes §3.8).
/// Unlike `fsutil::atomic_write`, the temp name is unpredictable and created `O_EXCL |
/// O_NOFOLLOW`, so a symlink planted at it (e.g. by `exec`) cannot redirect the write.
/// Blocking: call from `spawn_blocking`.
pub(crate) fn write_checked(
    resolved: &Path,
    bytes: &[u8],
    allowed: &[PathBuf],
    protected: &Protected,
    shown: &str,
) -> Result<(), ToolError> {
    protected.check(resolved, Access::Write, shown)?;
    if bytes.len() > MAX_WRITE_BYTES {
        return Err(ToolError::Invalid(format!(
            "content for '{shown}' is {} bytes; the limit is {MAX_WRITE_BYTES} bytes ({} MiB); \
             write a smaller file",
            bytes.len(),
            MAX_WRITE_BYTES / (1024 * 1024)
        )));
    }
    match std::fs::symlink_metadata(resolved) {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::Invalid(format!(
                "'{shown}' is a directory; write takes a file path"
            )));
        }
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(ToolError::Denied(format!(
                "'{shown}' changed into a symlink after it was checked; refusing to write \
                 through it"
            )));
        }
        Ok(meta) if !meta.is_file() => {
            return Err(ToolError::Invalid(format!(
                "'{shown}' is not a regular file (a FIFO, socket or device); write only \
                 replaces regular files"
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ToolError::Failed(format!("cannot stat '{shown}': {e}"))),
    }
    let parent = resolved.parent().ok_or_else(|| {
        ToolError::Invalid(format!(
            "'{shown}' has no parent directory; give a file path"
        ))
    })?;
    if !parent.is_dir() {
        std::fs::create_dir_all(parent).map_err(|e| {
            ToolError::Failed(format!(
                "cannot create the directory '{}' for '{shown}': {e}",
                parent.display()
            ))
        })?;
    }
    // Re-check after creating directories: a symlink swapped in on the way is caught here.
    let parent_str = parent.to_string_lossy();
    let checked = resolve_allowed(&parent_str, parent, allowed)?;
    if checked != parent {
        return Err(ToolError::Denied(format!(
            "the directory of '{shown}' changed while it was being written (now '{}'); \
             refusing to write",
            checked.display()
        )));
    }
    let name = resolved.file_name().ok_or_else(|| {
        ToolError::Invalid(format!("'{shown}' has no file name; give a file path"))
    })?;
    let dir = open_dir_beneath(parent, allowed, shown)?;
    // Where the directory really is now (a rename after the checks is caught here).
    protected.check_fd(dir.as_raw_fd(), Access::Write, shown)?;
    replace_in_dir(&dir, Path::new(name), bytes, shown)
}

/// Open `dir` (inside one of `allowed`) as a directory fd, refusing any symlink on the way
/// (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; `O_NOFOLLOW` plus a
/// `/proc/self/fd` check where `openat2` is unavailable).
fn open_dir_beneath(dir: &Path, allowed: &[PathBuf], shown: &str) -> Result<OwnedFd, ToolError> {
    let denied = || {
        ToolError::Denied(format!(
            "the directory of '{shown}' is outside the allowed paths or changed into a symlink \
             while it was being written; refusing to write"
        ))
    };
    let root = allowed
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .filter(|r| dir.starts_with(r))
        .max_by_key(|r| r.components().count())
        .ok_or_else(denied)?;
    let rel = match dir.strip_prefix(&root) {
        Ok(rel) if rel.as_os_str().is_empty() => Path::new("."),
        Ok(rel) => rel,
        Err(_) => return Err(denied()),
    };
    let io_err = |e: Errno| match e {
        Errno::ELOOP | Errno::EXDEV => denied(),
        other => ToolError::Failed(format!(
            "cannot open the directory of '{shown}': {}",
            other.desc()
        )),
    };
    let root_fd = nix::fcntl::open(
        root.as_path(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    match nix::fcntl::openat2(&root_fd, rel, how) {
        Ok(fd) => Ok(fd),
        Err(Errno::ENOSYS) | Err(Errno::EPERM) => {
            let fd =
                nix::fcntl::open(dir, flags | OFlag::O_NOFOLLOW, Mode::empty()).map_err(io_err)?;
            let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
            match std::fs::read_link(link) {
                Ok(actual) if !actual.starts_with(&root) => Err(denied()),
                _ => Ok(fd),
            }
        }
        Err(e) => Err(io_err(e)),
    }
}

/// Replace `name` inside the directory `dir` with `bytes`: a fresh temp file (random name,
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing planted in advance can redirect it), fsync,
/// `renameat` over `name`, fsync the directory. A replaced file keeps its permission bits.
fn replace_in_dir(dir: &OwnedFd, name: &Path, bytes: &[u8], shown: &str) -> Result<(), ToolError> {
    let failed = |what: &str, e: Errno| {
        ToolError::Failed(format!("cannot write '{shown}' ({what}): {}", e.desc()))
    };
    let mode = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => {
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind == SFlag::S_IFDIR {
                return Err(ToolError::Invalid(format!(
                    "'{shown}' is a directory; write takes a file path"
                )));
            }
            if kind == SFlag::S_IFLNK {
                return Err(ToolError::Denied(format!(
                    "'{shown}' changed into a symlink after it was checked; refusing to write \
                     through it"
                )));
            }
            if kind != SFlag::S_IFREG {
                return Err(ToolError::Invalid(format!(
                    "'{shown}' is not a regular file (a FIFO, socket or device); write only \
                     replaces regular files"
                )));
            }
            Mode::from_bits_truncate(st.st_mode & 0o7777)
        }
        Err(Errno::ENOENT) => Mode::from_bits_truncate(0o644),
        Err(e) => return Err(failed("stat", e)),
    };
    let tmp = PathBuf::from(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    let fd = openat(
        dir,
        tmp.as_path(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| failed("create temp file", e))?;
    let mut file = File::from(fd);
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| ToolError::Failed(format!("cannot write '{shown}': {e}")))
        .and_then(|()| fchmod(&file, mode).map_err(|e| failed("chmod", e)))
        .and_then(|()| renameat(dir, tmp.as_path(), dir, name).map_err(|e| failed("rename", e)));
    if let Err(e) = written {
        let _ = unlinkat(dir, tmp.as_path(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    fsync(dir).map_err(|e| failed("fsync directory", e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tools::{SessionStatus, StatusSource};
    use std::os::unix::fs::symlink;
    use std::sync::Arc;

    struct NoStatus;
    impl StatusSource for NoStatus {
        fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
            Box::pin(async { Err("none".to_string()) })
        }
    }

    /// `base/ws` is the workspace (the only allowed root); `base/ws2` and `base/outside` are not
    /// allowed.
    pub(crate) struct Ws {
        pub _tmp: tempfile::TempDir,
        pub base: PathBuf,
        pub ctx: ToolContext,
    }

    pub(crate) fn workspace() -> Ws {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonicalize");
        let ws = base.join("ws");
        for dir in ["ws", "ws2", "outside"] {
            std::fs::create_dir(base.join(dir)).expect("mkdir");
        }
        std::fs::write(base.join("outside/secret"), "secret\n").expect("write");
        std::fs::write(base.join("ws2/secret"), "sibling\n").expect("write");
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

    async fn write(ws: &Ws, path: &str, content: &str) -> Result<String, ToolError> {
        WriteTool::new()
            .call(json!({"path": path, "content": content}), &ws.ctx)
            .await
    }

    #[tokio::test]
    async fn creates_and_replaces_a_file() {
        let ws = workspace();
        let out = write(&ws, "a.txt", "hello").await.unwrap();
        assert_eq!(out, "wrote 5 bytes to 'a.txt' (created)");
        let out = write(&ws, "a.txt", "bye\n").await.unwrap();
        assert_eq!(out, "wrote 4 bytes to 'a.txt' (replaced)");
        let got = std::fs::read_to_string(ws.ctx.workspace.join("a.txt")).unwrap();
        assert_eq!(got, "bye\n");
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(&ws.ctx.workspace)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[tokio::test]
    async fn creates_missing_parent_directories_inside() {
        let ws = workspace();
        write(&ws, "deep/er/x.txt", "x").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.ctx.workspace.join("deep/er/x.txt")).unwrap(),
            "x"
        );
    }

    #[tokio::test]
    async fn escapes_are_refused_and_nothing_is_written_outside() {
        let ws = workspace();
        let outside = ws.base.join("outside/new.txt");
        let sibling = ws.base.join("ws2/new.txt");
        symlink(ws.base.join("outside"), ws.ctx.workspace.join("dirlink")).unwrap();
        symlink(
            ws.base.join("outside/secret"),
            ws.ctx.workspace.join("filelink"),
        )
        .unwrap();
        symlink(
            ws.base.join("outside/dangling"),
            ws.ctx.workspace.join("dangling"),
        )
        .unwrap();
        for path in [
            "../outside/new.txt",
            "../ws2/new.txt",
            "../ws2/secret",
            outside.to_str().unwrap(),
            sibling.to_str().unwrap(),
            "dirlink/new.txt",
            "dirlink/sub/new.txt",
            "filelink",
            "dangling",
            "missing/../../outside/new.txt",
        ] {
            let err = write(&ws, path, "pwned").await.unwrap_err();
            assert!(matches!(err, ToolError::Denied(_)), "{path}: {err:?}");
        }
        assert!(!outside.exists() && !sibling.exists());
        assert!(!ws.base.join("outside/dangling").exists());
        assert!(!ws.base.join("outside/sub").exists());
        assert_eq!(
            std::fs::read_to_string(ws.base.join("outside/secret")).unwrap(),
            "secret\n"
        );
        assert_eq!(
            std::fs::read_to_string(ws.base.join("ws2/secret")).unwrap(),
            "sibling\n"
        );
    }

    #[tokio::test]
    async fn directory_and_fifo_are_refused() {
        let ws = workspace();
        std::fs::create_dir(ws.ctx.workspace.join("d")).unwrap();
        let err = write(&ws, "d", "x").await.unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let err = write(&ws, ".", "x").await.unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let fifo = ws.ctx.workspace.join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = write(&ws, "pipe", "x").await.unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[tokio::test]
    async fn oversized_content_is_refused() {
        let ws = workspace();
        let big = "x".repeat(MAX_WRITE_BYTES + 1);
        let err = write(&ws, "big.txt", &big).await.unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        assert!(!ws.ctx.workspace.join("big.txt").exists());
    }

    #[tokio::test]
    async fn a_symlink_planted_at_a_temp_name_is_not_followed() {
        let ws = workspace();
        // The predictable temp name `fsutil::atomic_write` would use.
        let planted = format!(".a.txt.tmp.{}", std::process::id());
        symlink(
            ws.base.join("outside/secret"),
            ws.ctx.workspace.join(&planted),
        )
        .unwrap();
        write(&ws, "a.txt", "new").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.base.join("outside/secret")).unwrap(),
            "secret\n"
        );
        assert_eq!(
            std::fs::read_to_string(ws.ctx.workspace.join("a.txt")).unwrap(),
            "new"
        );
    }

    #[tokio::test]
    async fn a_replaced_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let ws = workspace();
        let path = ws.ctx.workspace.join("run.sh");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
        write(&ws, "run.sh", "new").await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750);
    }

    #[tokio::test]
    async fn replacing_does_not_touch_a_hardlinked_outside_file() {
        let ws = workspace();
        std::fs::hard_link(
            ws.base.join("outside/secret"),
            ws.ctx.workspace.join("hard"),
        )
        .unwrap();
        write(&ws, "hard", "new").await.unwrap();
        // rename replaces the directory entry; the outside inode keeps its content.
        assert_eq!(
            std::fs::read_to_string(ws.base.join("outside/secret")).unwrap(),
            "secret\n"
        );
    }
}
