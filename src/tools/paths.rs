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

    #[test]
    fn open_read_beneath_refuses_paths_outside() {
        let f = Fixture::new();
        let err = open_read_beneath(&f.base.join("outside/secret"), std::slice::from_ref(&f.ws));
        assert!(matches!(err, Err(ToolError::Denied(_))));
    }
}
