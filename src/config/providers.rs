//! Models: `providers.d/<name>.toml` files (top-level keys inherited by each `[models.<name>]`)
//! and inline `[models.<name>]` in agentd.toml → `ModelSet` (SPEC §4).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use secrecy::SecretString;
use toml::Table;

use super::env::{Env, is_var_name};
use super::error::{Problem, display_path};
use super::keys::models as km;
use super::types::{
    CacheTtl, ModelSet, ModelSpec, Pricing, ProviderKind, Thinking, ToolSchemaDialect,
};
use super::walker::{Section, Walker, join_key};

/// Default Anthropic origin (the client appends `/v1/messages`).
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// Default OpenAI API root (the client appends `/chat/completions`).
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Default ElevenLabs API root (the client appends `/text-to-speech/<voice id>`).
pub const ELEVENLABS_BASE_URL: &str = "https://api.elevenlabs.io/v1";

/// The `provider` label of models defined inline in agentd.toml.
pub const INLINE_PROVIDER: &str = "inline";

/// Every model key as read from one level (provider top level or one model table); all optional
/// so that a model can inherit what it does not set.
#[derive(Debug, Clone, Default)]
struct ModelFields {
    kind: Option<ProviderKind>,
    api_key_env: Option<String>,
    base_url: Option<String>,
    model: Option<String>,
    max_tokens: Option<u32>,
    context_window: Option<u32>,
    input: Option<f64>,
    output: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
    cache_write_1h: Option<f64>,
    per_minute: Option<f64>,
    per_1k_chars: Option<f64>,
    cache: Option<bool>,
    cache_ttl: Option<CacheTtl>,
    thinking: Option<Thinking>,
    thinking_budget: Option<u32>,
    thinking_effort: Option<String>,
    supports_vision: Option<bool>,
    fallback: Option<Vec<String>>,
    prompt_cache_key: Option<bool>,
    schema_keywords: Option<Arc<[String]>>,
    schema_max_length: Option<u64>,
    tool_calls_in_text: Option<bool>,
    structured_output: Option<bool>,
}

impl ModelFields {
    /// Read every model key present in `s` (one line per key).
    fn read(s: &mut Section<'_>) -> Self {
        let mut f = ModelFields {
            kind: s.read_opt(&km::TYPE),
            api_key_env: s.read_opt(&km::API_KEY_ENV),
            base_url: s.read_opt(&km::BASE_URL),
            model: s.read_opt(&km::MODEL),
            max_tokens: s.read_opt(&km::MAX_TOKENS),
            context_window: s.read_opt(&km::CONTEXT_WINDOW),
            cache: s.read_opt(&km::CACHE),
            cache_ttl: s.read_opt(&km::CACHE_TTL),
            thinking: s.read_opt(&km::THINKING),
            thinking_budget: s.read_opt(&km::THINKING_BUDGET),
            thinking_effort: s.read_opt(&km::THINKING_EFFORT),
            supports_vision: s.read_opt(&km::SUPPORTS_VISION),
            fallback: s.read_opt(&km::FALLBACK),
            prompt_cache_key: s.read_opt(&km::PROMPT_CACHE_KEY),
            schema_keywords: s.read_opt(&km::SCHEMA_KEYWORDS),
            schema_max_length: s.read_opt(&km::SCHEMA_MAX_LENGTH),
            tool_calls_in_text: s.read_opt(&km::TOOL_CALLS_IN_TEXT),
            structured_output: s.read_opt(&km::STRUCTURED_OUTPUT),
            per_minute: s.read_opt(&km::COST_PER_MINUTE),
            per_1k_chars: s.read_opt(&km::COST_PER_1K_CHARS),
            ..Default::default()
        };
        if let Some(var) = &f.api_key_env
            && !is_var_name(var)
        {
            s.problem(
                "api_key_env",
                "is not an environment variable name; give the variable's name (e.g. \"AGENTD_ANTHROPIC_KEY\"), never the key itself",
            );
            f.api_key_env = None;
        }
        let mut cost = s.section("cost_per_mtok");
        f.input = cost.read_opt(&km::COST_INPUT);
        f.output = cost.read_opt(&km::COST_OUTPUT);
        f.cache_read = cost.read_opt(&km::COST_CACHE_READ);
        f.cache_write = cost.read_opt(&km::COST_CACHE_WRITE);
        f.cache_write_1h = cost.read_opt(&km::COST_CACHE_WRITE_1H);
        f
    }

    /// `self` (the model) wins over `top` (the provider file's top level).
    fn inherit(self, top: &ModelFields) -> Self {
        let t = top.clone();
        ModelFields {
            kind: self.kind.or(t.kind),
            api_key_env: self.api_key_env.or(t.api_key_env),
            base_url: self.base_url.or(t.base_url),
            model: self.model.or(t.model),
            max_tokens: self.max_tokens.or(t.max_tokens),
            context_window: self.context_window.or(t.context_window),
            input: self.input.or(t.input),
            output: self.output.or(t.output),
            cache_read: self.cache_read.or(t.cache_read),
            cache_write: self.cache_write.or(t.cache_write),
            cache_write_1h: self.cache_write_1h.or(t.cache_write_1h),
            per_minute: self.per_minute.or(t.per_minute),
            per_1k_chars: self.per_1k_chars.or(t.per_1k_chars),
            cache: self.cache.or(t.cache),
            cache_ttl: self.cache_ttl.or(t.cache_ttl),
            thinking: self.thinking.or(t.thinking),
            thinking_budget: self.thinking_budget.or(t.thinking_budget),
            thinking_effort: self.thinking_effort.or(t.thinking_effort),
            supports_vision: self.supports_vision.or(t.supports_vision),
            fallback: self.fallback.or(t.fallback),
            prompt_cache_key: self.prompt_cache_key.or(t.prompt_cache_key),
            schema_keywords: self.schema_keywords.or(t.schema_keywords),
            schema_max_length: self.schema_max_length.or(t.schema_max_length),
            tool_calls_in_text: self.tool_calls_in_text.or(t.tool_calls_in_text),
            structured_output: self.structured_output.or(t.structured_output),
        }
    }
}

/// A model as defined somewhere, with where it came from.
#[derive(Debug, Clone)]
pub struct Defined {
    pub spec: ModelSpec,
    /// The file that defined it (for problems and skip reasons).
    pub file: PathBuf,
    /// `Some(reason)` when the key is missing and the model must be skipped.
    pub skip_reason: Option<String>,
}

/// Collects model definitions in order; a later definition of a name replaces an earlier one.
pub struct ModelCollector<'e> {
    env: &'e Env,
    /// `.env` path shown in skip reasons.
    dotenv_path: PathBuf,
    defined: BTreeMap<String, Defined>,
    /// Names whose latest definition was invalid (already reported), with the file and the
    /// `fallback` list so that its references are still checked.
    invalid: BTreeMap<String, (PathBuf, Vec<String>)>,
    /// Problems found in provider files (agentd.toml problems go to its own walker).
    pub problems: Vec<Problem>,
}

impl<'e> ModelCollector<'e> {
    pub fn new(env: &'e Env, dotenv_path: PathBuf) -> Self {
        ModelCollector {
            env,
            dotenv_path,
            defined: BTreeMap::new(),
            invalid: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// Load `<dir>/<name>.toml`. A missing or unreadable file is reported against
    /// `providers.load[index]` of agentd.toml through `main`.
    pub fn load_file(&mut self, main: &Walker<'_>, dir: &Path, index: usize, name: &str) {
        let key = format!("providers.load[{index}]");
        if name.is_empty()
            || name.starts_with('.')
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            main.problem(
                key,
                format!(
                    "{name:?} is not a provider file name; use the file's name without .toml, e.g. \"anthropic\""
                ),
            );
            return;
        }
        let path = dir.join(format!("{name}.toml"));
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                main.problem(
                    key,
                    format!(
                        "provider file {} does not exist; create it or remove {name:?} from [providers] load",
                        display_path(&path)
                    ),
                );
                return;
            }
            Err(e) => {
                main.problem(
                    key,
                    format!("cannot read provider file {}: {e}", display_path(&path)),
                );
                return;
            }
        };
        let w = Walker::new(&path, self.env);
        match super::parse_toml(&text) {
            Ok(table) => self.walk_provider_file(&w, name, table),
            Err(message) => w.problem("", message),
        }
        self.problems.extend(w.into_problems());
    }

    fn walk_provider_file(&mut self, w: &Walker<'_>, name: &str, table: Table) {
        let mut root = w.root(table);
        let top = ModelFields::read(&mut root);
        let mut models = root.section("models");
        for (model_name, value) in models.rest() {
            let Some(mut s) = models.child(&model_name, value) else {
                continue;
            };
            let fields = ModelFields::read(&mut s).inherit(&top);
            drop(s);
            if fields.kind.is_none() {
                w.problem(
                    models.key_path(&model_name) + ".type",
                    "required; set type = \"anthropic\" or \"openai\" at the top of the provider file or on the model",
                );
            }
            self.define(w, &model_name, name, fields);
        }
    }

    /// Inline `[models.<name>]` tables of agentd.toml; each needs `type` itself.
    pub fn inline(&mut self, mut models: Section<'_>) {
        let w = models.walker();
        for (model_name, value) in models.rest() {
            let Some(mut s) = models.child(&model_name, value) else {
                continue;
            };
            let fields = ModelFields::read(&mut s);
            drop(s);
            if fields.kind.is_none() {
                w.problem(
                    models.key_path(&model_name) + ".type",
                    "required for inline models; add type = \"anthropic\" or \"openai\"",
                );
            }
            self.define(w, &model_name, INLINE_PROVIDER, fields);
        }
    }

    /// Apply defaults, validate, resolve the key, and record the definition.
    fn define(&mut self, w: &Walker<'_>, name: &str, provider: &str, f: ModelFields) {
        let key = |k: &str| model_key(name, k);
        let before = w.problem_count();
        let model = f.model.clone();
        if model.is_none() {
            w.problem(
                key("model"),
                "required; set the provider's model id, e.g. model = \"claude-sonnet-4-5\"",
            );
        }
        let Some(kind) = f.kind else {
            self.mark_invalid(w, name, &f);
            return;
        };
        check_kind_only_keys(w, name, kind, &f);
        let max_tokens = f.max_tokens.unwrap_or_else(km::MAX_TOKENS.default.0);
        let thinking = f.thinking.unwrap_or_else(km::THINKING.default.0);
        let thinking_budget = f
            .thinking_budget
            .unwrap_or_else(km::THINKING_BUDGET.default.0);
        if thinking == Thinking::Budgeted {
            check_thinking_budget(w, name, thinking_budget, max_tokens);
        }
        let base_url = base_url(kind, f.base_url.as_deref());
        let fallback = f.fallback.clone().unwrap_or_default();
        if fallback.iter().any(|n| n == name) {
            w.problem(
                key("fallback"),
                format!("model {name:?} cannot fall back to itself; remove it from the list"),
            );
        }
        let Some(model) = model.filter(|_| w.problem_count() == before) else {
            self.mark_invalid(w, name, &f);
            return;
        };

        let (api_key, skip_reason) = self.resolve_key(w, f.api_key_env.as_deref());
        let pricing = pricing(&f);
        let spec = ModelSpec {
            name: name.to_string(),
            provider: provider.to_string(),
            kind,
            model,
            base_url,
            api_key_env: f.api_key_env,
            api_key,
            max_tokens,
            context_window: f
                .context_window
                .unwrap_or_else(km::CONTEXT_WINDOW.default.0),
            pricing,
            cache: f.cache.unwrap_or(kind == ProviderKind::Anthropic),
            cache_ttl: f.cache_ttl.unwrap_or_else(km::CACHE_TTL.default.0),
            thinking,
            thinking_budget,
            thinking_effort: f.thinking_effort,
            supports_vision: f
                .supports_vision
                .unwrap_or_else(km::SUPPORTS_VISION.default.0),
            fallback,
            prompt_cache_key: f
                .prompt_cache_key
                .unwrap_or_else(km::PROMPT_CACHE_KEY.default.0),
            tool_schema: ToolSchemaDialect {
                keywords: f.schema_keywords.clone(),
                max_length: f.schema_max_length,
            },
            tool_calls_in_text: f
                .tool_calls_in_text
                .unwrap_or_else(km::TOOL_CALLS_IN_TEXT.default.0),
            structured_output: f
                .structured_output
                .unwrap_or(kind != ProviderKind::ElevenLabs),
        };
        self.invalid.remove(name);
        self.defined.insert(
            name.to_string(),
            Defined {
                spec,
                file: w.file().to_path_buf(),
                skip_reason,
            },
        );
    }

    /// The key from the environment variable `api_key_env` names, or why the model is
    /// skipped (the variable is not set).
    fn resolve_key(
        &self,
        w: &Walker<'_>,
        api_key_env: Option<&str>,
    ) -> (Option<SecretString>, Option<String>) {
        let Some(var) = api_key_env else {
            return (None, None);
        };
        match self.env.get_non_empty(var) {
            Some(v) => (Some(SecretString::from(v)), None),
            None => (
                None,
                Some(format!(
                    "environment variable {var} is not set ({}); put it in {} or the environment",
                    display_path(w.file()),
                    display_path(&self.dotenv_path)
                )),
            ),
        }
    }

    /// An invalid definition replaces any earlier one but is not kept.
    fn mark_invalid(&mut self, w: &Walker<'_>, name: &str, f: &ModelFields) {
        self.defined.remove(name);
        let fallback = f.fallback.clone().unwrap_or_default();
        self.invalid
            .insert(name.to_string(), (w.file().to_path_buf(), fallback));
    }

    /// The provider type of a defined model (loaded or skipped).
    pub fn kind_of(&self, name: &str) -> Option<ProviderKind> {
        self.defined.get(name).map(|d| d.spec.kind)
    }

    /// Whether a model of this name is defined (loaded, skipped, or invalid and already
    /// reported).
    pub fn is_defined(&self, name: &str) -> bool {
        self.defined.contains_key(name) || self.invalid.contains_key(name)
    }

    /// Check every `fallback` name against the final set of definitions.
    pub fn check_fallbacks(&mut self) {
        let mut found = Vec::new();
        let all = self
            .defined
            .iter()
            .map(|(name, d)| (name, &d.file, &d.spec.fallback))
            .chain(
                self.invalid
                    .iter()
                    .map(|(name, (file, fb))| (name, file, fb)),
            );
        for (name, file, fallback) in all {
            for (i, target) in fallback.iter().enumerate() {
                if !self.is_defined(target) {
                    found.push(Problem {
                        file: file.clone(),
                        key: format!("{}[{i}]", join_key(&join_key("models", name), "fallback")),
                        message: format!(
                            "no model named {target:?} is defined; define [models.{target}] or remove it from fallback"
                        ),
                    });
                }
            }
        }
        self.problems.extend(found);
    }

    /// The final `ModelSet`.
    pub fn finish(self) -> (ModelSet, Vec<Problem>) {
        let mut set = ModelSet::default();
        for (name, d) in self.defined {
            match d.skip_reason {
                Some(reason) => {
                    set.skipped_specs.insert(name.clone(), Arc::new(d.spec));
                    set.skipped.insert(name, reason);
                }
                None => {
                    set.loaded.insert(name, Arc::new(d.spec));
                }
            }
        }
        (set, self.problems)
    }
}

/// The full key of `k` in model `name`'s table.
fn model_key(name: &str, k: &str) -> String {
    join_key(&join_key("models", name), k)
}

/// Keys that only one provider type reads: a problem when set for another.
fn check_kind_only_keys(w: &Walker<'_>, name: &str, kind: ProviderKind, f: &ModelFields) {
    if kind != ProviderKind::Anthropic && f.cache_ttl.is_some() {
        w.problem(
            model_key(name, "cache_ttl"),
            "only valid for type = \"anthropic\"; remove it",
        );
    }
    if kind != ProviderKind::OpenAi && f.prompt_cache_key.is_some() {
        w.problem(
            model_key(name, "prompt_cache_key"),
            "only valid for type = \"openai\"; remove it",
        );
    }
}

/// A budgeted thinking model's budget: at least the API minimum, below `max_tokens`.
fn check_thinking_budget(w: &Walker<'_>, name: &str, thinking_budget: u32, max_tokens: u32) {
    if thinking_budget >= max_tokens {
        w.problem(
            model_key(name, "thinking_budget"),
            format!(
                "must be below max_tokens ({max_tokens}); lower thinking_budget or raise max_tokens"
            ),
        );
    }
    if thinking_budget < 1024 {
        w.problem(
            model_key(name, "thinking_budget"),
            format!("must be at least 1024 (the API minimum), got {thinking_budget}"),
        );
    }
}

/// `base_url` as set, or the provider type's default; without a trailing slash.
fn base_url(kind: ProviderKind, set: Option<&str>) -> String {
    let default_url = match kind {
        ProviderKind::Anthropic => ANTHROPIC_BASE_URL,
        ProviderKind::OpenAi => OPENAI_BASE_URL,
        ProviderKind::ElevenLabs => ELEVENLABS_BASE_URL,
    };
    set.unwrap_or(default_url).trim_end_matches('/').to_string()
}

/// The prices of a model, each defaulted.
fn pricing(f: &ModelFields) -> Pricing {
    let input = f.input.unwrap_or_else(km::COST_INPUT.default.0);
    Pricing {
        input,
        output: f.output.unwrap_or_else(km::COST_OUTPUT.default.0),
        cache_read: f.cache_read.unwrap_or_else(km::COST_CACHE_READ.default.0),
        cache_write: f.cache_write.unwrap_or_else(km::COST_CACHE_WRITE.default.0),
        // Anthropic's published rate: a 1-hour write costs twice the base input.
        cache_write_1h: f.cache_write_1h.unwrap_or(input * 2.0),
        per_minute: f.per_minute.unwrap_or_else(km::COST_PER_MINUTE.default.0),
        per_1k_chars: f
            .per_1k_chars
            .unwrap_or_else(km::COST_PER_1K_CHARS.default.0),
    }
}
