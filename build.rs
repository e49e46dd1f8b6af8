//! Release binaries on Linux with glibc: pack the relative relocations (`DT_RELR`).
//!
//! A position-independent executable carries one 24-byte `.rela.dyn` entry per pointer in its
//! read-only data (vtables, string tables): 1.2 MB of agentd's 15.6 MB file, all of it read and
//! applied by the dynamic loader at every start, so resident too. `-z pack-relative-relocs`
//! (binutils ≥ 2.38, glibc ≥ 2.36) stores them as a bitmap of a few kilobytes and keeps the
//! executable position-independent (ASLR unchanged). The linker is asked first on a tiny
//! program, so a toolchain without the option builds as before (docs/BENCHMARKS.md,
//! footprint).

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |k: &str| env::var(k).unwrap_or_default();
    if var("PROFILE") != "release"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
    {
        return;
    }
    if linker_packs_relocations() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    } else {
        println!(
            "cargo:warning=the linker cannot pack relative relocations (binutils < 2.38 or glibc < 2.36): the binary keeps its full relocation table"
        );
    }
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
