//! Tool schemas as a provider's grammar accepts them (SPEC §4 `schema_keywords`,
//! `schema_max_length`). llama.cpp (and Ollama, which runs it) turns a tool's JSON Schema into
//! a grammar and refuses the whole request when it cannot: a string bound of 2,000 or more
//! (`maxLength: 2000`), a schema written as `false`, a `$ref` it cannot resolve. [`reduce`]
//! only ever relaxes a schema — it removes keywords and bounds, inlines local references — so
//! every call valid under the full schema stays valid under the reduced one; agentd checks
//! each call against the full schema (`tools::arg_schema`), so the bound still holds.

use serde_json::{Map, Value};

use crate::config::ToolSchemaDialect;

/// A tool definition's description from outside (an MCP server, a compatible endpoint's
/// client), in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 8 * 1024;
/// A tool definition's input schema from outside, serialised, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;

/// How deep local `$ref`s are inlined; a deeper (or recursive) reference becomes `{}`.
const MAX_INLINE_DEPTH: usize = 16;

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
];
/// Keywords whose value is a list of subschemas.
const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Bounds on a string's length (a grammar repeats a character that many times).
const LENGTHS: &[&str] = &["minLength", "maxLength"];

/// The memo tag of a dialect's tool JSON (`tool_memo::finish_body`): 0 for the full one.
pub fn tag(dialect: &ToolSchemaDialect) -> u64 {
    use std::hash::{Hash, Hasher};
    if dialect.is_full() {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dialect.hash(&mut h);
    h.finish() | 1
}

/// `schema` as `dialect` accepts it, borrowed when the dialect is the full one.
pub fn for_dialect<'a>(
    schema: &'a Value,
    dialect: &ToolSchemaDialect,
) -> std::borrow::Cow<'a, Value> {
    if dialect.is_full() {
        std::borrow::Cow::Borrowed(schema)
    } else {
        std::borrow::Cow::Owned(reduce(schema, dialect))
    }
}

/// `schema` as `dialect` accepts it. The full dialect returns it unchanged.
pub fn reduce(schema: &Value, dialect: &ToolSchemaDialect) -> Value {
    if dialect.is_full() {
        return schema.clone();
    }
    let inline = dialect
        .keywords
        .as_ref()
        .is_some_and(|k| !k.iter().any(|k| k == "$ref"));
    Reducer {
        dialect,
        root: schema,
        inline,
    }
    .schema(schema, 0)
}

struct Reducer<'a> {
    dialect: &'a ToolSchemaDialect,
    root: &'a Value,
    /// Whether local references are inlined (the dialect has no `$ref`).
    inline: bool,
}

impl Reducer<'_> {
    fn keeps(&self, keyword: &str) -> bool {
        self.dialect
            .keywords
            .as_ref()
            .is_none_or(|k| k.iter().any(|k| k == keyword))
    }

    /// One (sub)schema; `depth` counts inlined references.
    fn schema(&self, v: &Value, depth: usize) -> Value {
        let Value::Object(map) = v else {
            // `true` accepts anything, as `{}` does; `false` is handled by the keyword that
            // holds it (see `object`).
            return Value::Object(Map::new());
        };
        if self.inline
            && let Some(Value::String(r)) = map.get("$ref")
        {
            return match (depth < MAX_INLINE_DEPTH).then(|| resolve(self.root, r)) {
                Some(Some(target)) => self.schema(target, depth + 1),
                // Unresolvable, remote or too deep: any value (agentd checks the real one).
                _ => Value::Object(Map::new()),
            };
        }
        let mut out = Map::new();
        for (k, v) in map {
            if !self.keeps(k) || (self.inline && matches!(k.as_str(), "$defs" | "definitions")) {
                continue;
            }
            if LENGTHS.contains(&k.as_str()) && self.too_long(v) {
                continue;
            }
            if k == "pattern" && v.as_str().is_some_and(|p| self.repeats_too_much(p)) {
                continue;
            }
            let kept = if ONE.contains(&k.as_str()) {
                match v {
                    // `additionalProperties: false` is understood; elsewhere a `false` schema
                    // is not, and leaving the keyword out only relaxes.
                    Value::Bool(false) if k == "additionalProperties" => Some(v.clone()),
                    Value::Bool(false) => None,
                    _ => Some(self.schema(v, depth)),
                }
            } else if LIST.contains(&k.as_str()) {
                v.as_array()
                    .map(|a| Value::Array(a.iter().map(|s| self.schema(s, depth)).collect()))
            } else if MAP.contains(&k.as_str()) {
                v.as_object().map(|m| {
                    Value::Object(
                        m.iter()
                            .map(|(name, s)| (name.clone(), self.schema(s, depth)))
                            .collect(),
                    )
                })
            } else {
                Some(v.clone())
            };
            if let Some(kept) = kept {
                out.insert(k.clone(), kept);
            }
        }
        Value::Object(out)
    }

    fn too_long(&self, v: &Value) -> bool {
        match (self.dialect.max_length, v.as_u64()) {
            (Some(max), Some(n)) => n > max,
            (Some(_), None) => v.is_number(),
            (None, _) => false,
        }
    }

    /// Whether a regex repeats something more often than `max_length` (`{n}`, `{n,m}`).
    fn repeats_too_much(&self, pattern: &str) -> bool {
        let Some(max) = self.dialect.max_length else {
            return false;
        };
        pattern.split('{').skip(1).any(|rest| {
            rest.split('}').next().is_some_and(|inner| {
                inner
                    .split(',')
                    .filter_map(|n| n.trim().parse::<u64>().ok())
                    .any(|n| n > max)
            })
        })
    }
}

/// A local reference (`#`, `#/$defs/x`, `#/definitions/x`, any JSON pointer) in `root`.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn llamacpp() -> ToolSchemaDialect {
        let keywords: Vec<String> = [
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "allOf",
            "description",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "pattern",
            "format",
            "default",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        ToolSchemaDialect {
            keywords: Some(Arc::from(keywords)),
            max_length: Some(1999),
        }
    }

    #[test]
    fn the_full_dialect_changes_nothing() {
        let s =
            json!({"type": "object", "properties": {"q": {"type": "string", "maxLength": 2000}}});
        assert_eq!(reduce(&s, &ToolSchemaDialect::default()), s);
    }

    #[test]
    fn long_string_bounds_and_unknown_keywords_go_smaller_ones_stay() {
        let s = json!({
            "type": "object",
            "properties": {
                "q": {"type": "string", "maxLength": 2000, "minLength": 1},
                "n": {"type": "integer", "multipleOf": 2, "maximum": 5},
                "p": {"type": "string", "pattern": "^[a-z]{1,3000}$"},
                "ok": {"type": "string", "pattern": "^[a-z]{1,30}$"}
            },
            "required": ["q"],
            "x-vendor": true
        });
        assert_eq!(
            reduce(&s, &llamacpp()),
            json!({
                "type": "object",
                "properties": {
                    "q": {"type": "string", "minLength": 1},
                    "n": {"type": "integer", "maximum": 5},
                    "p": {"type": "string"},
                    "ok": {"type": "string", "pattern": "^[a-z]{1,30}$"}
                },
                "required": ["q"]
            })
        );
    }

    #[test]
    fn references_are_inlined_and_recursion_ends() {
        let s = json!({
            "type": "object",
            "$defs": {"name": {"type": "string", "maxLength": 5000}},
            "properties": {
                "a": {"$ref": "#/$defs/name"},
                "self": {"$ref": "#"},
                "gone": {"$ref": "https://example.com/s.json"},
                "list": {"type": "array", "items": false, "prefixItems": [{"type": "string"}]}
            }
        });
        let r = reduce(&s, &llamacpp());
        assert_eq!(r["properties"]["a"], json!({"type": "string"}));
        assert_eq!(r["properties"]["gone"], json!({}));
        assert!(r.get("$defs").is_none());
        assert_eq!(r["properties"]["list"], json!({"type": "array"}));
        // The recursive reference is inlined a bounded number of times.
        let text = r.to_string();
        assert!(!text.contains("$ref"), "{text}");
        assert!(text.len() < 100_000);
    }

    fn arb_schema() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({"type": "string"})),
            (0u64..4000).prop_map(|n| json!({"type": "string", "maxLength": n})),
            (0u64..4000).prop_map(|n| json!({"type": "string", "minLength": n % 5})),
            Just(json!({"type": "integer", "minimum": 0, "multipleOf": 3})),
            Just(json!({"enum": ["a", "b"]})),
            Just(json!(true)),
            Just(json!({"not": {"type": "null"}})),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::btree_map("[a-c]", inner.clone(), 0..3).prop_map(|m| {
                    let required: Vec<&String> = m.keys().take(1).collect();
                    json!({"type": "object", "properties": m, "required": required})
                }),
                inner
                    .clone()
                    .prop_map(|s| json!({"type": "array", "items": s, "maxItems": 3})),
                proptest::collection::vec(inner, 1..3).prop_map(|v| json!({"anyOf": v})),
            ]
        })
    }

    proptest! {
        /// A reduced schema keeps only the dialect's keywords and bounds, and accepts every
        /// value the full one accepts (checked with the daemon's own validator).
        #[test]
        fn reduction_only_relaxes(schema in arb_schema(), value in crate::proptest_json::any_json()) {
            let dialect = llamacpp();
            let reduced = reduce(&schema, &dialect);
            let text = reduced.to_string();
            prop_assert!(!text.contains("multipleOf") && !text.contains("\"not\""), "{}", text);
            fn bounds_ok(v: &Value) -> bool {
                match v {
                    Value::Object(m) => m.iter().all(|(k, v)| {
                        (!LENGTHS.contains(&k.as_str()) || v.as_u64().is_some_and(|n| n <= 1999))
                            && bounds_ok(v)
                    }),
                    Value::Array(a) => a.iter().all(bounds_ok),
                    _ => true,
                }
            }
            prop_assert!(bounds_ok(&reduced), "{}", text);
            let full = crate::tools::arg_schema::ArgSchema::compile(&schema);
            let relaxed = crate::tools::arg_schema::ArgSchema::compile(&reduced);
            if let (Ok(full), Ok(relaxed)) = (full, relaxed)
                && full.validate(&value, 4).is_ok()
            {
                prop_assert!(relaxed.validate(&value, 4).is_ok(), "{} accepts {} but {} does not", schema, value, reduced);
            }
        }
    }
}
