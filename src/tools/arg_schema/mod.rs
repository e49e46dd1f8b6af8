//! Tool-argument schemas: compile the part of JSON Schema that tool schemas use once, then
//! check a call's arguments against it, listing each violation with its instance path
//! (`/edits/0/oldText`) and a message the model can act on (SPEC §11).
//!
//! Why not a full JSON Schema library: the schemas are ours and the MCP servers'. The census
//! in docs/BENCHMARKS.md ("Tool-argument schemas") shows what they use: `type`, `properties`,
//! `required`, `additionalProperties`, `enum`, `items`, `minItems`, `minLength`, `minimum`,
//! `maximum`, `anyOf` (nullable fields), `default`/`description`/`title`, `format` and
//! `$schema`. No `pattern`: so no regex engine is linked for it.
//!
//! **Checked:** `type` (a name or a list; `integer` is any whole number, `1.0` included),
//! `nullable: true` (OpenAPI's spelling: also allows `null`), `enum`, `const` (numbers compare
//! by value: `1 == 1.0`), `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (the
//! number form and draft 4's boolean form), `multipleOf` (in the decimal the numbers are
//! written in: `0.3` is a multiple of `0.1`), `minLength`/`maxLength` (characters, not
//! bytes), `items` (a schema, or draft 7's list with `additionalItems`), `prefixItems`,
//! `minItems`, `maxItems`, `uniqueItems`, `contains` with `minContains`/`maxContains`,
//! `properties`, `required`, `additionalProperties` (`false` or a schema),
//! `minProperties`, `maxProperties`, `propertyNames`, `dependentRequired`, `dependentSchemas`,
//! `dependencies`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`, boolean schemas, and
//! `$ref` to a location in the same document (`#`, `#/$defs/…`, `#/definitions/…`). Under a
//! draft 4–7 `$schema`, a `$ref` replaces its sibling keywords, as those drafts say.
//!
//! **Accepted, not checked:** `format` (as JSON Schema validators do by default), `pattern`
//! and `patternProperties` (with `patternProperties` present, `additionalProperties` is not
//! checked either: which names match a pattern is unknown), `unevaluatedProperties`,
//! `unevaluatedItems`, annotations (`default`, `description`, `title`, `examples`, …) and any
//! keyword not named here, as JSON Schema ignores unknown keywords. The tool checks its own
//! arguments as well; this check is there to give the model a precise answer first.
//!
//! **Refused at compile time** (an error naming the keyword and where it is): a keyword named
//! above with a value of the wrong shape (`"type": 12`, `"minLength": -1`), a `$ref` that is
//! not a local JSON pointer or points nowhere, a schema nested deeper than
//! [`MAX_SCHEMA_DEPTH`] levels (counting `$ref`s), more than [`MAX_NODES`] subschemas, and a
//! schema that reaches itself again without descending into the arguments (`{"$ref": "#"}`,
//! `{"anyOf": [{"$ref": "#"}]}`), which no validator can finish.
//!
//! **Bounded at validation time:** at most [`MAX_EVAL_DEPTH`] nested subschema applications
//! and [`MAX_STEPS`] of them per call, so a hostile schema (alternatives sharing subschemas,
//! exponential to evaluate) costs a bounded amount of work; past either bound the arguments
//! are refused with a message saying so.

mod compile;
mod eval;
mod number;
#[cfg(test)]
mod tests;

use std::fmt;

use serde_json::{Number, Value};

use number::is_integer;

/// Schemas nested deeper than this (counting each `$ref` followed) are refused.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Schemas with more subschemas than this are refused.
pub const MAX_NODES: usize = 10_000;
/// At most this many subschema applications are nested while checking one call.
pub const MAX_EVAL_DEPTH: usize = 256;
/// At most this many subschema applications are made while checking one call.
pub const MAX_STEPS: usize = 250_000;
/// Values quoted in messages are cut to this many characters.
const MAX_SHOWN_CHARS: usize = 80;
/// At most this many `enum` values or property names are listed in one message.
const MAX_LISTED_NAMES: usize = 12;

/// A compiled schema: the subschemas in an arena, the root first. `$ref`s are indices, so
/// recursive schemas are cycles in the arena, not in the heap.
#[derive(Debug)]
pub struct ArgSchema {
    nodes: Vec<Node>,
}

/// Why a schema was refused; `at` is where in the schema (`#/properties/path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub at: String,
    pub keyword: String,
    pub reason: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "keyword \"{}\" at {}: {}",
            self.keyword, self.at, self.reason
        )
    }
}

impl std::error::Error for SchemaError {}

/// One violation: where in the arguments (a JSON pointer, `""` for the root) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

/// The arguments do not match: the first violations (at most the number asked for) and how
/// many were found in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub violations: Vec<Violation>,
    pub total: usize,
}

type Id = usize;

#[derive(Debug, Default)]
struct Node {
    checks: Vec<Check>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    Min,
    Max,
    ExclusiveMin,
    ExclusiveMax,
}

#[derive(Debug)]
enum Check {
    /// The `false` schema.
    Never,
    Type(Types),
    Enum(Vec<Value>),
    Const(Value),
    Bound(Bound, Number),
    MultipleOf(f64),
    /// `minLength`, `minItems`, `minProperties`.
    MinSize(Size, u64),
    /// `maxLength`, `maxItems`, `maxProperties`.
    MaxSize(Size, u64),
    UniqueItems,
    /// `prefixItems` (or draft 7's list form of `items`), then the schema for the rest.
    Items {
        prefix: Vec<Id>,
        rest: Option<Id>,
    },
    Contains {
        schema: Id,
        min: u64,
        max: Option<u64>,
    },
    Required(Vec<String>),
    /// `properties` and `additionalProperties`; `additional` is not applied when
    /// `patternProperties` is present (`unchecked_patterns`).
    Properties {
        props: Vec<(String, Id)>,
        additional: Option<Id>,
        unchecked_patterns: bool,
    },
    PropertyNames(Id),
    DependentRequired(Vec<(String, Vec<String>)>),
    DependentSchemas(Vec<(String, Id)>),
    AllOf(Vec<Id>),
    AnyOf(Vec<Id>),
    OneOf(Vec<Id>),
    /// The subschema and its text, cut, for the message.
    Not(Id, String),
    If {
        cond: Id,
        then: Option<Id>,
        otherwise: Option<Id>,
    },
    Ref(Id),
}

/// What a size keyword counts: the characters of a string (not its bytes), the items of a
/// list, the properties of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Chars,
    Items,
    Properties,
}

impl Size {
    /// The size of `v`, when `v` is of the kind counted.
    fn of(self, v: &Value) -> Option<u64> {
        let n = match (self, v) {
            (Size::Chars, Value::String(s)) => s.chars().count(),
            (Size::Items, Value::Array(a)) => a.len(),
            (Size::Properties, Value::Object(o)) => o.len(),
            _ => return None,
        };
        Some(n as u64)
    }
}

/// A set of JSON types, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Types(u8);

const TYPE_NAMES: [&str; 7] = [
    "null", "boolean", "integer", "number", "string", "array", "object",
];

impl Types {
    fn bit(name: &str) -> Option<u8> {
        TYPE_NAMES.iter().position(|n| *n == name).map(|i| 1 << i)
    }

    fn matches(self, v: &Value) -> bool {
        // Bits in the order of `TYPE_NAMES`; a whole number is an "integer" and a "number".
        let want: u8 = match v {
            Value::Null => 1,
            Value::Bool(_) => 1 << 1,
            Value::Number(n) if is_integer(n) => (1 << 2) | (1 << 3),
            Value::Number(_) => 1 << 3,
            Value::String(_) => 1 << 4,
            Value::Array(_) => 1 << 5,
            Value::Object(_) => 1 << 6,
        };
        self.0 & want != 0
    }
}

impl fmt::Display for Types {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = TYPE_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| format!("\"{n}\""))
            .collect();
        f.write_str(&names.join(" or "))
    }
}

impl ArgSchema {
    /// Compile `schema`; see the module docs for what is checked and what is refused.
    pub fn compile(schema: &Value) -> Result<ArgSchema, SchemaError> {
        Ok(ArgSchema {
            nodes: compile::compile(schema)?,
        })
    }

    /// Whether `value` matches (no message is built).
    pub fn is_valid(&self, value: &Value) -> bool {
        eval::is_valid(self, value)
    }

    /// Check `value`; `Err` holds the first `max_listed` violations and their total.
    pub fn validate(&self, value: &Value, max_listed: usize) -> Result<(), Invalid> {
        eval::validate(self, value, max_listed)
    }
}

/// A value as JSON, cut to [`MAX_SHOWN_CHARS`] characters.
fn show(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// A JSON pointer token: `~` and `/` escaped.
fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
