//! Where `agent-send` finds the daemon's files: the state directory, the control FIFO, the time
//! zone for calendar periods, and the models' context windows.
//!
//! State directory: `--state-dir` > `$AGENTD_STATE_DIR` > the config's `[paths] state_dir`. The
//! config is loaded in every case (for the FIFO path, the time zone and context windows), but
//! only needed when nothing else names the state directory.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::zone::Zone;

use super::CliError;
use crate::config::{self, Config, ConfigError};

/// Name of the FIFO in the state directory when the config does not say otherwise.
pub const DEFAULT_FIFO_NAME: &str = "control.pipe";

/// Resolved locations and settings for one `agent-send` run.
#[derive(Debug, Clone)]
pub struct Context {
    /// Absolute state directory.
    pub state_dir: PathBuf,
    /// The control FIFO.
    pub fifo: PathBuf,
    /// `agent.timezone` when the config loaded, else the system's zone (the config's default).
    pub timezone: Zone,
    /// Model config name → context window in tokens (empty without a config).
    pub context_windows: BTreeMap<String, u32>,
    /// Why the config did not load, when the state directory came from elsewhere.
    pub config_error: Option<String>,
    /// `[agent.skills] dir` when the config loaded (`--skill` checks names there).
    pub skills_dir: Option<PathBuf>,
}

impl Context {
    /// A context with defaults for `state_dir`, as without a loadable config.
    pub fn for_state_dir(state_dir: &Path) -> Context {
        Context {
            state_dir: state_dir.to_path_buf(),
            fifo: state_dir.join(DEFAULT_FIFO_NAME),
            timezone: config::system_timezone(),
            context_windows: BTreeMap::new(),
            config_error: None,
            skills_dir: None,
        }
    }

    /// `state_dir/sessions`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.state_dir.join("sessions")
    }
}

/// Resolve the context. `state_dir_flag` is `--state-dir`, `env_state_dir` the value of
/// `$AGENTD_STATE_DIR`, `config` the result of loading the config file.
pub fn resolve(
    state_dir_flag: Option<&Path>,
    env_state_dir: Option<OsString>,
    config: Result<Config, ConfigError>,
) -> Result<Context, CliError> {
    let explicit = state_dir_flag
        .map(Path::to_path_buf)
        .or_else(|| env_state_dir.filter(|v| !v.is_empty()).map(PathBuf::from))
        .map(|p| absolute(&p));
    match (explicit, config) {
        (Some(dir), Ok(cfg)) => Ok(from_config(&cfg, Some(dir))),
        (None, Ok(cfg)) => Ok(from_config(&cfg, None)),
        (Some(dir), Err(e)) => {
            let mut ctx = Context::for_state_dir(&dir);
            ctx.config_error = Some(e.to_string());
            Ok(ctx)
        }
        (None, Err(e)) => Err(CliError::Config(e.to_string())),
    }
}

/// Load the config named by `-c` (or `$AGENTD_CONFIG`, or `./config/agentd.toml`) and resolve
/// the context with the process environment.
pub fn resolve_from_env(
    state_dir_flag: Option<&Path>,
    config_flag: Option<&Path>,
) -> Result<Context, CliError> {
    let config = config::load(&config::resolve_config_path(config_flag));
    resolve(state_dir_flag, std::env::var_os("AGENTD_STATE_DIR"), config)
}

fn from_config(cfg: &Config, state_dir: Option<PathBuf>) -> Context {
    let configured = &cfg.paths.state_dir;
    let state_dir = state_dir.unwrap_or_else(|| configured.clone());
    // A FIFO path left at its default follows an overridden state directory; an explicit
    // `[fifo] path` is kept.
    let fifo = if cfg.fifo.path == configured.join(DEFAULT_FIFO_NAME) {
        state_dir.join(DEFAULT_FIFO_NAME)
    } else {
        cfg.fifo.path.clone()
    };
    Context {
        state_dir,
        fifo,
        timezone: cfg.agent.timezone.clone(),
        context_windows: cfg
            .models
            .loaded
            .iter()
            .map(|(name, spec)| (name.clone(), spec.context_window))
            .collect(),
        config_error: None,
        skills_dir: Some(cfg.agent.skills.dir.clone()),
    }
}

/// `p` made absolute against the current directory (the daemon only accepts `text_file` paths
/// inside its state directory, compared as absolute paths).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error() -> ConfigError {
        ConfigError::Io {
            path: "/nowhere/agentd.toml".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
    }

    #[test]
    fn flag_beats_env_and_a_broken_config_is_tolerated() {
        let ctx = resolve(
            Some(Path::new("/flag")),
            Some("/env".into()),
            Err(config_error()),
        )
        .unwrap();
        assert_eq!(ctx.state_dir, Path::new("/flag"));
        assert_eq!(ctx.fifo, Path::new("/flag/control.pipe"));
        assert!(ctx.config_error.unwrap().contains("/nowhere/agentd.toml"));

        let ctx = resolve(None, Some("/env".into()), Err(config_error())).unwrap();
        assert_eq!(ctx.state_dir, Path::new("/env"));
    }

    #[test]
    fn no_state_dir_and_no_config_is_a_config_error() {
        let err = resolve(None, None, Err(config_error())).unwrap_err();
        assert!(matches!(err, CliError::Config(_)));
        assert_eq!(err.exit_code(), 1);
        assert!(err.to_string().contains("/nowhere/agentd.toml"), "{err}");
        // An empty variable counts as unset.
        assert!(resolve(None, Some("".into()), Err(config_error())).is_err());
    }

    #[test]
    fn relative_state_dir_is_made_absolute() {
        let ctx = resolve(Some(Path::new("rel/state")), None, Err(config_error())).unwrap();
        assert!(ctx.state_dir.is_absolute());
        assert!(ctx.state_dir.ends_with("rel/state"));
    }

    /// A loadable config in a temp dir: `<tmp>/config/agentd.toml` + one provider file.
    fn load_config(dir: &Path, extra: &str) -> Result<Config, ConfigError> {
        std::fs::create_dir_all(dir.join("config")).unwrap();
        std::fs::create_dir_all(dir.join("providers.d")).unwrap();
        std::fs::write(
            dir.join("providers.d/anthropic.toml"),
            "type = \"anthropic\"\napi_key_env = \"AGENTD_ANTHROPIC_KEY\"\n\
             [models.primary]\nmodel = \"claude-sonnet-4-5\"\ncontext_window = 100000\n",
        )
        .unwrap();
        let text = format!(
            "[agent]\nname = \"t\"\nworkspace = \"../workspace\"\ntimezone = \"Europe/Berlin\"\n\
             [providers]\ndir = \"../providers.d\"\n[paths]\nstate_dir = \"../state\"\n{extra}"
        );
        std::fs::write(dir.join("config/agentd.toml"), text).unwrap();
        let env = BTreeMap::from([
            ("HOME".to_string(), dir.display().to_string()),
            ("AGENTD_ANTHROPIC_KEY".to_string(), "sk-test".to_string()),
        ]);
        config::load_with_env(&dir.join("config/agentd.toml"), env)
    }

    #[test]
    fn config_supplies_state_dir_fifo_zone_and_windows() {
        let d = tempfile::tempdir().unwrap();
        let cfg = match load_config(d.path(), "") {
            Ok(c) => c,
            Err(e) => panic!("test config must load:\n{e}"),
        };
        let state = cfg.paths.state_dir.clone();
        assert!(state.ends_with("state"), "{}", state.display());
        let ctx = resolve(None, None, Ok(cfg.clone())).unwrap();
        assert_eq!(ctx.state_dir, state);
        assert_eq!(ctx.fifo, state.join("control.pipe"));
        assert_eq!(
            ctx.timezone,
            crate::zone::Zone::get("Europe/Berlin").unwrap()
        );
        assert_eq!(ctx.context_windows.get("primary"), Some(&100_000));
        assert_eq!(ctx.sessions_dir(), state.join("sessions"));

        // --state-dir moves a default FIFO along with it.
        let ctx = resolve(Some(Path::new("/other")), None, Ok(cfg)).unwrap();
        assert_eq!(ctx.fifo, Path::new("/other/control.pipe"));
        assert_eq!(
            ctx.timezone,
            crate::zone::Zone::get("Europe/Berlin").unwrap()
        );
    }

    #[test]
    fn an_explicit_fifo_path_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let cfg = match load_config(d.path(), "[fifo]\npath = \"/run/agentd/ctl\"\n") {
            Ok(c) => c,
            Err(e) => panic!("test config must load:\n{e}"),
        };
        let ctx = resolve(Some(Path::new("/other")), None, Ok(cfg)).unwrap();
        assert_eq!(ctx.fifo, Path::new("/run/agentd/ctl"));
    }
}
