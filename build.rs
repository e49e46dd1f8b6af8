//! Release binaries on Linux with glibc: how the linker lays out and trims the executable.
//!
//! - **Packed relative relocations (`DT_RELR`).** A position-independent executable carries one
//!   24-byte `.rela.dyn` entry per pointer in its read-only data (vtables, string tables):
//!   1.2 MB of agentd's 15.6 MB file, all of it read and applied by the dynamic loader at every
//!   start, so resident too. `-z pack-relative-relocs` (binutils ≥ 2.38, glibc ≥ 2.36) stores
//!   them as a bitmap of a few kilobytes and keeps the executable position-independent (ASLR
//!   unchanged). The linker is asked first on a tiny program, so a toolchain without the
//!   option builds as before (docs/BENCHMARKS.md, footprint).
//! - **Code that runs, together (`build/symbol-order.txt`).** The kernel maps a binary's pages
//!   in 64 KiB windows around each page a program touches, so code spread over the whole
//!   `.text` made most of its 9.8 MB resident. The file lists the functions a start, an idle
//!   daemon and its messages execute (3 MB, written by `scripts/symbol-order.sh` under
//!   callgrind); the linker puts them first, in one run of pages. Names it does not find (the
//!   code changed since the list was written, another compiler) are skipped: the binary is
//!   the same code either way, only its resident memory differs (`bench footprint`). Only for `agentd`, and only when a probe link shows the linker reads the file
//!   (LLD, Rust's default on this target, does; GNU ld does not).
//! - **No symbol table** (3.4 MB of the file, never loaded: a panic still prints its message
//!   and source location; a backtrace shows addresses instead of names), stripped by the
//!   linker here rather than by the profile's `strip`: `strip` is part of the hash in every
//!   symbol's name, so a build with names (`AGENTD_KEEP_SYMBOLS=1`, for `perf`, `cargo bloat`
//!   and the script above) must differ from the shipped one in nothing else.

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    build_info();
    let var = |k: &str| env::var(k).unwrap_or_default();
    if var("PROFILE") != "release"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
    {
        return;
    }
    // Only files that exist: a missing one would make cargo run this script (and build the
    // crate again) on every build. scripts/symbol-order.sh touches build.rs after writing them.
    for f in [ORDER_FILE, ORDER_RUSTC_FILE, "Cargo.lock"] {
        if std::path::Path::new(f).is_file() {
            println!("cargo:rerun-if-changed={f}");
        }
    }
    println!("cargo:rerun-if-env-changed=AGENTD_KEEP_SYMBOLS");
    if linker_packs_relocations() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    } else {
        println!(
            "cargo:warning=the linker cannot pack relative relocations (binutils < 2.38 or glibc < 2.36): the binary keeps its full relocation table"
        );
    }
    let order = PathBuf::from(var("CARGO_MANIFEST_DIR")).join(ORDER_FILE);
    if order.is_file() && linker_orders_symbols() {
        println!(
            "cargo:rustc-link-arg-bin=agentd=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=agentd=-Wl,--no-warn-symbol-ordering");
        warn_if_written_for_another_build();
    }
    if env::var_os("AGENTD_KEEP_SYMBOLS").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,--strip-all");
    }
}

/// `AGENTD_GIT_COMMIT` (`git rev-parse --short HEAD`, `unknown` without git or outside a
/// checkout) and `AGENTD_BUILD_FEATURES` (the enabled cargo features, `none`) for
/// `agentd::VERSION`. The script runs again when `HEAD` or the branch it names moves (their
/// files as git resolves them, so also in a worktree, where `.git` is a file); only files that
/// exist are named, or cargo would run it on every build.
fn build_info() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=AGENTD_GIT_COMMIT={commit}");
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).is_file()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let mut features: Vec<String> = env::vars()
        .filter_map(|(k, _)| {
            let f = k.strip_prefix("CARGO_FEATURE_")?;
            Some(f.to_ascii_lowercase().replace('_', "-"))
        })
        .collect();
    features.sort();
    let features = if features.is_empty() {
        "none".to_string()
    } else {
        features.join(",")
    };
    println!("cargo:rustc-env=AGENTD_BUILD_FEATURES={features}");
}

/// One line of `git`'s answer, or `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let line = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !line.is_empty()).then_some(line)
}

/// The functions to place first in `agentd`'s `.text`, one mangled name per line.
const ORDER_FILE: &str = "build/symbol-order.txt";

/// What the list was written for, saved beside it by the script: the compiler (`rustc -V`)
/// and, on a second line, `Cargo.lock`'s checksum (`cksum < Cargo.lock`).
const ORDER_RUSTC_FILE: &str = "build/symbol-order.rustc";

/// Every name in the list carries a hash of the compiler's version and of agentd's
/// dependencies: another compiler, or a changed dependency set, finds none of agentd's own
/// functions (0 of 285 after the chrono-tz → jiff change, docs/BENCHMARKS.md), and the
/// binary keeps the linker's default order for them (up to 4 MB more resident code). Say so
/// once per build, with the fix; the build goes on.
fn warn_if_written_for_another_build() {
    let Ok(out) = rustc().arg("-V").output() else {
        return;
    };
    let now = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stamp = std::fs::read_to_string(ORDER_RUSTC_FILE).unwrap_or_default();
    let mut lines = stamp.lines().map(str::trim);
    let written = lines.next().unwrap_or_default();
    let lock_then = lines.next().unwrap_or_default();
    let lock_now = std::fs::File::open("Cargo.lock").ok().and_then(|lock| {
        let out = Command::new("cksum").stdin(lock).output().ok()?;
        out.status
            .success()
            .then(|| format!("Cargo.lock {}", String::from_utf8_lossy(&out.stdout).trim()))
    });
    // A dev-dependency change also changes the file: then the warning is a false alarm, and
    // writing the list again costs nine minutes, not a wrong build.
    if let Some(lock_now) = lock_now
        && !written.is_empty()
        && lock_then != lock_now
    {
        println!(
            "cargo:warning={ORDER_FILE} was written for another Cargo.lock: if agentd's dependencies changed, its own function names will not match and keep the default code order (more resident memory). Run scripts/symbol-order.sh to write it again."
        );
    }
    if written != now {
        let by = if written.is_empty() {
            format!("an unknown compiler ({ORDER_RUSTC_FILE} is missing)")
        } else {
            format!("`{written}`")
        };
        println!(
            "cargo:warning={ORDER_FILE} was written for {by}, this build uses `{now}`: its names will not match and agentd keeps the default code order (more resident memory). Run scripts/symbol-order.sh to write it for this compiler."
        );
    }
}

/// The compiler cargo builds with.
fn rustc() -> Command {
    Command::new(env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
}

/// Whether this build's linker takes `--symbol-ordering-file` (LLD, rustc's default for
/// x86_64 Linux since 1.90, does; GNU ld refuses it, and a toolchain may be
/// built to link with them): a tiny program is linked the way this build links, with the
/// target's linker (`RUSTC_LINKER`) and flags, and an empty list.
fn linker_orders_symbols() -> bool {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    let (src, list, bin) = (
        out.join("order_probe.rs"),
        out.join("order_probe.txt"),
        out.join("order_probe"),
    );
    if std::fs::write(&src, "fn main() {}\n").is_err() || std::fs::write(&list, "").is_err() {
        return false;
    }
    let mut c = rustc();
    c.arg("--edition=2021").arg("-o").arg(&bin).arg(&src);
    c.arg(format!(
        "-Clink-arg=-Wl,--symbol-ordering-file={}",
        list.display()
    ));
    c.arg("-Clink-arg=-Wl,--no-warn-symbol-ordering");
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        c.arg("-C")
            .arg(format!("linker={}", linker.to_string_lossy()));
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    c.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `cc` links a position-independent program with the option and without a warning
/// (an older `ld` only warns about an unknown `-z` keyword), and the program runs (the C
/// library's loader understands the packed table).
fn linker_packs_relocations() -> bool {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    let src = out.join("relr_probe.c");
    let bin = out.join("relr_probe");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    quiet(
        Command::new("cc")
            .args([
                "-pie",
                "-fPIE",
                "-Wl,-z,pack-relative-relocs",
                "-Wl,--fatal-warnings",
                "-o",
            ])
            .arg(&bin)
            .arg(&src),
    ) && quiet(&mut Command::new(&bin))
}
