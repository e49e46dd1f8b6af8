//! The path rule shared by every file tool (SPEC §11 `read`/`write`/`edit`): a path is usable
//! only when, after resolving symlinks, it lies inside one of `filesystem.allowed_paths`.
//!
//! Two layers:
//! - [`resolve_allowed`] decides on the *resolved* path (canonicalized, component-wise
//!   containment, so `ws` never admits the sibling `ws2`).
//! - [`open_read_beneath`] opens the resolved path relative to its allowed root with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a symlink swapped in between the check
//!   and the open cannot redirect the read outside (reliability notes §3.8).
//!
//! Both do blocking file-system calls: call them from `spawn_blocking`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use super::ToolError;

/// Resolve `path` (relative → against `workspace`) to an absolute path that lies inside one of
/// `allowed` (each canonicalized), after resolving symlinks.
///
/// For a path that does not exist yet (a file the write tool will create), the nearest existing
/// ancestor is canonicalized and the remaining components are appended; any `..` in that
/// remainder is refused. An ancestor that exists but cannot be resolved (a dangling symlink) is
/// refused too, since a later write through it could land anywhere.
///
/// Containment is component-wise (`Path::starts_with`): workspace `ws` does not allow `ws2`.
/// `Err(ToolError::Denied)` names the path and the allowed roots; an empty path or one with a NUL
/// byte is `Err(ToolError::Invalid)`.
pub fn resolve_allowed(
    path: &str,
    workspace: &Path,
    allowed: &[PathBuf],
) -> Result<PathBuf, ToolError> {
    if path.is_empty() {
        return Err(ToolError::Invalid(
            "path is empty: give a file path, absolute or relative to the workspace".into(),
        ));
    }
    if path.contains('\0') {
        return Err(ToolError::Invalid(format!(
            "path {:?} contains a NUL byte, which no file name can hold",
            path
        )));
    }
    let joined = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        repeated_workspace_name(path, workspace)?;
        workspace.join(path)
    };
    let resolved = resolve_lenient(&joined).map_err(|e| match e {
        Resolve::Dotdot => ToolError::Denied(format!(
            "path '{path}' contains '..' below a directory that does not exist; use a path \
             without '..'"
        )),
        Resolve::Dangling(at) => ToolError::Denied(format!(
            "path '{path}' goes through '{}', which exists but cannot be resolved (a dangling \
             symlink?); refusing to follow it",
            at.display()
        )),
        Resolve::Io(at, err) => {
            ToolError::Failed(format!("cannot resolve '{}': {err}", at.display()))
        }
    })?;
    let roots = canonical_roots(allowed);
    if roots.iter().any(|root| resolved.starts_with(root)) {
        return Ok(resolved);
    }
    let shown = if resolved == joined {
        String::new()
    } else {
        format!(" (it resolves to '{}')", resolved.display())
    };
    Err(ToolError::Denied(format!(
        "path '{path}' is outside the allowed paths{shown}; allowed: {}",
        describe_roots(allowed)
    )))
}

/// A relative path whose first component is the workspace's own name (`workspace/notes.txt`
/// for the workspace `…/workspace`) and no such directory in it: the model meant a path
/// inside the workspace, and would create a nested folder. The error names the likely path.
fn repeated_workspace_name(path: &str, workspace: &Path) -> Result<(), ToolError> {
    let mut parts = Path::new(path).components();
    let (Some(std::path::Component::Normal(first)), Some(name)) =
        (parts.next(), workspace.file_name())
    else {
        return Ok(());
    };
    if first != name || workspace.join(first).is_dir() {
        return Ok(());
    }
    let rest = parts.as_path();
    let meant = if rest.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rest.display().to_string()
    };
    Err(ToolError::Invalid(format!(
        "path '{path}' starts with the workspace's own name, but relative paths already start in \
         the workspace ({}); did you mean '{meant}'?",
        workspace.display()
    )))
}

/// Open a path returned by [`resolve_allowed`] for reading, relative to the allowed root that
/// contains it, refusing any symlink on the way (`openat2` with `RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`). The file is opened `O_NONBLOCK`, so a FIFO
/// cannot hang the caller; check the file type with `metadata()` on the returned handle.
///
/// On kernels without `openat2` (before 5.6, or filtered by seccomp) it falls back to a plain
/// open with `O_NOFOLLOW`, which still refuses a symlink in the last component.
pub fn open_read_beneath(resolved: &Path, allowed: &[PathBuf]) -> Result<File, ToolError> {
    let roots = canonical_roots(allowed);
    let root = roots
        .iter()
        .filter(|root| resolved.starts_with(root))
        .max_by_key(|root| root.components().count())
        .ok_or_else(|| {
            ToolError::Denied(format!(
                "path '{}' is outside the allowed paths; allowed: {}",
                resolved.display(),
                describe_roots(allowed)
            ))
        })?;
    let rel = match resolved.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => Path::new("."),
        Ok(rel) => rel,
        Err(_) => return Err(ToolError::Failed("internal: root prefix mismatch".into())),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    let dir = nix::fcntl::open(
        root.as_path(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| open_error(resolved, e))?;
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    match nix::fcntl::openat2(&dir, rel, how) {
        Ok(fd) => Ok(File::from(fd)),
        Err(Errno::ENOSYS) | Err(Errno::EPERM) => open_nofollow_checked(resolved, root),
        Err(e) => Err(open_error(resolved, e)),
    }
}

/// Fallback without `openat2`: open with `O_NOFOLLOW`, then confirm through `/proc/self/fd`
/// that the file actually opened still lies under `root`.
fn open_nofollow_checked(resolved: &Path, root: &Path) -> Result<File, ToolError> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_NOCTTY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(resolved)
        .map_err(|e| match e.raw_os_error() {
            Some(code) => open_error(resolved, Errno::from_raw(code)),
            None => ToolError::Failed(format!("cannot open '{}': {e}", resolved.display())),
        })?;
    let proc_link = format!("/proc/self/fd/{}", file.as_raw_fd());
    if let Ok(actual) = std::fs::read_link(proc_link)
        && !actual.starts_with(root)
    {
        return Err(open_error(resolved, Errno::EXDEV));
    }
    Ok(file)
}

fn open_error(path: &Path, err: Errno) -> ToolError {
    match err {
        Errno::ELOOP | Errno::EXDEV => ToolError::Denied(format!(
            "'{}' changed into a symlink while it was being opened; refusing to follow it",
            path.display()
        )),
        Errno::ENOENT => ToolError::Failed(format!("file not found: '{}'", path.display())),
        Errno::EACCES => ToolError::Failed(format!("permission denied: '{}'", path.display())),
        other => ToolError::Failed(format!(
            "cannot open '{}': {}",
            path.display(),
            other.desc()
        )),
    }
}

/// What a file tool will do with a path (the state directory's `inbox/` is readable only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The daemon's own directories, guarded by every file tool whatever `allowed_paths` says
/// (SPEC §16.8): nothing of the config directory and no file named `.env` is read or written;
/// nothing of the state directory is written, and only its `inbox/` (downloads, voice notes,
/// TTS output) is read. `None` guards nothing (tests of the plain path rule). The files of the
/// system prompt ([`PromptFiles`]) are read but never written.
#[derive(Debug, Clone, Default)]
pub struct Protected {
    /// `paths.state_dir`.
    pub state_dir: Option<PathBuf>,
    /// The directory of `agentd.toml` (with `.env` and usually `providers.d/`).
    pub config_dir: Option<PathBuf>,
    /// The trusted prompt's files the tools may read but not change.
    pub prompt: PromptFiles,
}

/// The files of the system prompt that the model's tools must not change (issue "Security,
/// third round", item 10): the context files of every tier (`[agent.context]` and
/// `[agent.context.tiers.*]`) and everything under the skills directory (`[agent.skills]
/// dir`), except the files `[tools] writable_context` opts in. `write` and `edit` refuse them
/// ([`PromptFiles::check`]); `exec` gets them as read-only paths of its sandbox policy
/// ([`PromptFiles::sandbox_paths`]). Every session's next prompt is made from these files, so
/// one session's model could otherwise speak in every other session's system prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptFiles {
    /// Context files not opted in: the workspace joined with each configured name.
    pub files: Vec<PathBuf>,
    /// The skills directory (absolute).
    pub skills_dir: Option<PathBuf>,
    /// Files under the skills directory that are opted in (absolute).
    pub writable_skill_files: Vec<PathBuf>,
}

impl PromptFiles {
    /// From the config: every tier's context files and the skills directory, less
    /// `[tools] writable_context`.
    pub fn from_config(cfg: &crate::config::Config) -> PromptFiles {
        let ws = &cfg.agent.workspace;
        let ctx = &cfg.agent.context;
        let opted: Vec<PathBuf> = cfg
            .tools
            .writable_context
            .iter()
            .map(|n| ws.join(n))
            .collect();
        let mut files: Vec<PathBuf> = ctx
            .stable
            .iter()
            .chain(&ctx.semi_stable)
            .chain(
                ctx.tiers
                    .values()
                    .flat_map(|t| t.stable.iter().chain(&t.semi_stable)),
            )
            .map(|n| ws.join(n))
            .filter(|p| !opted.contains(p))
            .collect();
        files.sort();
        files.dedup();
        let skills_dir = cfg.agent.skills.dir.clone();
        let writable_skill_files = opted
            .into_iter()
            .filter(|p| p.starts_with(&skills_dir))
            .collect();
        PromptFiles {
            files,
            skills_dir: Some(skills_dir),
            writable_skill_files,
        }
    }

    /// Refuse writing the canonical path `resolved` when it is a guarded context file (by
    /// path, through a symlink, or as another hard link of it) or lies in the skills
    /// directory and is not opted in. `shown` is the path as the model gave it.
    pub fn check(&self, resolved: &Path, shown: &str) -> Result<(), ToolError> {
        for file in &self.files {
            if same_file(resolved, file) {
                let name = file.file_name().map(Path::new).unwrap_or(file);
                return Err(ToolError::Denied(format!(
                    "path '{shown}' is '{}', a context file of the system prompt \
                     ([agent.context]); the tools read it but never change it, unless the \
                     operator lists it in [tools] writable_context",
                    name.display()
                )));
            }
        }
        let Some(skills) = &self.skills_dir else {
            return Ok(());
        };
        let inside = lenient_canonical(skills).is_some_and(|dir| resolved.starts_with(&dir))
            || resolved.starts_with(skills)
            || DirId::of(skills).is_some_and(|d| d.contains(resolved));
        let opted = self
            .writable_skill_files
            .iter()
            .any(|f| same_file(resolved, f));
        if inside && !opted {
            return Err(ToolError::Denied(format!(
                "path '{shown}' is in the skills directory '{}' ([agent.skills] dir), whose \
                 files go into the system prompt; the tools never change it, unless the \
                 operator lists the file in [tools] writable_context",
                skills.display()
            )));
        }
        Ok(())
    }

    /// What the exec sandbox keeps read-only, and the opted-in files inside it that stay
    /// writable: each guarded path as configured and, where it resolves elsewhere (a
    /// symlink), where it leads too.
    pub fn sandbox_paths(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut read_only = Vec::new();
        for p in self.files.iter().chain(&self.skills_dir) {
            read_only.push(p.clone());
            if let Some(real) = lenient_canonical(p)
                && real != *p
            {
                read_only.push(real);
            }
        }
        read_only.sort();
        read_only.dedup();
        let writable = self
            .writable_skill_files
            .iter()
            .map(|p| lenient_canonical(p).unwrap_or_else(|| p.clone()))
            .collect();
        (read_only, writable)
    }
}

/// `path` canonicalized, or (when it does not exist) its parent canonicalized with the file
/// name appended; `None` when neither resolves.
fn lenient_canonical(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let parent = std::fs::canonicalize(path.parent()?).ok()?;
    Some(parent.join(path.file_name()?))
}

/// Whether the canonical path `resolved` is `file`: the same path once resolved, or the same
/// inode (another hard link).
fn same_file(resolved: &Path, file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if resolved == file || lenient_canonical(file).is_some_and(|f| f == resolved) {
        return true;
    }
    match (std::fs::metadata(resolved), std::fs::metadata(file)) {
        (Ok(a), Ok(b)) => a.is_file() && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A directory identified both by its canonical path and by its inode, so a bind mount or any
/// other alias of it is recognised too.
struct DirId {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl DirId {
    /// `None` when the directory does not exist (then nothing can lie inside it).
    fn of(path: &Path) -> Option<DirId> {
        use std::os::unix::fs::MetadataExt;
        let path = std::fs::canonicalize(path).ok()?;
        let meta = std::fs::metadata(&path).ok()?;
        Some(DirId {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether the canonical path `p` is this directory or lies below it: by path, or because
    /// one of its existing ancestors is this very inode.
    fn contains(&self, p: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        if p.starts_with(&self.path) {
            return true;
        }
        p.ancestors()
            .any(|a| std::fs::metadata(a).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino))
    }
}

impl Protected {
    pub fn new(state_dir: PathBuf, config_dir: PathBuf) -> Protected {
        Protected {
            state_dir: Some(state_dir),
            config_dir: Some(config_dir),
            prompt: PromptFiles::default(),
        }
    }

    /// The state and config directories and the prompt's files of `cfg`.
    pub fn from_config(cfg: &crate::config::Config) -> Protected {
        Protected {
            prompt: PromptFiles::from_config(cfg),
            ..Protected::new(cfg.paths.state_dir.clone(), cfg.config_dir.clone())
        }
    }

    /// `state_dir/inbox`, canonical, when it exists: an extra root for [`Access::Read`].
    pub fn inbox(&self) -> Option<PathBuf> {
        let inbox = self.state_dir.as_ref()?.join("inbox");
        std::fs::canonicalize(inbox).ok()
    }

    /// The roots a path may lie in for `access`: `allowed`, plus the inbox for reading.
    pub fn roots(&self, allowed: &[PathBuf], access: Access) -> Vec<PathBuf> {
        let mut roots = allowed.to_vec();
        if access == Access::Read
            && let Some(inbox) = self.inbox()
        {
            roots.push(inbox);
        }
        roots
    }

    /// Refuse the canonical path `resolved` when `access` to it would reach the config
    /// directory, a `.env` file, the state directory (outside `inbox/` for reading), or, for
    /// writing, a file of the system prompt. `shown` is the path as the model gave it.
    pub fn check(&self, resolved: &Path, access: Access, shown: &str) -> Result<(), ToolError> {
        if access == Access::Write {
            self.prompt.check(resolved, shown)?;
        }
        if resolved.file_name().is_some_and(|n| n == ".env") {
            return Err(ToolError::Denied(format!(
                "path '{shown}' is a .env file, which holds secrets; the file tools never read \
                 or write a .env file"
            )));
        }
        if let Some(config) = self.config_dir.as_deref().and_then(DirId::of)
            && config.contains(resolved)
        {
            return Err(ToolError::Denied(format!(
                "path '{shown}' is inside the config directory '{}' (agentd.toml, .env), which \
                 the file tools never read or write, whatever filesystem.allowed_paths says",
                config.path.display()
            )));
        }
        let Some(state) = self.state_dir.as_deref().and_then(DirId::of) else {
            return Ok(());
        };
        if !state.contains(resolved) {
            return Ok(());
        }
        let inbox = state.path.join("inbox");
        let in_inbox =
            DirId::of(&inbox).is_some_and(|i| i.contains(resolved) && resolved != i.path);
        if access == Access::Read && in_inbox {
            return Ok(());
        }
        let what = match access {
            Access::Read => "only its inbox/ may be read",
            Access::Write => "the file tools never write there (its inbox/ may only be read)",
        };
        Err(ToolError::Denied(format!(
            "path '{shown}' is inside the state directory '{}' (paths.state_dir); {what}",
            state.path.display()
        )))
    }

    /// After opening a file to read it (`read`, `message` attachments, `edit` before it writes
    /// the changed copy): check where the handle really is (through `/proc/self/fd`, so a
    /// rename after the path check is caught) and refuse a regular file with more than one
    /// hard link: another name of it may lie outside the allowed paths (issue #12 finding 14;
    /// `edit` would copy such a file's content into a fresh one-link file). The check is on
    /// the opened file, not on the path.
    pub fn check_opened(&self, file: &File, access: Access, shown: &str) -> Result<(), ToolError> {
        use std::os::unix::fs::MetadataExt;
        let meta = file
            .metadata()
            .map_err(|e| ToolError::Failed(format!("cannot stat '{shown}': {e}")))?;
        if meta.is_file() && meta.nlink() > 1 {
            return Err(ToolError::Denied(format!(
                "'{shown}' is a file with {} hard links; another of its names may lie outside \
                 the allowed paths, so the file tools do not read it (copy the file instead of \
                 linking it)",
                meta.nlink()
            )));
        }
        self.check_fd(file.as_raw_fd(), access, shown)
    }

    /// Run [`Protected::check`] on where the open descriptor `fd` really is.
    pub fn check_fd(&self, fd: i32, access: Access, shown: &str) -> Result<(), ToolError> {
        match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
            Ok(actual) if actual.is_absolute() => self.check(&actual, access, shown),
            // No /proc (or an anonymous file): the path checks already ran.
            _ => Ok(()),
        }
    }
}

/// Resolve `path` for reading: inside `allowed` or the state directory's `inbox/`, and passing
/// [`Protected::check`]. Returns the resolved path and the roots to open it beneath.
pub fn resolve_read(
    path: &str,
    workspace: &Path,
    allowed: &[PathBuf],
    protected: &Protected,
) -> Result<(PathBuf, Vec<PathBuf>), ToolError> {
    let roots = protected.roots(allowed, Access::Read);
    let resolved = resolve_allowed(path, workspace, &roots)?;
    protected.check(&resolved, Access::Read, path)?;
    Ok((resolved, roots))
}

/// Resolve `path` for writing: inside `allowed` and passing [`Protected::check`].
pub fn resolve_write(
    path: &str,
    workspace: &Path,
    allowed: &[PathBuf],
    protected: &Protected,
) -> Result<PathBuf, ToolError> {
    let resolved = resolve_allowed(path, workspace, allowed)?;
    protected.check(&resolved, Access::Write, path)?;
    Ok(resolved)
}

/// Resolve, open and check a file for reading, as `read` and `message` attachments do.
pub fn open_for_read(
    path: &str,
    workspace: &Path,
    allowed: &[PathBuf],
    protected: &Protected,
) -> Result<(PathBuf, File), ToolError> {
    let (resolved, roots) = resolve_read(path, workspace, allowed, protected)?;
    let file = open_read_beneath(&resolved, &roots)?;
    protected.check_opened(&file, Access::Read, path)?;
    Ok((resolved, file))
}

/// Create the scratch directory (`[tools] scratch_dir`, SPEC §16.8) with mode 0700, or accept
/// an existing one only when it is a real directory (not a symlink) owned by this uid; its
/// mode is then narrowed to 0700. In a shared temp directory another user could otherwise
/// create the path first and watch or plant files in it. Checked on an `O_NOFOLLOW` handle,
/// so nothing can be swapped in between the checks. Blocking (start-up).
pub fn ensure_scratch_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let shown = dir.display();
    let fix = "remove it, or set [tools] scratch_dir to a directory of this user";
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            format!("[tools] scratch_dir '{shown}': cannot create its parent directory: {e}")
        })?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "[tools] scratch_dir '{shown}': cannot create it: {e}"
            ));
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(dir)
        .map_err(|e| match e.raw_os_error().map(Errno::from_raw) {
            // O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR (or ELOOP).
            Some(Errno::ELOOP | Errno::ENOTDIR)
                if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                format!("[tools] scratch_dir '{shown}' is a symlink; {fix}")
            }
            Some(Errno::ELOOP | Errno::ENOTDIR) => {
                format!("[tools] scratch_dir '{shown}' exists and is not a directory; {fix}")
            }
            _ => format!("[tools] scratch_dir '{shown}': cannot open it: {e}"),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("[tools] scratch_dir '{shown}': cannot stat it: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "[tools] scratch_dir '{shown}' is owned by uid {}, not by this daemon's uid {me}; \
             another user may read or plant files there; {fix}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o7777 != 0o700 {
        file.set_permissions(std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("[tools] scratch_dir '{shown}': cannot set mode 0700: {e}"))?;
    }
    Ok(())
}

/// Why a path could not be resolved.
enum Resolve {
    /// `..` in the part below the nearest existing ancestor.
    Dotdot,
    /// An ancestor exists (per `lstat`) but does not canonicalize: a dangling symlink.
    Dangling(PathBuf),
    Io(PathBuf, io::Error),
}

/// Canonicalize `path`, or — when it does not exist — its nearest existing ancestor with the
/// remaining (plain) components appended.
fn resolve_lenient(path: &Path) -> Result<PathBuf, Resolve> {
    for ancestor in path.ancestors() {
        match std::fs::symlink_metadata(ancestor) {
            Ok(_) => {
                let base = std::fs::canonicalize(ancestor).map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        Resolve::Dangling(ancestor.to_path_buf())
                    } else {
                        Resolve::Io(ancestor.to_path_buf(), e)
                    }
                })?;
                let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
                let mut out = base;
                for comp in rest.components() {
                    match comp {
                        Component::Normal(part) => out.push(part),
                        Component::CurDir => {}
                        Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                            return Err(Resolve::Dotdot);
                        }
                    }
                }
                return Ok(out);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            // ENOTDIR: a component above is a regular file; keep walking up, the caller will
            // get a clear error when it tries to use the path.
            Err(e) if e.raw_os_error() == Some(Errno::ENOTDIR as i32) => continue,
            Err(e) => return Err(Resolve::Io(ancestor.to_path_buf(), e)),
        }
    }
    // Only reachable for a relative path with no existing ancestor (the workspace is absolute).
    Err(Resolve::Io(
        path.to_path_buf(),
        io::Error::new(io::ErrorKind::NotFound, "no existing ancestor"),
    ))
}

/// The allowed roots that exist, canonicalized. A root that does not exist contains nothing.
fn canonical_roots(allowed: &[PathBuf]) -> Vec<PathBuf> {
    allowed
        .iter()
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect()
}

fn describe_roots(allowed: &[PathBuf]) -> String {
    if allowed.is_empty() {
        return "none configured ([tools] filesystem.allowed_paths is empty)".into();
    }
    allowed
        .iter()
        .map(|p| format!("'{}'", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    /// A temp dir holding `ws/` (the workspace, the only allowed root), `ws2/secret` (a sibling
    /// sharing the prefix) and `outside/secret`.
    struct Fixture {
        _tmp: tempfile::TempDir,
        base: PathBuf,
        ws: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::tempdir().expect("tempdir");
            let base = std::fs::canonicalize(tmp.path()).expect("canonicalize tempdir");
            let ws = base.join("ws");
            std::fs::create_dir_all(ws.join("sub")).expect("mkdir ws");
            std::fs::write(ws.join("sub/file.txt"), "inside\n").expect("write");
            std::fs::create_dir_all(base.join("ws2")).expect("mkdir ws2");
            std::fs::write(base.join("ws2/secret"), "sibling secret\n").expect("write");
            std::fs::create_dir_all(base.join("outside")).expect("mkdir outside");
            std::fs::write(base.join("outside/secret"), "outside secret\n").expect("write");
            Fixture {
                _tmp: tmp,
                base,
                ws,
            }
        }

        fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
            resolve_allowed(path, &self.ws, std::slice::from_ref(&self.ws))
        }
    }

    #[test]
    fn a_path_repeating_the_workspace_name_names_the_meant_one() {
        let f = Fixture::new();
        let e = f.resolve("ws/notes.txt").unwrap_err();
        assert!(
            matches!(&e, ToolError::Invalid(m) if m.contains("did you mean 'notes.txt'")),
            "{e}"
        );
        assert!(f.resolve("ws").is_err());
        // A real subdirectory of that name is a path like any other.
        std::fs::create_dir_all(f.ws.join("ws")).unwrap();
        assert!(f.resolve("ws/notes.txt").is_ok());
        assert!(f.resolve("sub/file.txt").is_ok());
    }

    fn assert_denied(result: Result<PathBuf, ToolError>) {
        match result {
            Err(ToolError::Denied(msg)) => assert!(!msg.is_empty()),
            other => panic!("expected Denied, got {other:?}"),
        }
    }

    #[test]
    fn relative_path_inside_is_accepted() {
        let f = Fixture::new();
        assert_eq!(
            f.resolve("sub/file.txt").unwrap(),
            f.ws.join("sub/file.txt")
        );
        assert_eq!(
            f.resolve("./sub/../sub/file.txt").unwrap(),
            f.ws.join("sub/file.txt")
        );
    }

    #[test]
    fn absolute_path_inside_is_accepted() {
        let f = Fixture::new();
        let abs = f.ws.join("sub/file.txt");
        assert_eq!(f.resolve(abs.to_str().unwrap()).unwrap(), abs);
        // The workspace itself is inside.
        assert_eq!(f.resolve(".").unwrap(), f.ws);
    }

    #[test]
    fn nonexistent_file_inside_is_accepted() {
        let f = Fixture::new();
        assert_eq!(
            f.resolve("new/dir/file.md").unwrap(),
            f.ws.join("new/dir/file.md")
        );
    }

    #[test]
    fn dotdot_escape_is_refused() {
        let f = Fixture::new();
        assert_denied(f.resolve("../outside/secret"));
        assert_denied(f.resolve("sub/../../outside/secret"));
        assert_denied(f.resolve("../../../../../../etc/passwd"));
        // `..` below a directory that does not exist.
        assert_denied(f.resolve("missing/../../outside/new"));
    }

    #[test]
    fn absolute_path_outside_is_refused() {
        let f = Fixture::new();
        assert_denied(f.resolve("/etc/passwd"));
        assert_denied(f.resolve(f.base.join("outside/secret").to_str().unwrap()));
    }

    #[test]
    fn sibling_sharing_the_prefix_is_refused() {
        let f = Fixture::new();
        assert_denied(f.resolve("../ws2/secret"));
        assert_denied(f.resolve(f.base.join("ws2/secret").to_str().unwrap()));
        assert_denied(f.resolve(f.base.join("ws2/new").to_str().unwrap()));
    }

    #[test]
    fn file_symlink_pointing_outside_is_refused() {
        let f = Fixture::new();
        symlink(f.base.join("outside/secret"), f.ws.join("link")).unwrap();
        assert_denied(f.resolve("link"));
    }

    #[test]
    fn directory_symlink_pointing_outside_is_refused() {
        let f = Fixture::new();
        symlink(f.base.join("outside"), f.ws.join("dirlink")).unwrap();
        assert_denied(f.resolve("dirlink/secret"));
        assert_denied(f.resolve("dirlink"));
        // Nonexistent path under the symlinked directory.
        assert_denied(f.resolve("dirlink/new/file.txt"));
    }

    #[test]
    fn relative_symlink_to_sibling_is_refused() {
        let f = Fixture::new();
        symlink("../ws2", f.ws.join("sib")).unwrap();
        assert_denied(f.resolve("sib/secret"));
    }

    #[test]
    fn dangling_symlink_is_refused() {
        let f = Fixture::new();
        symlink(f.base.join("outside/not-yet"), f.ws.join("dangling")).unwrap();
        assert_denied(f.resolve("dangling"));
        assert_denied(f.resolve("dangling/child"));
    }

    #[test]
    fn symlink_inside_pointing_inside_is_accepted() {
        let f = Fixture::new();
        symlink(f.ws.join("sub"), f.ws.join("alias")).unwrap();
        assert_eq!(
            f.resolve("alias/file.txt").unwrap(),
            f.ws.join("sub/file.txt")
        );
    }

    #[test]
    fn workspace_reached_through_a_symlink_still_works() {
        let f = Fixture::new();
        let link = f.base.join("ws-link");
        symlink(&f.ws, &link).unwrap();
        let got = resolve_allowed("sub/file.txt", &link, std::slice::from_ref(&link)).unwrap();
        assert_eq!(got, f.ws.join("sub/file.txt"));
    }

    #[test]
    fn empty_path_and_nul_byte_are_refused() {
        let f = Fixture::new();
        assert!(matches!(f.resolve(""), Err(ToolError::Invalid(_))));
        assert!(matches!(
            f.resolve("sub/fi\0le.txt"),
            Err(ToolError::Invalid(_))
        ));
    }

    #[test]
    fn no_allowed_roots_refuses_everything() {
        let f = Fixture::new();
        assert_denied(resolve_allowed("sub/file.txt", &f.ws, &[]));
    }

    #[test]
    fn denial_names_the_path_and_the_roots() {
        let f = Fixture::new();
        let Err(ToolError::Denied(msg)) = f.resolve("/etc/passwd") else {
            panic!("expected denial");
        };
        assert!(msg.contains("/etc/passwd"), "{msg}");
        assert!(msg.contains(f.ws.to_str().unwrap()), "{msg}");
    }

    #[test]
    fn open_read_beneath_reads_a_resolved_file() {
        let f = Fixture::new();
        let roots = vec![f.ws.clone()];
        let path = resolve_allowed("sub/file.txt", &f.ws, &roots).unwrap();
        let mut text = String::new();
        open_read_beneath(&path, &roots)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "inside\n");
    }

    #[test]
    fn open_read_beneath_refuses_a_symlink_swapped_in_after_the_check() {
        let f = Fixture::new();
        let roots = vec![f.ws.clone()];
        let path = resolve_allowed("sub/file.txt", &f.ws, &roots).unwrap();
        // Race: after the check, the directory is replaced by a symlink to outside.
        std::fs::rename(f.ws.join("sub"), f.ws.join("sub-old")).unwrap();
        symlink(f.base.join("outside"), f.ws.join("sub")).unwrap();
        std::fs::write(f.base.join("outside/file.txt"), "outside\n").unwrap();
        match open_read_beneath(&path, &roots) {
            Err(ToolError::Denied(_)) => {}
            Err(other) => panic!("expected Denied, got {other:?}"),
            Ok(mut file) => {
                let mut text = String::new();
                file.read_to_string(&mut text).unwrap();
                panic!("read through a swapped symlink: {text:?}");
            }
        }
    }

    #[test]
    fn fallback_open_checks_where_the_file_really_is() {
        let f = Fixture::new();
        let inside = f.ws.join("sub/file.txt");
        assert!(open_nofollow_checked(&inside, &f.ws).is_ok());
        // A directory symlink on the way (O_NOFOLLOW alone only guards the last component).
        symlink(f.base.join("outside"), f.ws.join("dirlink")).unwrap();
        let err = open_nofollow_checked(&f.ws.join("dirlink/secret"), &f.ws);
        assert!(matches!(err, Err(ToolError::Denied(_))), "{err:?}");
        // A symlink as the last component.
        symlink(f.base.join("outside/secret"), f.ws.join("link")).unwrap();
        let err = open_nofollow_checked(&f.ws.join("link"), &f.ws);
        assert!(matches!(err, Err(ToolError::Denied(_))), "{err:?}");
    }

    /// `base/` is the only allowed root and holds the workspace, `state/` (with `inbox/`) and
    /// `config/` (with `.env`), as `/tmp` did with the README's example.
    fn guarded() -> (Fixture, Protected, Vec<PathBuf>) {
        let f = Fixture::new();
        let state = f.base.join("state");
        let config = f.base.join("config");
        std::fs::create_dir_all(state.join("inbox")).unwrap();
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(state.join("inbox/voice.txt"), "inbox\n").unwrap();
        std::fs::write(state.join("agentd.db"), "db\n").unwrap();
        std::fs::write(config.join(".env"), "KEY=secret\n").unwrap();
        std::fs::write(config.join("agentd.toml"), "[agent]\n").unwrap();
        let roots = vec![f.base.clone()];
        (f, Protected::new(state, config), roots)
    }

    fn denied<T: std::fmt::Debug>(r: Result<T, ToolError>) -> String {
        match r {
            Err(ToolError::Denied(msg)) => msg,
            other => panic!("expected Denied, got {other:?}"),
        }
    }

    #[test]
    fn config_dir_and_env_are_never_read_or_written() {
        let (f, p, roots) = guarded();
        let env = f.base.join("config/.env");
        let msg = denied(resolve_read(env.to_str().unwrap(), &f.ws, &roots, &p));
        assert!(msg.contains(".env"), "{msg}");
        let toml = f.base.join("config/agentd.toml");
        let msg = denied(resolve_read(toml.to_str().unwrap(), &f.ws, &roots, &p));
        assert!(msg.contains("config directory"), "{msg}");
        denied(resolve_write(toml.to_str().unwrap(), &f.ws, &roots, &p));
        denied(resolve_write("../config/new.toml", &f.ws, &roots, &p));
        // Any .env, also one in the workspace, and through a symlink to it.
        std::fs::write(f.ws.join(".env"), "X=1\n").unwrap();
        denied(resolve_read(".env", &f.ws, &roots, &p));
        denied(resolve_write(".env", &f.ws, &roots, &p));
        symlink(f.ws.join(".env"), f.ws.join("env-link")).unwrap();
        denied(resolve_read("env-link", &f.ws, &roots, &p));
        // A symlink into the config directory.
        symlink(f.base.join("config"), f.ws.join("cfg")).unwrap();
        denied(resolve_read("cfg/agentd.toml", &f.ws, &roots, &p));
    }

    #[test]
    fn state_dir_is_read_only_in_its_inbox() {
        let (f, p, roots) = guarded();
        let state = f.base.join("state");
        let (got, _) = resolve_read(
            state.join("inbox/voice.txt").to_str().unwrap(),
            &f.ws,
            &roots,
            &p,
        )
        .unwrap();
        assert_eq!(got, state.join("inbox/voice.txt"));
        let msg = denied(resolve_read(
            state.join("agentd.db").to_str().unwrap(),
            &f.ws,
            &roots,
            &p,
        ));
        assert!(
            msg.contains("state directory") && msg.contains("inbox"),
            "{msg}"
        );
        denied(resolve_read(state.to_str().unwrap(), &f.ws, &roots, &p));
        for path in ["inbox/voice.txt", "inbox/new.txt", "agentd.db", "x/y"] {
            denied(resolve_write(
                state.join(path).to_str().unwrap(),
                &f.ws,
                &roots,
                &p,
            ));
        }
        // The workspace stays usable.
        assert!(resolve_write("notes.md", &f.ws, &roots, &p).is_ok());
        assert!(resolve_read("sub/file.txt", &f.ws, &roots, &p).is_ok());
    }

    #[test]
    fn inbox_is_readable_without_being_an_allowed_path() {
        let (f, p, _) = guarded();
        let only_ws = vec![f.ws.clone()];
        let inbox_file = f.base.join("state/inbox/voice.txt");
        let (_, mut file) =
            open_for_read(inbox_file.to_str().unwrap(), &f.ws, &only_ws, &p).unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "inbox\n");
        denied(resolve_write(
            inbox_file.to_str().unwrap(),
            &f.ws,
            &only_ws,
            &p,
        ));
        denied(resolve_read(
            f.base.join("state/agentd.db").to_str().unwrap(),
            &f.ws,
            &only_ws,
            &p,
        ));
    }

    #[test]
    fn a_handle_moved_into_the_state_dir_after_the_check_is_refused() {
        let (f, p, roots) = guarded();
        let (_, file) = open_for_read("sub/file.txt", &f.ws, &roots, &p).unwrap();
        std::fs::rename(f.ws.join("sub"), f.base.join("state/sub")).unwrap();
        denied(p.check_opened(&file, Access::Read, "sub/file.txt"));
    }

    #[test]
    fn scratch_dir_is_created_private_and_checked() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let f = Fixture::new();
        let dir = f.base.join("deep/scratch");
        ensure_scratch_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        // An existing one of ours is accepted and narrowed to 0700.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_scratch_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        // A symlink planted at the path is refused, even to a directory of ours.
        let link = f.base.join("link-scratch");
        symlink(&f.ws, &link).unwrap();
        let err = ensure_scratch_dir(&link).unwrap_err();
        assert!(
            err.contains("symlink") && err.contains("scratch_dir"),
            "{err}"
        );
        // A file is refused.
        std::fs::write(f.base.join("file-scratch"), "").unwrap();
        let err = ensure_scratch_dir(&f.base.join("file-scratch")).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
    }

    /// A directory owned by another uid (needs root to create one; skipped otherwise).
    #[test]
    fn scratch_dir_of_another_user_is_refused() {
        let f = Fixture::new();
        let dir = f.base.join("theirs");
        std::fs::create_dir(&dir).unwrap();
        let nobody = nix::unistd::Uid::from_raw(65534);
        if nix::unistd::chown(&dir, Some(nobody), None).is_err() {
            eprintln!("skipped: cannot chown (not root)");
            return;
        }
        let err = ensure_scratch_dir(&dir).unwrap_err();
        assert!(err.contains("owned by uid 65534"), "{err}");
    }

    /// Issue "Security, third round", item 10: the context files and the skills directory are
    /// read, never written (by path, through a symlink, as another hard link, a new skill),
    /// except the files the operator opts in.
    #[test]
    fn prompt_files_are_read_only_unless_opted_in() {
        let f = Fixture::new();
        let skills = f.ws.join("skills");
        std::fs::create_dir_all(skills.join("example")).unwrap();
        std::fs::write(skills.join("example/SKILL.md"), "skill\n").unwrap();
        std::fs::create_dir_all(skills.join("mine")).unwrap();
        std::fs::write(skills.join("mine/SKILL.md"), "mine\n").unwrap();
        std::fs::write(f.ws.join("AGENTS.md"), "rules\n").unwrap();
        std::fs::write(f.ws.join("MEMORY.md"), "notes\n").unwrap();
        let p = Protected {
            prompt: PromptFiles {
                files: vec![f.ws.join("AGENTS.md"), f.ws.join("IDENTITY.md")],
                skills_dir: Some(skills.clone()),
                writable_skill_files: vec![skills.join("mine/SKILL.md")],
            },
            ..Protected::default()
        };
        let roots = vec![f.ws.clone()];
        let msg = denied(resolve_write("AGENTS.md", &f.ws, &roots, &p));
        assert!(
            msg.contains("context file") && msg.contains("writable_context"),
            "{msg}"
        );
        denied(resolve_write("IDENTITY.md", &f.ws, &roots, &p));
        for path in [
            "skills/example/SKILL.md",
            "skills/new/SKILL.md",
            "skills",
            "skills/example/other.md",
        ] {
            let msg = denied(resolve_write(path, &f.ws, &roots, &p));
            assert!(msg.contains("skills directory"), "{path}: {msg}");
        }
        symlink(f.ws.join("AGENTS.md"), f.ws.join("rules-link")).unwrap();
        denied(resolve_write("rules-link", &f.ws, &roots, &p));
        std::fs::hard_link(f.ws.join("AGENTS.md"), f.ws.join("sub/rules-hard")).unwrap();
        denied(resolve_write("sub/rules-hard", &f.ws, &roots, &p));
        // Reading is fine; so are the opted-in file and everything else.
        assert!(resolve_read("AGENTS.md", &f.ws, &roots, &p).is_ok());
        assert!(resolve_write("skills/mine/SKILL.md", &f.ws, &roots, &p).is_ok());
        assert!(resolve_write("MEMORY.md", &f.ws, &roots, &p).is_ok());
        assert!(resolve_write("sub/notes.md", &f.ws, &roots, &p).is_ok());
        // What exec keeps read-only: the paths as configured and where a symlink leads.
        let (ro, rw) = p.prompt.sandbox_paths();
        assert!(
            ro.contains(&f.ws.join("AGENTS.md")) && ro.contains(&skills),
            "{ro:?}"
        );
        assert_eq!(rw, [skills.join("mine/SKILL.md")]);
    }

    #[test]
    fn open_read_beneath_refuses_paths_outside() {
        let f = Fixture::new();
        let err = open_read_beneath(&f.base.join("outside/secret"), std::slice::from_ref(&f.ws));
        assert!(matches!(err, Err(ToolError::Denied(_))));
    }
}
