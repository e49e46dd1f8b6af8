//! The sandbox policy handed from the daemon to the `sandbox-exec` helper (as JSON on its
//! command line), and the checks that build it from the config.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Paths the sandboxed command may read and execute (when they exist).
pub const READ_EXEC_PATHS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc",
    "/proc",
    "/dev/urandom",
    "/dev/zero",
];

/// Device files the command may read and write besides the allowed paths.
pub const READ_WRITE_DEVICES: &[&str] = &["/dev/null"];

/// `timeout_ms` of a process that runs until it is stopped (an MCP stdio server).
pub const NO_DEADLINE_MS: u64 = u64::MAX;

/// How the command is confined (`[tools] exec_sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Landlock must be enforced; the command is refused when it is not.
    Landlock,
    /// No Landlock; still a clean environment, namespaces when available and tree kill.
    None,
}

/// Everything the helper needs to know; serialised to JSON for `--policy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub mode: SandboxMode,
    /// Whether the command may use the network.
    pub network: bool,
    /// Absolute directories the command may read and write (`filesystem.allowed_paths`).
    pub read_write: Vec<PathBuf>,
    /// Absolute paths the command may read and execute (system directories).
    pub read_exec: Vec<PathBuf>,
    /// Wall-clock limit in milliseconds; the whole process tree is killed after it.
    /// [`NO_DEADLINE_MS`] means none (a long-running MCP server).
    pub timeout_ms: u64,
    /// Skip the namespaces and use the subreaper fallback even when namespaces are available
    /// (tests of the fallback path).
    #[serde(default)]
    pub no_namespaces: bool,
    /// Skip the mount namespace (and so the private /proc), as under a systemd unit whose
    /// `RestrictNamespaces=` forbids it (tests of that path).
    #[serde(default)]
    pub no_mount_namespace: bool,
    /// `TMPDIR` for the command (the scratch directory, SPEC §16.8); `None` = `/tmp`.
    #[serde(default)]
    pub tmpdir: Option<PathBuf>,
    /// Paths the command may read but never change, though a read-write grant holds them (the
    /// system prompt's files: issue "Security, third round", item 10). Landlock cannot take a
    /// file out of a writable directory, so the helper bind-mounts each read-only in the
    /// command's mount namespace; where it cannot (no mount namespace, a path that does not
    /// exist or is a symlink) it takes [`Policy::fallback`] instead.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Files inside a `read_only` directory that stay writable (opted in): bound back
    /// read-write over the read-only mount.
    #[serde(default)]
    pub writable_within: Vec<PathBuf>,
    /// The grants without the `read_only` paths, for when they cannot be mounted read-only.
    #[serde(default)]
    pub fallback: Option<ReadOnlyFallback>,
    /// Directories the command may list (not read, not write): set by
    /// [`Policy::with_fallback`].
    #[serde(default)]
    pub list_only: Vec<PathBuf>,
    /// Unix sockets the command may connect to (an MCP server's `unix_sockets`; exec never
    /// has any). Not empty: the seccomp filter lets it create Unix sockets, Landlock scopes
    /// abstract ones (ABI 6) and, from ABI 9, lets it connect only to these pathname sockets
    /// and to those beneath its read-write grants.
    #[serde(default)]
    pub unix_sockets: Vec<PathBuf>,
}

/// Landlock grants that keep the [`Policy::read_only`] paths unchanged by themselves: the
/// read-write grants split around them (their directories lose their own write grant, so no
/// entry can be created, removed or renamed directly in them), the paths granted for reading,
/// and the split directories granted for listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadOnlyFallback {
    pub read_write: Vec<PathBuf>,
    pub read: Vec<PathBuf>,
    pub list: Vec<PathBuf>,
}

impl Policy {
    /// Build a policy. `protected` are directories the command must never read (the state
    /// directory, the config directory). An allowed path or a system read path that contains
    /// one of them is split so the protected one is left out (SPEC §16.8); an allowed path
    /// inside one grants nothing.
    pub fn build(
        mode: SandboxMode,
        network: bool,
        allowed_paths: &[PathBuf],
        protected: &[PathBuf],
        timeout: Duration,
    ) -> Result<Policy, String> {
        let protected: Vec<PathBuf> = protected.iter().map(|p| normalize(p)).collect();
        let read_write = writable_grants(allowed_paths, &protected)?;
        let mut read_exec = Vec::new();
        for path in READ_EXEC_PATHS {
            read_exec.extend(split_around(Path::new(path), &protected, Symlinks::Keep));
        }
        Ok(Policy {
            mode,
            network,
            read_write,
            read_exec,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            no_namespaces: false,
            no_mount_namespace: false,
            tmpdir: None,
            read_only: Vec::new(),
            writable_within: Vec::new(),
            fallback: None,
            list_only: Vec::new(),
            unix_sockets: Vec::new(),
        })
    }

    /// Keep `read_only` (absolute paths) unchanged by the command although a read-write grant
    /// holds them, except the files of `writable_within`; see [`Policy::read_only`]. `secrets`
    /// (the state and config directories) are never granted, not even for listing. Only the
    /// paths some read-write grant holds are kept; the fallback grants are computed here.
    pub fn keep_read_only(
        &mut self,
        read_only: &[PathBuf],
        writable_within: &[PathBuf],
        secrets: &[PathBuf],
    ) {
        let granted = |p: &PathBuf| self.read_write.iter().any(|g| p.starts_with(g));
        let read_only: Vec<PathBuf> = read_only
            .iter()
            .map(|p| normalize(p))
            .filter(granted)
            .collect();
        if read_only.is_empty() {
            return;
        }
        let mut read_write = Vec::new();
        let mut list = Vec::new();
        for grant in &self.read_write {
            if read_only
                .iter()
                .any(|p| p.starts_with(grant) || grant.starts_with(p))
            {
                read_write.extend(split_around(grant, &read_only, Symlinks::Skip));
                list.extend(split_dirs(grant, &read_only));
            } else {
                read_write.push(grant.clone());
            }
        }
        let secrets: Vec<PathBuf> = secrets.iter().map(|p| normalize(p)).collect();
        list.retain(|d| !secrets.iter().any(|s| s.starts_with(d)));
        list.sort();
        list.dedup();
        let writable_within: Vec<PathBuf> = writable_within.iter().map(|p| normalize(p)).collect();
        read_write.extend(writable_within.iter().filter(|p| p.exists()).cloned());
        self.fallback = Some(ReadOnlyFallback {
            read_write,
            read: read_only.clone(),
            list,
        });
        self.read_only = read_only;
        self.writable_within = writable_within;
    }

    /// This policy with the [`ReadOnlyFallback`] grants in place of its own (itself when it
    /// has none); nothing is left to mount read-only.
    pub fn with_fallback(&self) -> Policy {
        let mut p = self.clone();
        if let Some(f) = p.fallback.take() {
            p.read_write = f.read_write;
            p.read_exec.extend(f.read);
            p.list_only = f.list;
        }
        p.read_only.clear();
        p.writable_within.clear();
        p
    }

    /// The policy of an MCP stdio server (SPEC §16.9 "Processes"): a long-running process
    /// (no deadline) that may read the whole filesystem but never the `protected` directories
    /// (state, config with its `.env`), nor the other servers' private directories under
    /// `private_dir`'s parent; `/proc` only as a private one; it may write the allowed paths
    /// (split around the protected ones) and its own `private_dir` (its HOME and TMPDIR).
    /// The server's code may live anywhere (a venv, `node_modules`, `~/.cache`), so the read
    /// grant is wider than exec's; the secrets are what it is cut off from.
    pub fn for_mcp_server(
        mode: SandboxMode,
        network: bool,
        allowed_paths: &[PathBuf],
        protected: &[PathBuf],
        private_dir: &Path,
    ) -> Result<Policy, String> {
        if !private_dir.is_absolute() {
            return Err(format!(
                "the MCP server's private directory {:?} is not absolute",
                private_dir.display().to_string()
            ));
        }
        let private_dir = normalize(private_dir);
        let mut hidden: Vec<PathBuf> = protected.iter().map(|p| normalize(p)).collect();
        if let Some(servers_root) = private_dir.parent() {
            hidden.push(servers_root.to_path_buf());
        }
        let mut read_write = writable_grants(allowed_paths, &hidden)?;
        read_write.push(private_dir.clone());
        // /proc is granted on its own, so the helper can drop it when no private /proc exists.
        hidden.push(PathBuf::from("/proc"));
        let mut read_exec = split_around(Path::new("/"), &hidden, Symlinks::Keep);
        read_exec.push(PathBuf::from("/proc"));
        Ok(Policy {
            mode,
            network,
            read_write,
            read_exec,
            timeout_ms: NO_DEADLINE_MS,
            no_namespaces: false,
            no_mount_namespace: false,
            tmpdir: Some(private_dir),
            read_only: Vec::new(),
            writable_within: Vec::new(),
            fallback: None,
            list_only: Vec::new(),
            unix_sockets: Vec::new(),
        })
    }

    /// The wall-clock limit.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The wall-clock deadline from `start`; `None` for [`NO_DEADLINE_MS`] (or one beyond
    /// what the clock can express).
    pub fn deadline_from(&self, start: std::time::Instant) -> Option<std::time::Instant> {
        if self.timeout_ms == NO_DEADLINE_MS {
            return None;
        }
        start.checked_add(self.timeout())
    }
}

/// Lexical normalisation: drop `.` and resolve `..` (no symlinks are followed).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The allowed paths, each split around the `protected` directories ([`split_allowed`]);
/// a relative one is an error naming it.
fn writable_grants(
    allowed_paths: &[PathBuf],
    protected: &[PathBuf],
) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for path in allowed_paths {
        if !path.is_absolute() {
            return Err(format!(
                "filesystem.allowed_paths entry {:?} is not absolute",
                path.display().to_string()
            ));
        }
        out.extend(split_allowed(&normalize(path), protected));
    }
    Ok(out)
}

/// An allowed path with the protected directories cut out (SPEC §16.8), compared on canonical
/// paths where they exist: the path itself when it holds none of them, else its entries,
/// recursively split, leaving out the protected directories themselves and every symlink
/// (Landlock would grant whatever it points to, and the command may plant symlinks in its
/// allowed paths). Entries created later directly in a split directory are not granted.
fn split_allowed(path: &Path, protected: &[PathBuf]) -> Vec<PathBuf> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let protected: Vec<PathBuf> = protected.iter().map(|p| canon(p)).collect();
    let real = canon(path);
    if !protected
        .iter()
        .any(|p| p.starts_with(&real) || real.starts_with(p))
    {
        return vec![path.to_path_buf()];
    }
    split_around(&real, &protected, Symlinks::Skip)
}

/// What [`split_around`] does with a symlink among the entries of a split directory.
#[derive(Clone, Copy, PartialEq)]
enum Symlinks {
    /// Grant it like any entry (read grants: `/lib` → `usr/lib` and the like must keep working).
    Keep,
    /// Leave it out (write grants: Landlock would grant whatever it points to, and the command
    /// may plant symlinks in its allowed paths).
    Skip,
}

/// The directories [`split_around`] splits: `grant` and its descendants that hold one of
/// `protected` (each loses its own grant in the split), not the protected paths themselves.
fn split_dirs(grant: &Path, protected: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in protected {
        if !p.starts_with(grant) || p == grant {
            continue;
        }
        let mut dir = p.parent();
        while let Some(d) = dir {
            if !d.starts_with(grant) {
                break;
            }
            out.push(d.to_path_buf());
            dir = d.parent();
        }
    }
    out
}

/// `grant` itself when it contains no protected path; otherwise its children (recursively
/// split), leaving out the protected paths themselves.
fn split_around(grant: &Path, protected: &[PathBuf], symlinks: Symlinks) -> Vec<PathBuf> {
    if protected.iter().any(|p| grant.starts_with(p)) {
        return Vec::new();
    }
    if !protected.iter().any(|p| p.starts_with(grant)) {
        return vec![grant.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(grant) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        if symlinks == Symlinks::Skip && entry.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        out.extend(split_around(&entry.path(), protected, symlinks));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(allowed: &[&str], protected: &[&str]) -> Result<Policy, String> {
        Policy::build(
            SandboxMode::Landlock,
            false,
            &allowed.iter().map(PathBuf::from).collect::<Vec<_>>(),
            &protected.iter().map(PathBuf::from).collect::<Vec<_>>(),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn allowed_paths_become_read_write() {
        let p = build(&["/work/ws", "/tmp"], &["/var/lib/agentd"]).unwrap();
        assert_eq!(p.read_write, [PathBuf::from("/work/ws"), "/tmp".into()]);
        assert!(p.read_exec.contains(&PathBuf::from("/usr")));
        assert_eq!(p.timeout_ms, 5000);
    }

    #[test]
    fn allowed_path_containing_the_state_dir_is_split_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for sub in ["state/inbox", "config", "workspace/a"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("notes.txt"), "").unwrap();
        // A symlink to the state directory is never granted.
        std::os::unix::fs::symlink(root.join("state"), root.join("alias")).unwrap();
        let protected = [root.join("state"), root.join("config")];
        let got = split_allowed(&root, &protected);
        assert_eq!(got, [root.join("notes.txt"), root.join("workspace")]);
        // Inside a protected directory: nothing; beside it: unchanged.
        assert!(split_allowed(&root.join("state/inbox"), &protected).is_empty());
        assert!(split_allowed(&root.join("state"), &protected).is_empty());
        assert_eq!(
            split_allowed(&root.join("workspace"), &protected),
            [root.join("workspace")]
        );
        // Through Policy::build: never refused, the protected ones left out.
        let p = Policy::build(
            SandboxMode::Landlock,
            false,
            std::slice::from_ref(&root),
            &protected,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            p.read_write,
            [root.join("notes.txt"), root.join("workspace")]
        );
        assert!(build(&["/var/lib/agentd-other"], &["/var/lib/agentd"]).is_ok());
    }

    /// The fallback of read-only paths: the grant split around them, the paths readable, the
    /// split directories listable (unless a secret directory lies beneath), opted-in files
    /// writable; paths outside every grant are left alone.
    #[test]
    fn read_only_paths_get_a_split_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap().join("ws");
        for sub in ["skills/a", "notes"] {
            std::fs::create_dir_all(ws.join(sub)).unwrap();
        }
        std::fs::write(ws.join("AGENTS.md"), "").unwrap();
        std::fs::write(ws.join("skills/a/SKILL.md"), "").unwrap();
        std::fs::write(ws.join("todo.txt"), "").unwrap();
        let mut p = Policy::build(
            SandboxMode::Landlock,
            false,
            std::slice::from_ref(&ws),
            &[],
            Duration::from_secs(5),
        )
        .unwrap();
        let read_only = [ws.join("AGENTS.md"), ws.join("skills"), "/etc/x".into()];
        p.keep_read_only(&read_only, &[ws.join("skills/a/SKILL.md")], &[]);
        assert_eq!(p.read_only, [ws.join("AGENTS.md"), ws.join("skills")]);
        let f = p.fallback.clone().unwrap();
        assert_eq!(
            f.read_write,
            [
                ws.join("notes"),
                ws.join("todo.txt"),
                ws.join("skills/a/SKILL.md")
            ]
        );
        assert_eq!(f.read, [ws.join("AGENTS.md"), ws.join("skills")]);
        assert_eq!(f.list, std::slice::from_ref(&ws));
        let fb = p.with_fallback();
        assert_eq!(fb.read_write, f.read_write);
        assert!(fb.read_exec.contains(&ws.join("AGENTS.md")));
        assert_eq!(fb.list_only, std::slice::from_ref(&ws));
        assert!(fb.read_only.is_empty() && fb.fallback.is_none());
        // A secret directory under the split one: not even listed.
        let mut q = Policy::build(
            SandboxMode::Landlock,
            false,
            std::slice::from_ref(&ws),
            &[],
            Duration::from_secs(5),
        )
        .unwrap();
        q.keep_read_only(&[ws.join("AGENTS.md")], &[], &[ws.join("notes")]);
        assert!(q.fallback.unwrap().list.is_empty());
    }

    #[test]
    fn relative_allowed_path_is_refused() {
        assert!(build(&["ws"], &[]).is_err());
    }

    #[test]
    fn system_read_path_is_split_around_a_protected_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/secret")).unwrap();
        std::fs::create_dir_all(root.join("a/other")).unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        let got = split_around(root, &[root.join("a/secret")], Symlinks::Keep);
        assert_eq!(got, [root.join("a/other"), root.join("b")]);
        assert_eq!(
            split_around(&root.join("b"), &[root.join("a")], Symlinks::Keep),
            [root.join("b")]
        );
        assert!(split_around(&root.join("a"), &[root.to_path_buf()], Symlinks::Keep).is_empty());
    }

    #[test]
    fn etc_config_dir_is_not_readable() {
        let p = build(&["/tmp/ws"], &["/etc/agentd"]).unwrap();
        assert!(!p.read_exec.contains(&PathBuf::from("/etc")));
        assert!(p.read_exec.iter().all(|r| !r.starts_with("/etc/agentd")));
        assert!(p.read_exec.contains(&PathBuf::from("/etc/passwd")));
    }

    #[test]
    fn mcp_server_reads_everything_but_the_protected_dirs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in ["state", "config", "ws", "other", "mcp/evil", "mcp/good"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("config/.env"), "K=v").unwrap();
        let p = Policy::for_mcp_server(
            SandboxMode::Landlock,
            true,
            &[r.to_path_buf()],
            &[r.join("state"), r.join("config")],
            &r.join("mcp/evil"),
        )
        .unwrap();
        assert_eq!(p.timeout_ms, NO_DEADLINE_MS);
        assert_eq!(p.deadline_from(std::time::Instant::now()), None);
        assert!(p.network);
        // Written: the allowed path split around the protected and private dirs, plus its own.
        assert_eq!(
            p.read_write,
            [r.join("other"), r.join("ws"), r.join("mcp/evil")]
        );
        let all: Vec<&PathBuf> = p.read_exec.iter().chain(&p.read_write).collect();
        for denied in ["state", "config", "config/.env", "mcp/good"] {
            assert!(
                all.iter().all(|g| !r.join(denied).starts_with(g)),
                "{denied} is reachable through {all:?}"
            );
        }
        // Readable: system paths, the server's code anywhere else, /proc as its own grant.
        assert!(p.read_exec.contains(&PathBuf::from("/usr")));
        assert!(p.read_exec.contains(&PathBuf::from("/etc")));
        assert!(p.read_exec.contains(&PathBuf::from("/proc")));
        assert!(p.read_exec.contains(&r.join("other")));
        assert!(
            Policy::for_mcp_server(SandboxMode::Landlock, true, &[], &[], Path::new("rel"))
                .is_err()
        );
    }

    #[test]
    fn exec_policies_keep_their_deadline() {
        let p = build(&["/tmp/ws"], &[]).unwrap();
        let now = std::time::Instant::now();
        assert_eq!(p.deadline_from(now), Some(now + Duration::from_secs(5)));
    }

    #[test]
    fn policy_round_trips_as_json() {
        let p = build(&["/tmp/ws"], &[]).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        assert!(serde_json::from_str::<Policy>("{\"mode\":\"landlock\"}").is_err());
    }
}
