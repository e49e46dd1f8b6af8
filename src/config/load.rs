//! Orchestration: read agentd.toml and the `.env` beside it, walk every section, load the
//! provider files, cross-check names, and return either a `Config` or every problem found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Table;

use super::env::{Env, parse_dotenv};
use super::error::{ConfigError, Problem};
use super::keys::Codec;
use super::keys::agent::{PROVIDERS_DIR, PROVIDERS_LOAD, ROUTE};
use super::paths::{absolutize, resolve};
use super::providers::ModelCollector;
use super::types::{Config, ProvidersConfig};
use super::walker::{Section, Walker, closest};
use super::{channels, mcp, schedule, sections, tools};

/// Source names allowed as keys of `[routing]` (SPEC §3, §5): the message sources plus
/// `vision` (used when a message carries an image).
pub const ROUTING_SOURCES: &[&str] = &[
    "telegram", "matrix", "user", "system", "http", "api", "terminal", "vision",
];

/// Where the process environment comes from.
pub(super) enum ProcessSource {
    Real,
    Fixed(BTreeMap<String, String>),
}

/// Load and validate the config at `path`.
pub(super) fn load(path: &Path, process: ProcessSource) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let config_path = absolutize(path);
    let config_dir = config_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));

    let mut problems = Vec::new();
    let dotenv_path = config_dir.join(".env");
    let dotenv = read_dotenv(&dotenv_path, &mut problems);
    let env = match process {
        ProcessSource::Real => Env::new(dotenv),
        ProcessSource::Fixed(map) => Env::with_process_map(map, dotenv),
    };

    let mut table = match super::parse_toml(&text) {
        Ok(t) => t,
        Err(message) => {
            problems.push(Problem {
                file: config_path.clone(),
                key: String::new(),
                message,
            });
            return Err(ConfigError::Invalid {
                path: config_path,
                problems,
            });
        }
    };

    let w = Walker::new(&config_path, &env);
    super::keys::renames::apply(&w, &mut table, super::keys::renames::RENAMES);
    let (mut config, provider_problems) = walk(&w, table, &config_path, &config_dir, &dotenv_path);
    config.warnings = w.warnings();
    problems.extend(w.into_problems());
    problems.extend(provider_problems);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid {
            path: config_path,
            problems,
        })
    }
}

/// `.env` beside the config: missing is fine, malformed lines are problems.
fn read_dotenv(path: &Path, problems: &mut Vec<Problem>) -> BTreeMap<String, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            problems.push(Problem {
                file: path.to_path_buf(),
                key: String::new(),
                message: format!("cannot read: {e}"),
            });
            return BTreeMap::new();
        }
    };
    let (vars, bad) = parse_dotenv(&text);
    problems.extend(bad.into_iter().map(|p| Problem {
        file: path.to_path_buf(),
        key: format!("line {}", p.line),
        message: p.message,
    }));
    vars
}

/// The fallbacks resolve, and `primary` exists and can answer a message.
fn check_primary(w: &Walker<'_>, models: &mut ModelCollector<'_>) {
    models.check_fallbacks();
    if !models.is_defined("primary") {
        w.problem(
            "models",
            "no model named \"primary\" is defined; define [models.primary] in a provider file listed in [providers] load, or inline in this file",
        );
    }
    // ElevenLabs models speak (`[voice] tts_model`); they cannot answer a message.
    for name in ["primary"] {
        if models.kind_of(name) == Some(super::types::ProviderKind::ElevenLabs) {
            w.problem(
                "models",
                format!(
                    "model {name:?} has type = \"elevenlabs\", a speech-only provider; give {name:?} an anthropic or openai type and use the ElevenLabs model as [voice] tts_model"
                ),
            );
        }
    }
}

/// Walk every section of agentd.toml. Returns the config (meaningful only when no problem was
/// recorded) and the problems found in provider files.
fn walk(
    w: &Walker<'_>,
    table: Table,
    config_path: &Path,
    config_dir: &Path,
    dotenv_path: &Path,
) -> (Config, Vec<Problem>) {
    let mut root = w.root(table);
    let agent = sections::agent(&mut root, config_dir);
    let state_dir = sections::state_dir(&mut root, config_dir);

    let providers = providers_section(&mut root, config_dir);
    let mut models = ModelCollector::new(w.env(), dotenv_path.to_path_buf());
    for (i, name) in providers.load.iter().enumerate() {
        models.load_file(w, &providers.dir, i, name);
    }
    models.inline(root.section("models"));
    check_primary(w, &mut models);
    let routing = routing(&mut root, &models);

    let telegram = channels::telegram(&mut root);
    let matrix = super::matrix::matrix(&mut root);
    let fifo = channels::fifo(&mut root, config_dir, &state_dir);
    let http = channels::http(&mut root);
    let behavior = sections::behavior(&mut root);
    let budget = sections::budget(&mut root);
    let approvals = super::approvals::approvals(&mut root);
    let delivery = sections::delivery(&mut root);
    let mcp_server = sections::mcp_server(&mut root);
    let tools = tools::tools(&mut root, config_dir, &agent.workspace);
    // SPEC §16.8: the tools may not write the state or config directory, so scratch space
    // there would be unusable.
    for (name, dir) in [
        ("the state directory", &state_dir),
        ("the config directory", &config_dir.to_path_buf()),
    ] {
        if tools.scratch_dir.starts_with(dir) {
            w.problem(
                "tools.scratch_dir",
                format!(
                    "{} is inside {name} {}, which the tools must not write; choose a directory outside it",
                    tools.scratch_dir.display(),
                    dir.display()
                ),
            );
        }
    }
    let mcp_servers = mcp::servers(&mut root, config_dir);
    let schedules = schedule::schedules(&mut root, &telegram.contacts);
    let memory = sections::memory(&mut root);
    let logging = sections::logging(&mut root);
    let retention = sections::retention(&mut root);
    let backup = sections::backup(&mut root, config_dir);
    let caching = super::autopilot::caching(&mut root);
    let alerts = super::autopilot::alerts(&mut root);
    let voice = super::voice::voice(&mut root, &models);
    drop(root);
    // Explicitly chosen helper models must exist; the defaults may be undefined (they fall back
    // to `primary`).
    for (key, name, default) in [
        (
            "behavior.compaction.model",
            &behavior.compaction.model,
            "compaction",
        ),
        ("tools.subagent_model", &tools.subagent_model, "subagent"),
    ] {
        if name != default && !models.is_defined(name) {
            w.problem(
                key,
                format!("no model named {name:?} is defined; define [models.{name}] or remove the key to use {default:?} (or primary)"),
            );
        }
    }

    let (models, provider_problems) = models.finish();
    let config = Config {
        config_path: config_path.to_path_buf(),
        config_dir: config_dir.to_path_buf(),
        agent,
        providers,
        models,
        routing,
        fifo,
        http,
        telegram,
        matrix,
        behavior,
        budget,
        approvals,
        delivery,
        tools,
        memory,
        paths: super::types::PathsConfig { state_dir },
        logging,
        retention,
        backup,
        mcp_servers,
        schedules,
        caching,
        alerts,
        mcp_server,
        voice,
        warnings: Vec::new(),
    };
    (config, provider_problems)
}

/// `[providers]`: `load` (default `["anthropic"]`), `dir` (default `providers.d`, against the
/// config directory).
fn providers_section(root: &mut Section<'_>, config_dir: &Path) -> ProvidersConfig {
    let mut s = root.section("providers");
    let load = s.read(&PROVIDERS_LOAD);
    let dir = s.read(&PROVIDERS_DIR);
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in load.iter().enumerate() {
        if !seen.insert(name) {
            s.problem(
                &format!("load[{i}]"),
                format!("{name:?} is listed twice; remove the duplicate"),
            );
        }
    }
    ProvidersConfig {
        load,
        dir: resolve(&dir, config_dir),
    }
}

/// `[routing]`: known source → defined model.
fn routing(root: &mut Section<'_>, models: &ModelCollector<'_>) -> BTreeMap<String, String> {
    let mut s = root.section("routing");
    let w = s.walker();
    let entries: Vec<(String, String)> = s
        .rest()
        .into_iter()
        .filter_map(|(source, v)| {
            let model = ROUTE.codec.read(w, &s.key_path(&source), v)?;
            Some((source, model))
        })
        .collect();
    for (source, target) in &entries {
        if !ROUTING_SOURCES.contains(&source.as_str()) {
            let hint = match closest(source, ROUTING_SOURCES) {
                Some(near) => format!(" (did you mean {near:?}?)"),
                None => format!("; known sources: {}", ROUTING_SOURCES.join(", ")),
            };
            s.problem(source, format!("unknown message source{hint}"));
        }
        if !models.is_defined(target) {
            s.problem(
                source,
                format!("no model named {target:?} is defined; define [models.{target}] or route to an existing model"),
            );
        }
    }
    entries.into_iter().collect()
}
