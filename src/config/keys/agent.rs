//! `[agent]`, `[agent.context]`, `[agent.context.tiers.<tier>]`, `[agent.skills]`,
//! `[providers]` and `[routing]`.

use std::path::PathBuf;

use super::codec::{List, Path, TEXT, Tz};
use super::{Apply, Entries};
use crate::config::types::TierFiles;

/// Strings as an owned list (for defaults).
pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

config_keys! {
    AGENT = [
        NAME: "agent" "name", super::codec::Str = TEXT,
            required("\"agentd\""), restart, agent.name,
            "the agent's name";
        WORKSPACE: "agent" "workspace", Path = Path,
            required("\"../workspace\""), restart, agent.workspace,
            "the workspace directory (prompt files, tool paths); relative to the config directory";
        TIMEZONE: "agent" "timezone", Tz = Tz,
            derived("the system zone (from the database, else the file `/etc/localtime` itself), else UTC with a warning in the log at start"),
            restart, agent.timezone,
            "IANA name (`\"Europe/Berlin\"`), read from the system's time zone database: an absolute `$TZDIR`, then `/usr/share/zoneinfo` (Debian's and Ubuntu's package `tzdata`; legacy names such as `US/Eastern` need `tzdata-legacy` on Debian 13 and Ubuntu 24.04), then `/etc/zoneinfo`; `\"UTC\"` needs none; the database's `right/` and `posix/` copies are refused; used for trail dates and `ts`, the time prefix of user turns, and \"today\"/\"month\" for costs and budgets";
        CONTEXT_STABLE: "agent.context" "stable", List<super::codec::Str> = List(TEXT),
            default(strings(&["SOUL.md", "AGENTS.md", "USER.md", "IDENTITY.md", "TOOLS.md"])),
            restart, agent.context.stable,
            "workspace files of the stable system block (tier `full`)";
        CONTEXT_SEMI_STABLE: "agent.context" "semi_stable", List<super::codec::Str> = List(TEXT),
            default(strings(&["MEMORY.md"])), restart, agent.context.semi_stable,
            "workspace files of the semi-stable system block (tier `full`)";
    ]
}

entry_keys! {
    TierFiles; TIER_KEYS = [
        TIER_STABLE: "agent.context.tiers.<tier>" "stable", List<super::codec::Str> = List(TEXT),
            default(Vec::new()), |t| Some(&t.stable),
            "workspace files of the tier's stable system block";
        TIER_SEMI_STABLE: "agent.context.tiers.<tier>" "semi_stable", List<super::codec::Str> = List(TEXT),
            default(Vec::new()), |t| Some(&t.semi_stable),
            "workspace files of the tier's semi-stable system block";
    ]
}

/// `[agent.context.tiers.<tier>]`: the file sets of other tiers, e.g. `operational`.
pub static TIERS: Entries<TierFiles> = Entries::new(
    "agent.context.tiers.<tier>",
    "agent.context.tiers.",
    Apply::Restart,
    TIER_KEYS,
);

config_keys! {
    SKILLS = [
        SKILLS_DIR: "agent.skills" "dir", Path = Path,
            default(PathBuf::from("skills")), restart, agent.skills.dir,
            "skills directory, relative to the workspace; each `<dir>/<name>/SKILL.md` is a skill (format: `usage.md`, \"Skills\"). Rescanned on SIGHUP and SIGUSR1";
        SKILLS_ALWAYS_ON: "agent.skills" "always_on", List<super::codec::Str> = List(TEXT),
            default(Vec::new()), restart, agent.skills.always_on,
            "skill names whose body is always in the semi-stable block; an unknown name is logged as a warning";
    ]
}

config_keys! {
    PROVIDERS = [
        PROVIDERS_LOAD: "providers" "load", List<super::codec::Str> = List(TEXT),
            default(strings(&["anthropic"])), restart, providers.load,
            "provider files `<dir>/<name>.toml` to load, in order; no duplicates. A later definition of a model name replaces an earlier one";
        PROVIDERS_DIR: "providers" "dir", Path = Path,
            default(PathBuf::from("providers.d")), restart, providers.dir,
            "where provider files live; relative to the config directory";
    ]
}

entry_keys! {
    String; ROUTE_KEYS = [
        ROUTE: "routing" "<source>", super::codec::Str = TEXT,
            derived("`\"primary\"`"), |model| Some(model),
            "the model for messages of this source: `telegram`, `user` (FIFO `-m`), `system` (FIFO `-s` and `notify`, HTTP `/notify`, the scheduler), `http` (HTTP `/chat`), `api` (the OpenAI- and Anthropic-compatible endpoints), `terminal` (`agentd chat`), or `vision` (a message with an image, when its model is loaded); the model must be defined";
    ]
}

/// `[routing]`: message source → model name.
pub static ROUTING: Entries<String> =
    Entries::new("routing", "routing.", Apply::Restart, ROUTE_KEYS);
