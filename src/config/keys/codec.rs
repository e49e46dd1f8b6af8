//! Codecs: a key's type and bounds. Each one reads the TOML value found at a key (recording a
//! problem that names the key, the value and the fix when it does not fit), shows a value the
//! way `check-config` prints it (TOML, so that the output loads again), and describes itself
//! for the reference in `docs/configuration.md`.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use toml::Value;

use crate::config::paths::expand_tilde;
use crate::config::walker::{Int as Integer, Walker, describe, join_key};

mod origin;
pub use origin::Origin;

/// How the TOML value of a key becomes its Rust value, and back.
pub trait Codec: Sync + 'static {
    /// The Rust type of the value (the type of the `Config` field it fills).
    type T;
    /// Convert the value found at `path` (a full dotted key path); on a mismatch record a
    /// problem at `path` and return `None`.
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Self::T>;
    /// The value as TOML text; `None` when it is "not set" (an empty `Option`).
    fn show(&self, v: &Self::T) -> Option<String>;
    /// Type and bounds, for the reference, e.g. `integer ≥ 1`.
    fn kind(&self) -> String;
}

/// A TOML basic string.
pub fn q(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A string value, `${VAR}`-expanded.
fn string(w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
    match v {
        Value::String(s) => w.expand(path, &s),
        other => {
            w.problem(path, format!("expected a string, got {}", describe(&other)));
            None
        }
    }
}

/// `true` or `false`.
pub struct Bool;

impl Codec for Bool {
    type T = bool;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<bool> {
        match v {
            Value::Boolean(b) => Some(b),
            other => {
                w.problem(
                    path,
                    format!("expected true or false, got {}", describe(&other)),
                );
                None
            }
        }
    }
    fn show(&self, v: &bool) -> Option<String> {
        Some(v.to_string())
    }
    fn kind(&self) -> String {
        "boolean".into()
    }
}

/// A string (`${VAR}`-expanded); `non_empty`: blank is a problem.
pub struct Str {
    pub non_empty: bool,
}

/// Any string.
pub const TEXT: Str = Str { non_empty: false };
/// A string that is not blank.
pub const WORD: Str = Str { non_empty: true };

impl Codec for Str {
    type T = String;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
        let s = string(w, path, v)?;
        if self.non_empty && s.trim().is_empty() {
            w.problem(path, "must not be empty");
            return None;
        }
        Some(s)
    }
    fn show(&self, v: &String) -> Option<String> {
        Some(q(v))
    }
    fn kind(&self) -> String {
        if self.non_empty {
            "string, not empty".into()
        } else {
            "string".into()
        }
    }
}

/// One of a fixed set of strings (kept as the string).
pub struct Words(pub &'static [&'static str]);

impl Codec for Words {
    type T = String;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
        let s = string(w, path, v)?;
        if self.0.contains(&s.as_str()) {
            return Some(s);
        }
        w.problem(
            path,
            format!("expected one of {}, got {s:?}", options(self.0)),
        );
        None
    }
    fn show(&self, v: &String) -> Option<String> {
        Some(q(v))
    }
    fn kind(&self) -> String {
        alternatives(self.0)
    }
}

/// One of a fixed set of strings, each naming a value.
pub struct OneOf<T: 'static>(pub &'static [(&'static str, T)]);

impl<T: Copy + PartialEq + Sync + 'static> Codec for OneOf<T> {
    type T = T;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<T> {
        let s = string(w, path, v)?;
        if let Some((_, t)) = self.0.iter().find(|(name, _)| *name == s) {
            return Some(*t);
        }
        let names: Vec<&str> = self.0.iter().map(|(n, _)| *n).collect();
        w.problem(
            path,
            format!("expected one of {}, got {s:?}", options(&names)),
        );
        None
    }
    fn show(&self, v: &T) -> Option<String> {
        self.0.iter().find(|(_, t)| t == v).map(|(name, _)| q(name))
    }
    fn kind(&self) -> String {
        let names: Vec<&str> = self.0.iter().map(|(n, _)| *n).collect();
        alternatives(&names)
    }
}

fn options(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn alternatives(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// An integer within `min..=max` (and the range of `N`). `over`, when not empty, is the fix
/// said when the value is above `max`.
pub struct Int<N> {
    pub min: i64,
    pub max: i64,
    pub over: &'static str,
    n: PhantomData<fn() -> N>,
}

impl<N> Int<N> {
    /// Any integer of `N`.
    pub const fn any() -> Self {
        Int::range(i64::MIN, i64::MAX)
    }
    /// `≥ min`.
    pub const fn at_least(min: i64) -> Self {
        Int::range(min, i64::MAX)
    }
    /// `min..=max`.
    pub const fn range(min: i64, max: i64) -> Self {
        Int {
            min,
            max,
            over: "",
            n: PhantomData,
        }
    }
    /// `min..=max`; above `max` the problem says `over` (e.g. "; lower it …").
    pub const fn capped(min: i64, max: i64, over: &'static str) -> Self {
        Int {
            min,
            max,
            over,
            n: PhantomData,
        }
    }

    fn expected(&self) -> String {
        if self.min == i64::MIN {
            "an integer".into()
        } else {
            format!("an integer ≥ {}", self.min)
        }
    }

    fn read_i64(&self, w: &Walker<'_>, path: &str, v: Value, type_max: i64) -> Option<i64> {
        let Value::Integer(i) = v else {
            w.problem(
                path,
                format!("expected {}, got {}", self.expected(), describe(&v)),
            );
            return None;
        };
        if i < self.min {
            w.problem(path, format!("expected {}, got {i}", self.expected()));
            return None;
        }
        if i > self.max.min(type_max) {
            let message = if self.over.is_empty() || self.max > type_max {
                format!("expected an integer ≤ {}, got {i}", self.max.min(type_max))
            } else {
                format!("{i} is over the limit of {}{}", self.max, self.over)
            };
            w.problem(path, message);
            return None;
        }
        Some(i)
    }

    fn describe_range(&self, type_max: i64) -> String {
        let max = self.max.min(type_max);
        match (self.min == i64::MIN, max == type_max) {
            (true, true) => "integer".into(),
            (false, true) => format!("integer ≥ {}", self.min),
            (true, false) => format!("integer ≤ {max}"),
            (false, false) => format!("integer {}–{max}", self.min),
        }
    }
}

impl<N: Integer + std::fmt::Display + Sync + 'static> Codec for Int<N> {
    type T = N;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<N> {
        let i = self.read_i64(w, path, v, N::MAX)?;
        N::try_from(i).ok()
    }
    fn show(&self, v: &N) -> Option<String> {
        Some(v.to_string())
    }
    fn kind(&self) -> String {
        self.describe_range(N::MAX)
    }
}

/// The unit of a duration written as an integer (the key's name says it: `_ms`, `_seconds`,
/// `_minutes`).
#[derive(Clone, Copy)]
pub enum Unit {
    Millis,
    Secs,
    Minutes,
}

/// A duration written as a whole number of `unit`s within the bounds of `int`.
pub struct Dur {
    pub unit: Unit,
    pub int: Int<u64>,
}

impl Dur {
    pub const fn millis(min: i64) -> Self {
        Dur {
            unit: Unit::Millis,
            int: Int::at_least(min),
        }
    }
    pub const fn secs(min: i64) -> Self {
        Dur {
            unit: Unit::Secs,
            int: Int::at_least(min),
        }
    }
    pub const fn minutes(min: i64) -> Self {
        Dur {
            unit: Unit::Minutes,
            int: Int::at_least(min),
        }
    }
    /// Seconds within `min..=max`, with the fix said above `max`.
    pub const fn secs_capped(min: i64, max: i64, over: &'static str) -> Self {
        Dur {
            unit: Unit::Secs,
            int: Int::capped(min, max, over),
        }
    }
}

impl Codec for Dur {
    type T = Duration;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Duration> {
        let n = self.int.read(w, path, v)?;
        Some(match self.unit {
            Unit::Millis => Duration::from_millis(n),
            Unit::Secs => Duration::from_secs(n),
            Unit::Minutes => Duration::from_secs(n.saturating_mul(60)),
        })
    }
    fn show(&self, v: &Duration) -> Option<String> {
        Some(match self.unit {
            Unit::Millis => v.as_millis().to_string(),
            Unit::Secs => v.as_secs().to_string(),
            Unit::Minutes => (v.as_secs() / 60).to_string(),
        })
    }
    fn kind(&self) -> String {
        let unit = match self.unit {
            Unit::Millis => "milliseconds",
            Unit::Secs => "seconds",
            Unit::Minutes => "minutes",
        };
        format!("{}, {unit}", self.int.kind())
    }
}

/// A size written in MB (MiB), kept in bytes.
pub struct Mib(pub Int<u64>);

impl Codec for Mib {
    type T = u64;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<u64> {
        self.0.read(w, path, v).map(|mb| mb.saturating_mul(1 << 20))
    }
    fn show(&self, v: &u64) -> Option<String> {
        Some((v >> 20).to_string())
    }
    fn kind(&self) -> String {
        format!("{}, MB", self.0.kind())
    }
}

/// A finite number (integer or float) within `min..=max`.
pub struct Num {
    pub min: f64,
    pub max: f64,
}

/// A number `≥ 0`, e.g. USD.
pub const NON_NEGATIVE: Num = Num {
    min: 0.0,
    max: f64::MAX,
};

impl Codec for Num {
    type T = f64;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<f64> {
        let n = match v {
            Value::Integer(i) => i as f64,
            Value::Float(f) => f,
            other => {
                w.problem(
                    path,
                    format!("expected a number ≥ {}, got {}", self.min, describe(&other)),
                );
                return None;
            }
        };
        if !n.is_finite() || n < self.min || n > self.max {
            w.problem(path, format!("expected a number {}, got {n}", self.range()));
            return None;
        }
        Some(n)
    }
    fn show(&self, v: &f64) -> Option<String> {
        Some(format!("{v:?}"))
    }
    fn kind(&self) -> String {
        format!("number {}", self.range())
    }
}

impl Num {
    fn range(&self) -> String {
        if self.max == f64::MAX {
            format!("≥ {}", self.min)
        } else {
            format!("from {} to {}", self.min, self.max)
        }
    }
}

/// A duration written as a number of seconds (fractions allowed).
pub struct SecsF(pub Num);

impl Codec for SecsF {
    type T = Duration;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Duration> {
        self.0.read(w, path, v).map(Duration::from_secs_f64)
    }
    fn show(&self, v: &Duration) -> Option<String> {
        Some(format!("{:?}", v.as_secs_f64()))
    }
    fn kind(&self) -> String {
        format!("{}, seconds", self.0.kind())
    }
}

/// A list of values of the inner codec; one bad item is a problem at `key[i]` and the list is
/// not taken.
pub struct List<C>(pub C);

impl<C: Codec> Codec for List<C> {
    type T = Vec<C::T>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Vec<C::T>> {
        let Value::Array(items) = v else {
            w.problem(path, format!("expected a list, got {}", describe(&v)));
            return None;
        };
        let before = w.problem_count();
        let out: Vec<C::T> = items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| self.0.read(w, &format!("{path}[{i}]"), item))
            .collect();
        (w.problem_count() == before).then_some(out)
    }
    fn show(&self, v: &Vec<C::T>) -> Option<String> {
        let items: Vec<String> = v.iter().filter_map(|x| self.0.show(x)).collect();
        Some(format!("[{}]", items.join(", ")))
    }
    fn kind(&self) -> String {
        format!("[{}]", self.0.kind())
    }
}

/// A value that may be absent (`None`: not set).
pub struct Opt<C>(pub C);

impl<C: Codec> Codec for Opt<C> {
    type T = Option<C::T>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Option<C::T>> {
        self.0.read(w, path, v).map(Some)
    }
    fn show(&self, v: &Option<C::T>) -> Option<String> {
        v.as_ref().and_then(|x| self.0.show(x))
    }
    fn kind(&self) -> String {
        self.0.kind()
    }
}

/// A table of names chosen by the user, each with a value of the inner codec.
pub struct Map<C>(pub C);

impl<C: Codec> Codec for Map<C> {
    type T = BTreeMap<String, C::T>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Self::T> {
        let Value::Table(table) = v else {
            w.problem(path, format!("expected a table, got {}", describe(&v)));
            return None;
        };
        let before = w.problem_count();
        let out: BTreeMap<String, C::T> = table
            .into_iter()
            .filter_map(|(k, v)| {
                let value = self.0.read(w, &join_key(path, &k), v)?;
                Some((k, value))
            })
            .collect();
        (w.problem_count() == before).then_some(out)
    }
    fn show(&self, v: &Self::T) -> Option<String> {
        let parts: Vec<String> = v
            .iter()
            .filter_map(|(k, x)| Some(format!("{} = {}", join_key("", k), self.0.show(x)?)))
            .collect();
        Some(if parts.is_empty() {
            "{}".to_string()
        } else {
            format!("{{ {} }}", parts.join(", "))
        })
    }
    fn kind(&self) -> String {
        format!("{{ name = {} }}", self.0.kind())
    }
}

/// A secret string (MCP `env` and `headers` values): shown as `"[redacted]"`.
pub struct Secret;

/// What `check-config` shows for a secret.
pub const REDACTED: &str = "[redacted]";

impl Codec for Secret {
    type T = SecretString;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<SecretString> {
        string(w, path, v).map(SecretString::from)
    }
    fn show(&self, _: &SecretString) -> Option<String> {
        Some(q(REDACTED))
    }
    fn kind(&self) -> String {
        "string (secret)".into()
    }
}

/// A path: `${VAR}`- and `~`-expanded, not yet resolved (the reader resolves it against its
/// base directory); shown as the absolute path in force.
pub struct Path;

impl Codec for Path {
    type T = PathBuf;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<PathBuf> {
        let raw = WORD.read(w, path, v)?;
        let p = expand_tilde(&raw, w.env());
        if p.is_none() {
            w.problem(
                path,
                "uses ~ but HOME is not set; write an absolute path or set HOME",
            );
        }
        p
    }
    fn show(&self, v: &PathBuf) -> Option<String> {
        Some(q(&v.display().to_string()))
    }
    fn kind(&self) -> String {
        "path".into()
    }
}

/// A list of at most `max` absolute paths without `..` (`${VAR}`- and `~`-expanded), taken as
/// written: paths of things the config does not own (a Unix socket), never resolved against
/// the config directory. `example` is shown in the fix.
pub struct AbsPaths {
    pub max: usize,
    pub example: &'static str,
}

impl Codec for AbsPaths {
    type T = Vec<PathBuf>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Vec<PathBuf>> {
        let list = List(Path).read(w, path, v)?;
        if list.len() > self.max {
            w.problem(
                path,
                format!(
                    "{} paths, over the limit of {}; list only the ones needed",
                    list.len(),
                    self.max
                ),
            );
            return None;
        }
        let before = w.problem_count();
        for (i, p) in list.iter().enumerate() {
            let parent = p
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
            if !p.is_absolute() || parent {
                w.problem(
                    format!("{path}[{i}]"),
                    format!(
                        "{:?} must be an absolute path without `..`; write the full path, e.g. {:?}",
                        p.display().to_string(),
                        self.example
                    ),
                );
            }
        }
        (w.problem_count() == before).then_some(list)
    }
    fn show(&self, v: &Vec<PathBuf>) -> Option<String> {
        List(Path).show(v)
    }
    fn kind(&self) -> String {
        format!("[absolute path], at most {}", self.max)
    }
}

/// An http(s) URL; `empty_ok`: `""` (off) is allowed too. Shown without the parts that may be
/// credentials.
pub struct Url {
    pub empty_ok: bool,
}

impl Codec for Url {
    type T = String;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
        let s = string(w, path, v)?;
        if s.is_empty() && self.empty_ok {
            return Some(s);
        }
        if s.trim().is_empty() {
            w.problem(path, "must not be empty");
            return None;
        }
        check_url(w, path, &s);
        Some(s)
    }
    fn show(&self, v: &String) -> Option<String> {
        Some(q(&shown_url(v)))
    }
    fn kind(&self) -> String {
        if self.empty_ok {
            "http(s) URL or empty".into()
        } else {
            "http(s) URL".into()
        }
    }
}

/// Record a problem at `path` unless `url` is an http(s) URL.
pub fn check_url(w: &Walker<'_>, path: &str, url: &str) {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        w.problem(
            path,
            format!(
                "expected an http:// or https:// URL, got {}",
                crate::redact::describe_url_value(url)
            ),
        );
    }
}

/// A URL as `check-config` shows it: as written when nothing in it may be a credential, else
/// with those parts redacted (`redact::display_url`).
pub fn shown_url(url: &str) -> String {
    let normalized = ::url::Url::parse(url.trim()).map(|u| u.to_string());
    let displayed = crate::redact::display_url(url);
    match normalized {
        Ok(n) if n == displayed => url.to_string(),
        Err(_) if displayed == url => url.to_string(),
        _ => displayed,
    }
}

/// A `[retention]` age: `"30d"`, `"12h"`, `"2s"`, `"1h30m"`, or `"0"` (also the number 0) for
/// never (`None`).
pub struct Age;

impl Codec for Age {
    type T = Option<Duration>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Option<Duration>> {
        let parsed = match v {
            Value::String(s) => crate::config::sections::parse_age(&s),
            Value::Integer(0) => Ok(None),
            other => Err(format!(
                "expected a string such as \"30d\", or \"0\" for never; got {}",
                describe(&other)
            )),
        };
        parsed.map_err(|message| w.problem(path, message)).ok()
    }
    fn show(&self, v: &Option<Duration>) -> Option<String> {
        Some(q(&v.map_or_else(
            || "0".to_string(),
            |d| format!("{}s", d.as_secs()),
        )))
    }
    fn kind(&self) -> String {
        "age (\"30d\", \"12h\", \"1h30m\"; \"0\" = never)".into()
    }
}

/// An interval: `"30s"`, `"15m"`, `"1h"`, `"1d"`, `"1h30m"`; at least 1 s and at most `max`
/// seconds (`0`: no upper bound).
pub struct Every {
    pub max: u64,
}

impl Codec for Every {
    type T = Duration;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Duration> {
        let s = string(w, path, v)?;
        match crate::config::schedule::parse_every(&s) {
            Ok(d) if self.max == 0 || d.as_secs() <= self.max => Some(d),
            Ok(_) => {
                w.problem(
                    path,
                    format!(
                        "{s:?} is too long: at most {}s, a precheck holds up the scheduler",
                        self.max
                    ),
                );
                None
            }
            Err(message) => {
                w.problem(path, message);
                None
            }
        }
    }
    fn show(&self, v: &Duration) -> Option<String> {
        Some(q(&format!("{}s", v.as_secs())))
    }
    fn kind(&self) -> String {
        match self.max {
            0 => "interval (\"30s\", \"15m\", \"1h30m\")".into(),
            max => format!("interval (\"30s\", \"5m\"), at most {max} s"),
        }
    }
}

/// A 5-field cron expression (checked for field count and characters; the scheduler parses
/// it), kept with single spaces.
pub struct Cron;

impl Codec for Cron {
    type T = String;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<String> {
        let s = string(w, path, v)?;
        match crate::config::schedule::check_cron(&s) {
            Ok(()) => Some(s.split_whitespace().collect::<Vec<_>>().join(" ")),
            Err(message) => {
                w.problem(path, message);
                None
            }
        }
    }
    fn show(&self, v: &String) -> Option<String> {
        Some(q(v))
    }
    fn kind(&self) -> String {
        "cron expression (5 fields)".into()
    }
}

/// An IANA time zone name, read from the system's database.
pub struct Tz;

impl Codec for Tz {
    type T = crate::zone::Zone;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<crate::zone::Zone> {
        let s = string(w, path, v)?;
        crate::zone::Zone::get(&s)
            .map_err(|e| w.problem(path, e.to_string()))
            .ok()
    }
    fn show(&self, v: &crate::zone::Zone) -> Option<String> {
        Some(q(v.name()))
    }
    fn kind(&self) -> String {
        "IANA time zone name".into()
    }
}

/// `schema_keywords`: a non-empty list of JSON Schema keywords.
pub struct Keywords;

impl Codec for Keywords {
    type T = Arc<[String]>;
    fn read(&self, w: &Walker<'_>, path: &str, v: Value) -> Option<Arc<[String]>> {
        let list = List(TEXT).read(w, path, v)?;
        if list.is_empty() || list.iter().any(|k| k.trim().is_empty()) {
            w.problem(
                path,
                "list the JSON Schema keywords the provider accepts, e.g. [\"type\", \"properties\", \"required\"]; leave the key out to send schemas whole",
            );
            return None;
        }
        Some(list.into())
    }
    fn show(&self, v: &Arc<[String]>) -> Option<String> {
        List(TEXT).show(&v.to_vec())
    }
    fn kind(&self) -> String {
        "[string], not empty".into()
    }
}
