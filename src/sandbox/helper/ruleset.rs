//! The Landlock ruleset the helper applies right before the seccomp filter and `exec`: the
//! filesystem grants of mode `landlock`, the scopes, the network rules without a network
//! namespace, and the Unix sockets an MCP server is given.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use super::Isolation;
use crate::sandbox::policy::{Policy, READ_WRITE_DEVICES, SandboxMode};

/// The Landlock ABI whose filesystem rights are requested (best effort below it). V9 adds
/// `ResolveUnix` (Linux 7.1): connecting to a pathname Unix socket outside the read-write
/// grants (and the policy's `unix_sockets`) is then refused by Landlock as well as by the
/// seccomp filter.
const FS_ABI: ABI = ABI::V9;

/// Confine the filesystem (mode `landlock`), the Unix sockets the policy gives (any mode) and,
/// when the network is not allowed and no network namespace isolates it, TCP bind/connect (any
/// mode). Refuses to go on when the kernel does not enforce what the policy needs; the Unix
/// socket list is best effort (the daemon says where it is not enforced).
pub(super) fn apply_landlock(
    policy: &Policy,
    isolation: Isolation,
    proc_visible: bool,
) -> Result<(), String> {
    let confine_fs = policy.mode == SandboxMode::Landlock;
    let need_net = !policy.network && isolation == Isolation::Subreaper;
    // The seccomp filter lets such a command create Unix sockets: Landlock is what narrows
    // where they reach, so in mode `none` too.
    let confine_unix = !policy.unix_sockets.is_empty();
    if !confine_fs && !need_net && !confine_unix {
        return Ok(());
    }
    let err = |e: landlock::RulesetError| format!("Landlock setup failed: {e}");
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort);
    if confine_fs {
        ruleset = ruleset
            .handle_access(AccessFs::from_all(FS_ABI))
            .map_err(err)?;
        ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(err)?;
    } else if confine_unix {
        ruleset = ruleset
            .handle_access(AccessFs::ResolveUnix)
            .map_err(err)?
            .scope(Scope::AbstractUnixSocket)
            .map_err(err)?;
    }
    if !policy.network {
        // Without a network namespace this is the only network barrier: require it.
        let level = if need_net {
            CompatLevel::HardRequirement
        } else {
            CompatLevel::BestEffort
        };
        ruleset = ruleset
            .set_compatibility(level)
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(|e| {
                format!(
                    "cannot block the network: no network namespace and no Landlock network \
                     rules (kernel 6.7+ needed): {e}; set exec_network = true to run anyway"
                )
            })?
            .set_compatibility(CompatLevel::BestEffort);
    }
    let mut created = ruleset.create().map_err(err)?;
    if confine_fs {
        created = add_fs_rules(created, policy, proc_visible)?;
    }
    if confine_unix {
        // Where the kernel has `ResolveUnix` (ABI 9): the listed sockets, besides what lies
        // beneath the read-write grants (given every right above; added here in mode `none`).
        let mut sockets = existing(&policy.unix_sockets);
        if !confine_fs {
            sockets.extend(existing(&policy.read_write));
        }
        created = created
            .add_rules(path_beneath_rules(sockets, AccessFs::ResolveUnix))
            .map_err(err)?;
    }
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced && (confine_fs || need_net) {
        return Err(if confine_fs {
            "Landlock is not enforced by this kernel (needs Linux 5.13+ with landlock in the \
             `lsm=` list); refusing to run the command unsandboxed. Set [tools] exec_sandbox = \
             \"none\" to run it without Landlock"
                .into()
        } else {
            "Landlock network rules are not enforced; refusing to run with the network open. \
             Set exec_network = true to allow it"
                .into()
        });
    }
    Ok(())
}

/// The paths of `paths` that exist (Landlock rules need an open file).
fn existing(paths: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    paths.iter().filter(|p| p.exists()).cloned().collect()
}

/// The filesystem grants of mode `landlock`: read + execute, read + write, the devices, the
/// directories only listed.
fn add_fs_rules(
    created: RulesetCreated,
    policy: &Policy,
    proc_visible: bool,
) -> Result<RulesetCreated, String> {
    let err = |e: landlock::RulesetError| format!("Landlock setup failed: {e}");
    let devices: Vec<std::path::PathBuf> = READ_WRITE_DEVICES.iter().map(Into::into).collect();
    // Without a private /proc, the host's /proc would show the daemon's environment to a
    // same-uid command (Landlock's ptrace restriction does not cover it everywhere): grant
    // no /proc at all then.
    let read_exec: Vec<std::path::PathBuf> = policy
        .read_exec
        .iter()
        .filter(|p| proc_visible || !p.starts_with("/proc"))
        .cloned()
        .collect();
    created
        .add_rules(path_beneath_rules(
            existing(&read_exec),
            AccessFs::from_read(FS_ABI),
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(&policy.read_write),
            AccessFs::from_all(FS_ABI),
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(&devices),
            AccessFs::from_read(FS_ABI) | AccessFs::WriteFile,
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(&policy.list_only),
            AccessFs::ReadDir,
        ))
        .map_err(err)
}
