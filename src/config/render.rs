//! `render_effective`: the effective configuration for `agentd check-config`, written from the
//! key table (`keys::TABLES`): every key of every table, in table order, as TOML that loads
//! back into the same configuration. Secrets appear only as `"[redacted]"` or `"[not set]"`,
//! on comment lines (they are not keys). Models of the provider files are shown commented out
//! (they come back from the files `[providers]` names); inline models as tables.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use secrecy::SecretString;

use super::keys::codec::q;
use super::keys::{Bound, Entries, Shown, TABLES, Table};
use super::providers::INLINE_PROVIDER;
use super::types::{Config, ModelSpec};
use super::walker::join_key;

/// `check-config --json`: `{"ok": true, "config": path, "effective": {...}, "models":
/// {"loaded": [names], "skipped": {name: reason}}}`. `effective` is what
/// [`render_effective`] prints, as JSON (secrets are not in it: the text has them on comment
/// lines only).
pub fn render_effective_json(cfg: &Config) -> serde_json::Value {
    let effective = toml::from_str::<toml::Table>(&render_effective(cfg))
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "ok": true,
        "config": cfg.config_path.display().to_string(),
        "effective": effective,
        "models": {
            "loaded": cfg.models.loaded.keys().collect::<Vec<_>>(),
            "skipped": cfg.models.skipped,
        },
    })
}

/// Render `cfg` as TOML, secrets redacted, ending with the `[models]` section: every model
/// defined, loaded or skipped (with the reason).
pub fn render_effective(cfg: &Config) -> String {
    let mut r = Renderer::default();
    r.comment(&format!(
        "effective configuration of {}",
        cfg.config_path.display()
    ));
    for table in TABLES {
        match table {
            Table::Keys(keys) => r.keys(cfg, keys),
            Table::Tiers(e) => {
                for (tier, files) in &cfg.agent.context.tiers {
                    r.table(&format!("agent.context.tiers.{}", key(tier)));
                    r.record(e.keys, files, &[]);
                }
            }
            Table::Routing(e) => {
                r.table("routing");
                for (source, model) in &cfg.routing {
                    for k in e.keys {
                        r.line(&key(source), k.show(model));
                    }
                }
            }
            Table::Mcp(e) => {
                for (name, server) in &cfg.mcp_servers {
                    r.table(&format!("mcp.servers.{}", key(name)));
                    r.record(e.keys, server, &[]);
                }
            }
            Table::Schedule(e) => {
                for entry in &cfg.schedules {
                    r.array_table("schedule");
                    r.record(e.keys, entry, &[]);
                }
            }
            Table::Models(e) => r.models(cfg, e),
        }
    }
    r.out
}

/// Values derived from a key, shown (commented: they are not keys) after it.
fn derived(cfg: &Config, path: &str) -> Option<(&'static str, String)> {
    let t = &cfg.tools;
    Some(match path {
        "channel.telegram.token_env" => ("token", secret(&cfg.telegram.token)),
        "matrix.token_env" => ("token", secret(&cfg.matrix.token)),
        "matrix.password_env" => ("password", secret(&cfg.matrix.password)),
        "matrix.recovery_key_env" => ("recovery_key", secret(&cfg.matrix.recovery_key)),
        "http.token_env" => ("token", secret(&cfg.http.token)),
        "http.callback_token_env" => ("callback_token", secret(&cfg.http.callback_token)),
        "tools.web_search.base_url" => ("web_search.key", secret(&t.web_search_key)),
        _ => return None,
    })
}

#[derive(Default)]
struct Renderer {
    out: String,
}

impl Renderer {
    fn table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[{name}]\n");
    }

    fn array_table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[[{name}]]\n");
    }

    fn comment(&mut self, text: &str) {
        let _ = writeln!(self.out, "# {text}");
    }

    /// `name = value`; a value that is not set as `# name = (not set)`.
    fn line(&mut self, name: &str, shown: Shown) {
        match shown {
            Shown::Value(v) => {
                let _ = writeln!(self.out, "{name} = {v}");
            }
            Shown::Unset => self.comment(&format!("{name} = (not set)")),
            Shown::Omit => {}
        }
    }

    /// The keys of `Config`, opening each of their tables in turn.
    fn keys(&mut self, cfg: &Config, keys: &[&dyn Bound<Config>]) {
        let mut table = None;
        for k in keys {
            if table != Some(k.table()) {
                table = Some(k.table());
                self.table(k.table());
            }
            self.line(k.name(), k.show(cfg));
            if let Some((name, value)) = derived(cfg, &k.path()) {
                self.comment(&format!("{name} = {value}"));
            }
        }
    }

    /// The keys of one entry, then `extra` lines (commented).
    fn record<R>(&mut self, keys: &[&dyn Bound<R>], r: &R, extra: &[(&str, String)]) {
        for k in keys {
            self.line(k.name(), k.show(r));
        }
        for (name, value) in extra {
            self.comment(&format!("{name} = {value}"));
        }
    }

    /// Every model defined, loaded or skipped. Inline models are tables; models of the
    /// provider files are commented out, since the files define them again.
    fn models(&mut self, cfg: &Config, e: &Entries<ModelSpec>) {
        let m = &cfg.models;
        self.table("models");
        self.comment("models of the provider files are shown commented out: the files define them");
        let names: BTreeSet<&String> = m.loaded.keys().chain(m.skipped.keys()).collect();
        for name in names {
            let spec = m.loaded.get(name).or_else(|| m.skipped_specs.get(name));
            let mut extra = Vec::new();
            if let Some(spec) = spec
                && spec.api_key_env.is_some()
            {
                extra.push(("api_key", secret(&spec.api_key)));
            }
            if let Some(reason) = m.skipped.get(name) {
                extra.push(("skipped", q(reason)));
            }
            let header = format!("models.{}", key(name));
            match spec {
                Some(spec) if spec.provider == INLINE_PROVIDER => {
                    self.table(&header);
                    self.record(e.keys, spec.as_ref(), &extra);
                }
                _ => {
                    let mut block = Renderer::default();
                    block.table(&header);
                    if let Some(spec) = spec {
                        block.line("provider", Shown::Value(q(&spec.provider)));
                        block.record(e.keys, spec.as_ref(), &[]);
                    }
                    for (name, value) in &extra {
                        block.line(name, Shown::Value(value.clone()));
                    }
                    self.commented(&block.out);
                }
            }
        }
    }

    /// `text` with every line commented out.
    fn commented(&mut self, text: &str) {
        for line in text.lines() {
            if line.is_empty() {
                self.out.push('\n');
            } else if line.starts_with('#') {
                let _ = writeln!(self.out, "{line}");
            } else {
                self.comment(line);
            }
        }
    }
}

fn key(k: &str) -> String {
    join_key("", k)
}

fn secret(s: &Option<SecretString>) -> String {
    q(if s.is_some() {
        "[redacted]"
    } else {
        "[not set]"
    })
}
