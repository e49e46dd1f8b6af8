//! The key table: every key of `agentd.toml` and of the provider files is declared once, in
//! one of the files of this module, with its table, name, type and bounds (its [`Codec`]),
//! default, whether a SIGHUP applies it ([`Apply`]), the `Config` field it fills, and its doc.
//!
//! Everything else comes from that declaration:
//! - parsing: the section readers (`sections.rs`, `channels.rs`, …) read a key with
//!   `Section::read(&KEY)` — type, bounds, default and the problem's wording come from here;
//!   the readers keep only the checks that span keys or the environment;
//! - `check-config`'s rendering (`render.rs`) walks [`TABLES`] and shows every key through its
//!   accessor, so a key cannot be parsed and left out of the output;
//! - `--diff` and the reload report: [`applies_live`] looks the changed key up here;
//! - the SIGHUP merge: [`copy_live`] (behind `Config::with_live_parts_of`) copies exactly the
//!   keys declared live;
//! - the reference in `docs/configuration.md` ([`reference`], checked by a test).
//!
//! Adding a key: declare it in the file of its table, read it in its section reader with
//! `s.read(&KEY)`, and document it (commented) in `config/agentd.toml`; the tests fail until
//! the last two are done and the reference is regenerated.

pub mod codec;
pub mod reference;
pub mod renames;
#[cfg(test)]
mod tests;

use std::marker::PhantomData;

pub use codec::Codec;

use super::types::{Config, McpServerConfig, ModelSpec, ScheduleEntry, TierFiles};
use super::walker::Section;

/// Whether a SIGHUP applies a change of the key.
pub enum Apply<R: 'static> {
    /// Copied from the new file into the running config (the function copies it).
    Live(fn(&mut R, &R)),
    /// Needs a restart.
    Restart,
    /// A key of a named entry (`[mcp.servers.<name>]`, `[[schedule]]`, …): as its
    /// [`Entries`] says (entries are replaced whole).
    AsEntries,
}

/// The default of a key that has one.
pub struct Fixed<T: 'static>(pub fn() -> T);
/// A default the reader computes from other values; the text says what it is.
pub struct Derived(pub &'static str);
/// A key that must be set; the text is an example value for the problem.
pub struct Required(pub &'static str);

/// What the reference says about a default.
pub trait Dflt<C: Codec>: Sync {
    fn text(&self, codec: &C) -> String;
    /// A fixed default as `check-config` shows it (`None`: not fixed, or not set).
    fn shown(&self, _: &C) -> Option<String> {
        None
    }
    fn is_required(&self) -> bool {
        false
    }
}

impl<C: Codec> Dflt<C> for Fixed<C::T> {
    fn text(&self, codec: &C) -> String {
        match self.shown(codec) {
            Some(v) => format!("`{v}`"),
            None => "not set".into(),
        }
    }
    fn shown(&self, codec: &C) -> Option<String> {
        codec.show(&(self.0)())
    }
}

impl<C: Codec> Dflt<C> for Derived {
    fn text(&self, _: &C) -> String {
        self.0.into()
    }
}

impl<C: Codec> Dflt<C> for Required {
    fn text(&self, _: &C) -> String {
        "**required**".into()
    }
    fn is_required(&self) -> bool {
        true
    }
}

/// One key. `R` is the record it configures (`Config`, or one entry such as `ModelSpec`),
/// `C` its codec, `D` its kind of default.
pub struct Key<R: 'static, C: Codec, D: 'static> {
    /// The TOML table (`"behavior"`, `"mcp.servers.<name>"`, `"schedule"` for `[[schedule]]`).
    pub table: &'static str,
    /// The key within the table; dotted for a sub-table (`"filesystem.allowed_paths"`).
    pub name: &'static str,
    pub codec: C,
    pub default: D,
    pub apply: Apply<R>,
    /// The value in force (`None`: the key does not apply to this record, e.g. `url` of a
    /// `command` MCP server).
    pub get: fn(&R) -> Option<&C::T>,
    /// One line for the reference.
    pub doc: &'static str,
}

impl<R, C: Codec, D> Key<R, C, D> {
    /// The last part of the name: the key as its (sub-)table holds it.
    pub fn leaf(&self) -> &'static str {
        let name: &'static str = self.name;
        name.rsplit('.').next().unwrap_or(name)
    }
}

impl<R, C: Codec> Key<R, C, Fixed<C::T>> {
    /// The default value.
    pub fn default_value(&self) -> C::T {
        (self.default.0)()
    }
}

/// What every key says about itself, whatever its type.
pub trait Spec: Sync {
    fn table(&self) -> &'static str;
    fn name(&self) -> &'static str;
    /// `table.name`.
    fn path(&self) -> String {
        join_dotted(self.table(), self.name())
    }
    /// Type and bounds.
    fn kind(&self) -> String;
    /// The default as the reference shows it.
    fn default_text(&self) -> String;
    /// A fixed default as `check-config` shows it (`None`: derived, required, or not set).
    fn default_shown(&self) -> Option<String>;
    fn is_required(&self) -> bool;
    /// `Some(live)`, or `None` for a key of named entries (see [`Entries::apply`]).
    fn live(&self) -> Option<bool>;
    fn doc(&self) -> &'static str;
}

/// A key bound to its record: how it is shown and, if live, copied.
pub trait Bound<R>: Spec {
    fn show(&self, r: &R) -> Shown;
    fn copy_live(&self, to: &mut R, from: &R);
}

/// A key's value as `check-config` shows it.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// The key does not apply to this record: no line.
    Omit,
    /// Not set (an empty option): a comment line.
    Unset,
    /// TOML text.
    Value(String),
}

impl<R, C: Codec, D: Dflt<C>> Spec for Key<R, C, D> {
    fn table(&self) -> &'static str {
        self.table
    }
    fn name(&self) -> &'static str {
        self.name
    }
    fn kind(&self) -> String {
        self.codec.kind()
    }
    fn default_text(&self) -> String {
        self.default.text(&self.codec)
    }
    fn default_shown(&self) -> Option<String> {
        self.default.shown(&self.codec)
    }
    fn is_required(&self) -> bool {
        self.default.is_required()
    }
    fn live(&self) -> Option<bool> {
        match self.apply {
            Apply::Live(_) => Some(true),
            Apply::Restart => Some(false),
            Apply::AsEntries => None,
        }
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
}

impl<R, C: Codec, D: Dflt<C>> Bound<R> for Key<R, C, D> {
    fn show(&self, r: &R) -> Shown {
        match (self.get)(r) {
            None => Shown::Omit,
            Some(v) => self.codec.show(v).map_or(Shown::Unset, Shown::Value),
        }
    }
    fn copy_live(&self, to: &mut R, from: &R) {
        if let Apply::Live(copy) = self.apply {
            copy(to, from);
        }
    }
}

/// Entries named by the user: `[agent.context.tiers.<tier>]`, `[routing]`,
/// `[mcp.servers.<name>]`, `[[schedule]]`, `[models.<name>]`. A reload replaces them whole,
/// so whether it applies them is said once for all their keys.
pub struct Entries<R: 'static> {
    /// The table pattern, e.g. `"mcp.servers.<name>"`.
    pub table: &'static str,
    /// The start of every diff key of these entries (`"mcp.servers."`, `"schedule."`).
    pub prefix: &'static str,
    /// `Live(copy of the whole collection)` or `Restart`.
    pub apply: Apply<Config>,
    pub keys: &'static [&'static dyn Bound<R>],
    record: PhantomData<fn() -> R>,
}

impl<R> Entries<R> {
    pub const fn new(
        table: &'static str,
        prefix: &'static str,
        apply: Apply<Config>,
        keys: &'static [&'static dyn Bound<R>],
    ) -> Self {
        Entries {
            table,
            prefix,
            apply,
            keys,
            record: PhantomData,
        }
    }

    fn is_live(&self) -> bool {
        matches!(self.apply, Apply::Live(_))
    }

    fn specs(&self) -> Vec<&'static dyn Spec> {
        self.keys.iter().map(|k| *k as &dyn Spec).collect()
    }
}

/// One group of the table, in the order `check-config` shows them and the reference lists them.
pub enum Table {
    /// Keys with fixed names, on `Config` (one or more consecutive TOML tables).
    Keys(&'static [&'static dyn Bound<Config>]),
    Tiers(&'static Entries<TierFiles>),
    Routing(&'static Entries<String>),
    Mcp(&'static Entries<McpServerConfig>),
    Schedule(&'static Entries<ScheduleEntry>),
    Models(&'static Entries<ModelSpec>),
}

impl Table {
    /// The keys of this group.
    pub fn specs(&self) -> Vec<&'static dyn Spec> {
        match self {
            Table::Keys(keys) => keys.iter().map(|k| *k as &dyn Spec).collect(),
            Table::Tiers(e) => e.specs(),
            Table::Routing(e) => e.specs(),
            Table::Mcp(e) => e.specs(),
            Table::Schedule(e) => e.specs(),
            Table::Models(e) => e.specs(),
        }
    }

    /// `(prefix, live, copy)` of named entries.
    fn entries(&self) -> Option<(&'static str, bool, &Apply<Config>)> {
        match self {
            Table::Keys(_) => None,
            Table::Tiers(e) => Some((e.prefix, e.is_live(), &e.apply)),
            Table::Routing(e) => Some((e.prefix, e.is_live(), &e.apply)),
            Table::Mcp(e) => Some((e.prefix, e.is_live(), &e.apply)),
            Table::Schedule(e) => Some((e.prefix, e.is_live(), &e.apply)),
            Table::Models(e) => Some((e.prefix, e.is_live(), &e.apply)),
        }
    }
}

/// Declare keys of `Config`, each once, and the list of them in declaration order:
///
/// `NAME: "table" "key", Codec = codec, default(value) | derived("doc") | required("example"),
/// live | restart, field.path, "doc";`
macro_rules! config_keys {
    ($(#[$lm:meta])* $list:ident = [ $(
        $name:ident: $table:literal $key:literal, $C:ty = $codec:expr,
        $dk:ident ( $($dv:tt)* ), $apply:ident, $($f:ident).+, $doc:literal;
    )* ]) => {
        $(
            pub static $name: $crate::config::keys::Key<
                $crate::config::Config, $C, config_keys!(@dty $dk $C)
            > = $crate::config::keys::Key {
                table: $table,
                name: $key,
                codec: $codec,
                default: config_keys!(@dval $dk $($dv)*),
                apply: config_keys!(@apply $apply $($f).+),
                get: |c| Some(&c.$($f).+),
                doc: $doc,
            };
        )*
        $(#[$lm])*
        pub static $list: &[&dyn $crate::config::keys::Bound<$crate::config::Config>] =
            &[$(&$name),*];
    };
    (@dty default $C:ty) => { $crate::config::keys::Fixed<<$C as $crate::config::keys::Codec>::T> };
    (@dty derived $C:ty) => { $crate::config::keys::Derived };
    (@dty required $C:ty) => { $crate::config::keys::Required };
    (@dval default $($e:tt)*) => { $crate::config::keys::Fixed(|| $($e)*) };
    (@dval derived $s:literal) => { $crate::config::keys::Derived($s) };
    (@dval required $s:literal) => { $crate::config::keys::Required($s) };
    (@apply live $($f:ident).+) => {
        $crate::config::keys::Apply::Live(
            |to: &mut $crate::config::Config, from: &$crate::config::Config| {
                to.$($f).+ = from.$($f).+.clone()
            },
        )
    };
    (@apply restart $($f:ident).+) => { $crate::config::keys::Apply::Restart };
}

/// Declare the keys of a named entry (record `R`), each once, and their list:
///
/// `NAME: "table" "key", Codec = codec, default(value) | derived("doc") | required("example"),
/// |r| accessor, "doc";`
macro_rules! entry_keys {
    ($R:ty; $list:ident = [ $(
        $name:ident: $table:literal $key:literal, $C:ty = $codec:expr,
        $dk:ident ( $($dv:tt)* ), $get:expr, $doc:literal;
    )* ]) => {
        $(
            pub static $name: $crate::config::keys::Key<$R, $C, config_keys!(@dty $dk $C)> =
                $crate::config::keys::Key {
                    table: $table,
                    name: $key,
                    codec: $codec,
                    default: config_keys!(@dval $dk $($dv)*),
                    apply: $crate::config::keys::Apply::AsEntries,
                    get: $get,
                    doc: $doc,
                };
        )*
        pub static $list: &[&dyn $crate::config::keys::Bound<$R>] = &[$(&$name),*];
    };
}

pub mod agent;
pub mod behavior;
pub mod channels;
pub mod models;
pub mod state;
pub mod tools;

/// Every group, in the order of `check-config` and of the reference.
pub static TABLES: &[Table] = &[
    Table::Keys(agent::AGENT),
    Table::Tiers(&agent::TIERS),
    Table::Keys(agent::SKILLS),
    Table::Keys(agent::PROVIDERS),
    Table::Routing(&agent::ROUTING),
    Table::Keys(channels::TELEGRAM),
    Table::Keys(channels::MATRIX),
    Table::Keys(channels::FIFO),
    Table::Keys(channels::HTTP),
    Table::Keys(channels::MCP_SERVE),
    Table::Keys(behavior::BEHAVIOR),
    Table::Keys(behavior::BUDGET),
    Table::Keys(behavior::APPROVALS),
    Table::Keys(behavior::DELIVERY),
    Table::Keys(tools::TOOLS),
    Table::Mcp(&tools::MCP),
    Table::Schedule(&tools::SCHEDULE),
    Table::Keys(behavior::AUTOPILOT),
    Table::Keys(state::MEMORY),
    Table::Keys(state::PATHS),
    Table::Keys(state::LOGGING),
    Table::Keys(state::RETENTION),
    Table::Keys(state::BACKUP),
    Table::Keys(state::VOICE),
    Table::Models(&models::MODELS),
];

/// Every key, in table order.
pub fn all() -> Vec<&'static dyn Spec> {
    TABLES.iter().flat_map(Table::specs).collect()
}

/// Whether a SIGHUP applies a change of the key at `path` (a key of `check-config`'s output,
/// as `config::diff` names it: `budget.daily_usd`, `mcp.servers.time.command`,
/// `schedule.nightly`). Anything not declared live (values derived from keys such as
/// `http.token` included) needs a restart.
pub fn applies_live(path: &str) -> bool {
    for table in TABLES {
        if let Some((prefix, live, _)) = table.entries() {
            if path.starts_with(prefix) {
                return live;
            }
            continue;
        }
        if let Some(key) = table.specs().into_iter().find(|k| k.path() == path) {
            return key.live() == Some(true);
        }
    }
    false
}

/// Copy every key declared live (and every live collection of entries) from `from` into `to`.
pub fn copy_live(to: &mut Config, from: &Config) {
    for table in TABLES {
        match table {
            Table::Keys(keys) => keys.iter().for_each(|k| k.copy_live(to, from)),
            _ => {
                if let Some((_, _, Apply::Live(copy))) = table.entries() {
                    copy(to, from);
                }
            }
        }
    }
}

/// `table.name` (the name may itself be dotted).
fn join_dotted(table: &str, name: &str) -> String {
    if table.is_empty() {
        name.to_string()
    } else {
        format!("{table}.{name}")
    }
}

impl Section<'_> {
    /// The value of `key` when present and valid (`None`: absent, or a problem was recorded).
    pub fn read_opt<R, C: Codec, D>(&mut self, key: &Key<R, C, D>) -> Option<C::T> {
        let leaf = key.leaf();
        let v = self.take(leaf)?;
        key.codec.read(self.walker(), &self.key_path(leaf), v)
    }

    /// The value of `key`, or its default when absent or invalid (then a problem was recorded).
    pub fn read<R, C: Codec>(&mut self, key: &Key<R, C, Fixed<C::T>>) -> C::T {
        self.read_opt(key).unwrap_or_else(key.default.0)
    }

    /// The value of a required `key`; absent: a problem saying what to add.
    pub fn read_required<R, C: Codec>(&mut self, key: &Key<R, C, Required>) -> Option<C::T> {
        let leaf = key.leaf();
        if !self.has(leaf) {
            let _ = self.take(leaf);
            let table = match self.path() {
                "" => "the top level".to_string(),
                t => format!("[{t}]"),
            };
            self.problem(
                leaf,
                format!("required; add {leaf} = {} to {table}", key.default.0),
            );
            return None;
        }
        self.read_opt(key)
    }
}
