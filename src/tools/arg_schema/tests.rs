//! Unit tests of `arg_schema`: each keyword with its message and path, the bounds against
//! hostile schemas, and a differential property test against the `jsonschema` crate (a
//! dev-dependency): on schemas generated from the subset and values generated around them, both
//! give the same valid/invalid verdict.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn compile(schema: Value) -> ArgSchema {
    ArgSchema::compile(&schema).unwrap_or_else(|e| panic!("{schema} should compile: {e}"))
}

/// The violations as `"path: message"` lines.
fn errors(schema: &Value, value: Value) -> Vec<String> {
    match compile(schema.clone()).validate(&value, 50) {
        Ok(()) => Vec::new(),
        Err(inv) => inv
            .violations
            .into_iter()
            .map(|v| format!("{}: {}", v.path, v.message))
            .collect(),
    }
}

fn valid(schema: &Value, value: Value) -> bool {
    let s = compile(schema.clone());
    let verdict = s.is_valid(&value);
    assert_eq!(
        verdict,
        s.validate(&value, 50).is_ok(),
        "is_valid and validate disagree on {value} against {schema}"
    );
    verdict
}

fn refused(schema: Value) -> SchemaError {
    match ArgSchema::compile(&schema) {
        Ok(_) => panic!("{schema} should be refused"),
        Err(e) => e,
    }
}

#[test]
fn type_names_and_lists() {
    let s = json!({"type": "string"});
    assert!(valid(&s, json!("x")));
    assert_eq!(errors(&s, json!(5)), [": 5 is not of type \"string\""]);
    let s = json!({"type": ["string", "null"]});
    assert!(valid(&s, json!(null)));
    assert_eq!(
        errors(&s, json!([1])),
        [": [1] is not of type \"null\" or \"string\""]
    );
    // Whole numbers are integers, whatever their spelling; other numbers are not.
    let s = json!({"type": "integer"});
    assert!(valid(&s, json!(3)));
    assert!(valid(&s, json!(-3)));
    assert!(valid(&s, json!(3.0)));
    assert!(valid(&s, json!(u64::MAX)));
    assert!(!valid(&s, json!(3.5)));
    assert!(!valid(&s, json!("3")));
    let s = json!({"type": "number"});
    assert!(valid(&s, json!(3)) && valid(&s, json!(3.5)));
    assert!(!valid(&s, json!(true)));
    for t in ["boolean", "array", "object"] {
        assert!(!valid(&json!({"type": t}), json!(null)), "{t}");
    }
}

#[test]
fn nullable_adds_null_to_the_type() {
    let s = json!({"type": "string", "nullable": true});
    assert!(valid(&s, json!(null)) && valid(&s, json!("x")));
    assert!(!valid(&s, json!(1)));
    assert!(!valid(
        &json!({"type": "string", "nullable": false}),
        json!(null)
    ));
}

#[test]
fn properties_required_and_additional_properties() {
    let s = json!({
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"],
        "additionalProperties": false
    });
    assert!(valid(&s, json!({"path": "a"})));
    assert_eq!(
        errors(&s, json!({"limit": "x", "extra": 1, "more": 2})),
        [
            ": \"path\" is a required property",
            ": property \"extra\" is not allowed; the allowed properties are \"limit\", \"path\"",
            "/limit: \"x\" is not of type \"integer\"",
            ": property \"more\" is not allowed; the allowed properties are \"limit\", \"path\"",
        ]
    );
    // additionalProperties as a schema applies to the other properties, at their path.
    let s = json!({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}});
    assert!(valid(&s, json!({"a": "x", "b": 1})));
    assert_eq!(
        errors(&s, json!({"b": "x"})),
        ["/b: \"x\" is not of type \"integer\""]
    );
    assert_eq!(
        errors(&json!({"additionalProperties": false}), json!({"x": 1})),
        [": property \"x\" is not allowed: this object takes no properties"]
    );
    // A property schema of `false` forbids the property.
    assert_eq!(
        errors(&json!({"properties": {"a": false}}), json!({"a": 1})),
        ["/a: no value is allowed here"]
    );
    // Keywords for objects ignore other values.
    assert!(valid(&s, json!("not an object")));
    assert!(valid(&json!({"required": ["a"]}), json!([1])));
}

#[test]
fn pattern_properties_turn_off_the_additional_check() {
    // Which names a pattern matches is not known without a regex engine: accept them.
    let s = json!({
        "properties": {"a": {"type": "string"}},
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": false
    });
    assert!(valid(&s, json!({"a": "1", "x-1": "whatever", "other": 1})));
    assert!(!valid(&s, json!({"a": 1})));
}

#[test]
fn enum_and_const_compare_numbers_by_value() {
    let s = json!({"enum": ["error", "success", 1, {"a": [1]}]});
    assert!(valid(&s, json!("error")));
    assert!(valid(&s, json!(1.0)));
    assert!(valid(&s, json!({"a": [1.0]})));
    assert_eq!(
        errors(&s, json!("debug")),
        [": \"debug\" is not one of \"error\", \"success\", 1, {\"a\":[1]}"]
    );
    let s = json!({"const": 5});
    assert!(valid(&s, json!(5.0)));
    assert_eq!(errors(&s, json!(6)), [": 6 is not 5"]);
    assert!(!valid(&json!({"enum": []}), json!(null)));
    // No rounding through f64: 2^64 - 1 is not 2^64.
    assert!(!valid(
        &json!({"const": u64::MAX}),
        json!(18_446_744_073_709_551_616.0)
    ));
}

#[test]
fn numeric_bounds() {
    let s = json!({"minimum": 1, "maximum": 10});
    assert!(valid(&s, json!(1)) && valid(&s, json!(10)) && valid(&s, json!(5.5)));
    assert_eq!(errors(&s, json!(0)), [": 0 is less than the minimum of 1"]);
    assert_eq!(
        errors(&s, json!(10.5)),
        [": 10.5 is greater than the maximum of 10"]
    );
    let s = json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1});
    assert!(valid(&s, json!(0.5)));
    assert_eq!(
        errors(&s, json!(0)),
        [": 0 is less than or equal to the exclusive minimum of 0"]
    );
    assert_eq!(
        errors(&s, json!(1)),
        [": 1 is greater than or equal to the exclusive maximum of 1"]
    );
    // Exact across integer and float: 2^53 + 1 is above 2^53 as a float.
    let s = json!({"maximum": 9_007_199_254_740_992.0});
    assert!(!valid(&s, json!(9_007_199_254_740_993u64)));
    assert!(valid(&s, json!(9_007_199_254_740_992u64)));
    assert!(!valid(&json!({"minimum": -1}), json!(i64::MIN + 1)));
    assert!(valid(&json!({"maximum": 0.5}), json!(0)));
    assert!(!valid(&json!({"minimum": 0.5}), json!(0)));
    // Non-numbers are not checked.
    assert!(valid(&s, json!("9007199254740993")));
}

#[test]
fn draft4_boolean_exclusive_bounds() {
    let s = json!({
        "$schema": "http://json-schema.org/draft-04/schema#",
        "minimum": 0, "exclusiveMinimum": true, "maximum": 5, "exclusiveMaximum": false
    });
    assert!(!valid(&s, json!(0)));
    assert!(valid(&s, json!(5)));
    // Outside draft 4, a boolean there is a mistake.
    assert_eq!(
        refused(json!({"minimum": 0, "exclusiveMinimum": true})).keyword,
        "exclusiveMinimum"
    );
}

#[test]
fn multiple_of_reads_decimals() {
    assert!(valid(&json!({"multipleOf": 2}), json!(4)));
    assert!(valid(&json!({"multipleOf": 2}), json!(4.0)));
    assert!(valid(&json!({"multipleOf": 2}), json!(-6)));
    assert_eq!(
        errors(&json!({"multipleOf": 2}), json!(7)),
        [": 7 is not a multiple of 2"]
    );
    assert!(!valid(&json!({"multipleOf": 2}), json!(4.5)));
    assert!(valid(&json!({"multipleOf": 0.1}), json!(0.3)));
    assert!(valid(&json!({"multipleOf": 0.01}), json!(1070468.14)));
    assert!(valid(&json!({"multipleOf": 1.5}), json!(3)));
    assert!(!valid(&json!({"multipleOf": 0.1}), json!(0.35)));
    assert!(valid(&json!({"multipleOf": 0.5}), json!(0)));
    assert!(!valid(&json!({"multipleOf": 0.5}), json!(0.25)));
    // Past i128 in decimal: the exact binary reading.
    assert!(valid(&json!({"multipleOf": 0.5}), json!(1e300)));
    assert!(valid(&json!({"multipleOf": 3}), json!(u64::MAX)));
    for bad in [json!(0), json!(-1), json!("2")] {
        assert_eq!(refused(json!({"multipleOf": bad})).keyword, "multipleOf");
    }
}

#[test]
fn string_lengths_count_characters() {
    let s = json!({"minLength": 2, "maxLength": 3});
    assert!(valid(&s, json!("éé")));
    assert!(valid(&s, json!("日本語")));
    assert!(!valid(&s, json!("日本語テ")));
    assert_eq!(
        errors(&s, json!("é")),
        [": \"é\" has 1 character, fewer than the minimum of 2"]
    );
    assert_eq!(
        errors(&s, json!("abcd")),
        [": \"abcd\" has 4 characters, more than the maximum of 3"]
    );
    // A long value is cut in the message.
    let long = "x".repeat(5000);
    let e = errors(&json!({"maxLength": 10}), json!(long));
    assert!(e[0].len() < 200, "{}", e[0]);
    assert!(
        e[0].contains('…') && e[0].contains("5000 characters"),
        "{}",
        e[0]
    );
}

#[test]
fn arrays_items_prefix_items_and_counts() {
    let s = json!({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3});
    assert!(valid(&s, json!(["a"])));
    assert_eq!(
        errors(&s, json!([])),
        [": the list has 0 items, fewer than the minimum of 1"]
    );
    assert_eq!(
        errors(&s, json!(["a", 1, "b", 2])),
        [
            ": the list has 4 items, more than the maximum of 3",
            "/1: 1 is not of type \"string\"",
            "/3: 2 is not of type \"string\"",
        ]
    );
    let s = json!({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false});
    assert!(valid(&s, json!([1, "a"])));
    assert!(valid(&s, json!([1])));
    assert_eq!(
        errors(&s, json!([1, "a", null])),
        ["/2: no value is allowed here"]
    );
    // Draft 7's list form of `items`, with `additionalItems`.
    let s = json!({"items": [{"type": "integer"}], "additionalItems": {"type": "string"}});
    assert!(valid(&s, json!([1, "a", "b"])));
    assert!(!valid(&s, json!(["a"])));
    assert!(!valid(&s, json!([1, 2])));
}

#[test]
fn unique_items_and_contains() {
    let s = json!({"uniqueItems": true});
    assert!(valid(&s, json!([1, "1", [1], {"a": 1}, {"a": 2}])));
    assert_eq!(
        errors(&s, json!([1, 2, 1.0])),
        [": items 0 and 2 are equal (1); every item must be unique"]
    );
    let s = json!({"contains": {"type": "string"}});
    assert!(valid(&s, json!([1, "a"])));
    assert_eq!(
        errors(&s, json!([1, 2])),
        [": 0 items match the \"contains\" schema, fewer than the minimum of 1"]
    );
    let s = json!({"contains": {"type": "string"}, "minContains": 2, "maxContains": 3});
    assert!(valid(&s, json!(["a", "b", 1])));
    assert!(!valid(&s, json!(["a", 1])));
    assert!(!valid(&s, json!(["a", "b", "c", "d"])));
    assert!(valid(
        &json!({"contains": false, "minContains": 0}),
        json!([1])
    ));
}

#[test]
fn object_counts_property_names_and_dependencies() {
    let s = json!({"minProperties": 1, "maxProperties": 2});
    assert_eq!(
        errors(&s, json!({})),
        [": the object has 0 properties, fewer than the minimum of 1"]
    );
    assert!(!valid(&s, json!({"a": 1, "b": 2, "c": 3})));
    let s = json!({"propertyNames": {"maxLength": 3}});
    assert!(valid(&s, json!({"abc": 1})));
    assert_eq!(
        errors(&s, json!({"abcd": 1})),
        [
            ": property name \"abcd\" is not allowed: \"abcd\" has 4 characters, more than the maximum of 3"
        ]
    );
    let s = json!({"dependentRequired": {"a": ["b", "c"]}});
    assert!(valid(&s, json!({"b": 1})));
    assert_eq!(
        errors(&s, json!({"a": 1, "b": 1})),
        [": \"c\" is required when \"a\" is present"]
    );
    let s = json!({"dependentSchemas": {"a": {"required": ["b"]}}});
    assert!(valid(&s, json!({"c": 1})));
    assert!(!valid(&s, json!({"a": 1})));
    let s = json!({"dependencies": {"a": ["b"], "c": {"properties": {"d": {"type": "string"}}}}});
    assert!(!valid(&s, json!({"a": 1})));
    assert!(!valid(&s, json!({"c": 1, "d": 2})));
    assert!(valid(&s, json!({"a": 1, "b": 2, "c": 1, "d": "x"})));
}

#[test]
fn any_of_lists_why_each_alternative_failed() {
    // The nullable field pydantic writes (mcp-server-git).
    let s = json!({"properties": {"contains": {"anyOf": [{"type": "string"}, {"type": "null"}]}}});
    assert!(valid(&s, json!({"contains": null})));
    assert!(valid(&s, json!({"contains": "abc"})));
    assert_eq!(
        errors(&s, json!({"contains": 5})),
        [
            "/contains: 5 matches none of the allowed alternatives (anyOf): 1) 5 is not of type \
             \"string\"; 2) 5 is not of type \"null\""
        ]
    );
    // A deeper violation names its path.
    let s = json!({"anyOf": [{"properties": {"a": {"type": "string"}}}, {"type": "string"}]});
    let e = errors(&s, json!({"a": 1}));
    assert!(
        e[0].contains("1) at /a: 1 is not of type \"string\""),
        "{e:?}"
    );
}

#[test]
fn one_of_all_of_and_not() {
    let s = json!({"oneOf": [{"type": "integer"}, {"minimum": 2}]});
    assert!(valid(&s, json!(1)));
    assert!(valid(&s, json!(2.5)));
    assert_eq!(
        errors(&s, json!(3)),
        [": 3 matches alternatives 1 and 2 of oneOf; it must match exactly one"]
    );
    assert!(errors(&s, json!(0.5))[0].contains("matches none of the allowed alternatives (oneOf)"));
    let s = json!({"allOf": [{"type": "integer"}, {"minimum": 2}]});
    assert_eq!(
        errors(&s, json!(1.5)),
        [
            ": 1.5 is not of type \"integer\"",
            ": 1.5 is less than the minimum of 2"
        ]
    );
    let s = json!({"not": {"type": "string"}});
    assert!(valid(&s, json!(1)));
    assert_eq!(
        errors(&s, json!("x")),
        [": \"x\" must not match {\"type\":\"string\"}"]
    );
}

#[test]
fn if_then_else() {
    let s = json!({
        "if": {"properties": {"kind": {"const": "file"}}},
        "then": {"required": ["path"]},
        "else": {"required": ["url"]}
    });
    assert!(valid(&s, json!({"kind": "file", "path": "a"})));
    assert!(valid(&s, json!({"kind": "web", "url": "a"})));
    assert_eq!(
        errors(&s, json!({"kind": "file"})),
        [": \"path\" is a required property"]
    );
    assert!(!valid(&s, json!({"kind": "web"})));
    assert!(valid(&json!({"if": {"type": "string"}}), json!(1)));
}

#[test]
fn boolean_schemas_and_annotations() {
    assert!(valid(&json!(true), json!({"x": 1})));
    assert!(!valid(&json!(false), json!(null)));
    let s = json!({
        "title": "t", "description": "d", "default": 1, "examples": [1], "format": "uri",
        "pattern": "^[0-9]+$", "x-custom": {"type": "string"}, "$comment": "c",
        "unevaluatedProperties": false
    });
    // Annotations, `format`, `pattern` and unknown keywords check nothing.
    assert!(valid(&s, json!("not a uri, not digits")));
    assert!(valid(&s, json!({"a": 1})));
}

#[test]
fn local_refs_to_defs_definitions_and_root() {
    let s = json!({
        "$defs": {"name": {"type": "string", "minLength": 1}},
        "definitions": {"a~b": {"type": "integer"}, "with space": {"type": "boolean"}},
        "properties": {
            "n": {"$ref": "#/$defs/name"},
            "i": {"$ref": "#/definitions/a~0b"},
            "b": {"$ref": "#/definitions/with%20space"},
            "child": {"$ref": "#"}
        }
    });
    assert!(valid(
        &s,
        json!({"n": "x", "i": 1, "b": true, "child": {"n": "y"}})
    ));
    assert_eq!(
        errors(&s, json!({"child": {"child": {"n": ""}}})),
        ["/child/child/n: \"\" has 0 characters, fewer than the minimum of 1"]
    );
    assert!(!valid(&s, json!({"i": "1"})));
    assert!(!valid(&s, json!({"b": 1})));
    // A recursive list: a tree of nodes.
    let s = json!({
        "$ref": "#/$defs/node",
        "$defs": {"node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "additionalProperties": false
        }}
    });
    assert!(valid(&s, json!({"kids": [{"kids": []}, {}]})));
    assert_eq!(
        errors(&s, json!({"kids": [{"kids": [{"x": 1}]}]})),
        ["/kids/0/kids/0: property \"x\" is not allowed; the allowed properties are \"kids\""]
    );
}

#[test]
fn ref_siblings_apply_except_in_old_drafts() {
    let s = json!({"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 1}}});
    assert!(!valid(&s, json!({"a": "ab"})));
    let mut old = s.clone();
    old["$schema"] = json!("http://json-schema.org/draft-07/schema#");
    assert!(valid(&old, json!({"a": "ab"})));
    assert!(!valid(&old, json!({"a": 1})));
    // jsonschema agrees on both.
    for (schema, verdict) in [(&s, false), (&old, true)] {
        assert_eq!(
            jsonschema::validator_for(schema)
                .unwrap()
                .is_valid(&json!({"a": "ab"})),
            verdict
        );
    }
}

#[test]
fn paths_escape_keys() {
    let s = json!({"properties": {"a/b": {"properties": {"c~d": {"type": "string"}}}}});
    assert_eq!(
        errors(&s, json!({"a/b": {"c~d": 1}})),
        ["/a~1b/c~0d: 1 is not of type \"string\""]
    );
}

#[test]
fn bad_schemas_are_refused_naming_the_keyword() {
    for (schema, keyword) in [
        (json!({"type": 12}), "type"),
        (json!({"type": "text"}), "type"),
        (json!({"type": []}), "type"),
        (json!({"properties": {"x": {"type": 12}}}), "type"),
        (json!({"properties": {"x": 5}}), "(schema)"),
        (json!({"properties": []}), "properties"),
        (json!({"required": "path"}), "required"),
        (json!({"required": [1]}), "required"),
        (json!({"minLength": -1}), "minLength"),
        (json!({"maxItems": 1.5}), "maxItems"),
        (json!({"enum": "a"}), "enum"),
        (json!({"minimum": "1"}), "minimum"),
        (json!({"anyOf": []}), "anyOf"),
        (json!({"anyOf": {}}), "anyOf"),
        (json!({"items": 3}), "(schema)"),
        (json!({"additionalProperties": "no"}), "(schema)"),
        (json!({"$ref": "#/$defs/missing"}), "$ref"),
        (json!({"$ref": "https://example.com/schema.json"}), "$ref"),
        (json!({"$ref": "#anchor"}), "$ref"),
        (json!({"$ref": 5}), "$ref"),
        (json!({"$ref": "#/%zz"}), "$ref"),
        (json!({"$ref": "#/%+1"}), "$ref"),
        (
            json!({"dependentRequired": {"a": "b"}}),
            "dependentRequired",
        ),
        (json!({"contains": {}, "minContains": -1}), "minContains"),
    ] {
        let e = refused(schema.clone());
        assert_eq!(e.keyword, keyword, "{schema}: {e}");
    }
    let e = refused(json!({"properties": {"a": {"items": {"type": 1}}}}));
    assert_eq!(e.at, "#/properties/a/items");
    assert_eq!(
        e.to_string(),
        "keyword \"type\" at #/properties/a/items: must be a type name or a non-empty list of \
         them, not 1; the names are null, boolean, integer, number, string, array, object"
    );
}

#[test]
fn self_reference_without_descent_is_refused() {
    for schema in [
        json!({"$ref": "#"}),
        json!({"anyOf": [{"type": "string"}, {"$ref": "#"}]}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}),
        json!({"$defs": {"a": {"not": {"$ref": "#/$defs/a"}}}, "properties": {"x": {"$ref": "#/$defs/a"}}}),
        json!({"if": {"$ref": "#"}}),
    ] {
        let e = refused(schema.clone());
        assert_eq!(e.keyword, "$ref", "{schema}: {e}");
        assert!(e.reason.contains("refers to itself"), "{e}");
    }
    // Recursion through properties or items descends: fine.
    compile(json!({"properties": {"a": {"$ref": "#"}}, "items": {"$ref": "#"}}));
}

#[test]
fn deep_and_large_schemas_are_refused() {
    let mut deep = json!({"type": "string"});
    for _ in 0..(MAX_SCHEMA_DEPTH + 2) {
        deep = json!({"properties": {"a": deep}});
    }
    assert!(refused(deep).reason.contains("nested deeper"));
    // A long chain of $refs counts as depth too.
    let mut defs = serde_json::Map::new();
    for i in 0..(MAX_SCHEMA_DEPTH + 2) {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(
        format!("d{}", MAX_SCHEMA_DEPTH + 2),
        json!({"type": "string"}),
    );
    let chain = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    assert!(refused(chain).reason.contains("nested deeper"));
    let wide: serde_json::Map<String, Value> = (0..=MAX_NODES)
        .map(|i| (format!("p{i}"), json!({"type": "string"})))
        .collect();
    assert!(
        refused(json!({"properties": wide}))
            .reason
            .contains("subschemas")
    );
}

#[test]
fn an_exponential_schema_is_stopped_by_the_step_budget() {
    // Each level has two alternatives that share the next level and both fail at the bottom:
    // 2^25 paths. The budget stops it and says why.
    let levels = 25;
    let mut defs = serde_json::Map::new();
    for i in 0..levels {
        let next = format!("#/$defs/l{}", i + 1);
        defs.insert(
            format!("l{i}"),
            json!({"anyOf": [{"$ref": next}, {"allOf": [{"$ref": next}]}]}),
        );
    }
    defs.insert(format!("l{levels}"), json!({"type": "string"}));
    let s = compile(json!({"$defs": defs, "$ref": "#/$defs/l0"}));
    assert!(!s.is_valid(&json!(1)));
    let inv = s.validate(&json!(1), 20).unwrap_err();
    assert_eq!(inv.total, 1);
    assert!(
        inv.violations[0].message.contains("could not be checked"),
        "{inv:?}"
    );
    // A string still matches quickly: the first alternative succeeds at each level.
    assert!(s.is_valid(&json!("x")));
}

#[test]
fn deep_arguments_against_a_recursive_schema_are_bounded() {
    let s = compile(json!({"properties": {"a": {"$ref": "#"}}}));
    let mut v = json!({});
    for _ in 0..(MAX_EVAL_DEPTH + 5) {
        v = json!({ "a": v });
    }
    let inv = s.validate(&v, 20).unwrap_err();
    assert!(
        inv.violations[0].message.contains("nested levels"),
        "{inv:?}"
    );
    let mut ok = json!({});
    for _ in 0..100 {
        ok = json!({ "a": ok });
    }
    assert!(s.is_valid(&ok));
}

#[test]
fn violations_are_capped_and_counted() {
    let s = compile(json!({"items": {"type": "string"}}));
    let inv = s
        .validate(&json!((0..100).collect::<Vec<_>>()), 20)
        .unwrap_err();
    assert_eq!(inv.violations.len(), 20);
    assert_eq!(inv.total, 100);
    assert_eq!(inv.violations[19].path, "/19");
}

// ---------------------------------------------------------------------------------------------
// Differential property test against the `jsonschema` crate.

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS.to_vec()).prop_map(String::from)
}

/// Values near the schemas' constants: small integers, floats that test `multipleOf` and
/// integer-ness, short strings with multi-byte characters, and the same keys as the schemas.
fn small_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-4i64..12).prop_map(|n| json!(n)),
        prop::sample::select(vec![
            0.5, 1.0, 2.5, -1.5, 0.3, 0.1, 3.0, 1e20, 0.25, 4.5, -0.0
        ])
        .prop_map(|f| json!(f)),
        "[abé😀]{0,4}".prop_map(Value::String),
        key().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..10).prop_map(|n| json!(n)),
        prop::sample::select(vec![0.5, 2.5, -1.5, 1.0, 0.3]).prop_map(|f| json!(f)),
    ]
}

fn type_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(TYPE_NAMES.to_vec())
}

/// Keywords without subschemas (no `$ref`: the `$defs` themselves are made of these).
fn leaf_keyword() -> impl Strategy<Value = Value> {
    prop_oneof![
        type_name().prop_map(|t| json!({ "type": t })),
        prop::collection::btree_set(type_name(), 1..3).prop_map(|ts| json!({ "type": ts })),
        prop::collection::vec(small_value(), 0..4).prop_map(|vs| json!({ "enum": vs })),
        small_value().prop_map(|v| json!({ "const": v })),
        (
            prop::sample::select(vec![
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum"
            ]),
            number()
        )
            .prop_map(|(k, n)| json!({ k: n })),
        prop::sample::select(vec![
            json!(0.5),
            json!(2),
            json!(3),
            json!(0.1),
            json!(0.25),
            json!(1.5)
        ])
        .prop_map(|d| json!({ "multipleOf": d })),
        (
            prop::sample::select(vec![
                "minLength",
                "maxLength",
                "minItems",
                "maxItems",
                "minProperties",
                "maxProperties"
            ]),
            0u64..4
        )
            .prop_map(|(k, n)| json!({ k: n })),
        Just(json!({"uniqueItems": true})),
        prop::collection::btree_set(key(), 0..3).prop_map(|ks| json!({ "required": ks })),
        (key(), prop::collection::btree_set(key(), 0..3))
            .prop_map(|(k, ks)| json!({"dependentRequired": { k: ks }})),
    ]
}

fn leaf_schema() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(json!(true)),
        1 => Just(json!(false)),
        1 => Just(json!({})),
        12 => leaf_keyword(),
        1 => Just(json!({"$ref": "#/$defs/d"})),
        1 => Just(json!({"$ref": "#/definitions/e"})),
    ]
}

/// Two schemas as one: their keywords together when both are objects without a common
/// keyword, else both under `allOf`.
fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut x), Value::Object(y)) if y.keys().all(|k| !x.contains_key(k)) => {
            x.extend(y);
            Value::Object(x)
        }
        (a, b) => json!({"allOf": [a, b]}),
    }
}

fn schema() -> impl Strategy<Value = Value> {
    leaf_schema().prop_recursive(3, 20, 3, |inner| {
        let additional = prop_oneof![
            Just(None),
            any::<bool>().prop_map(|b| Some(json!(b))),
            inner.clone().prop_map(Some),
        ];
        prop_oneof![
            (
                prop::collection::btree_map(key(), inner.clone(), 0..3),
                additional
            )
                .prop_map(|(props, additional)| {
                    let mut s = json!({ "properties": props });
                    if let Some(a) = additional {
                        s["additionalProperties"] = a;
                    }
                    s
                }),
            inner.clone().prop_map(|s| json!({ "items": s })),
            (
                prop::collection::vec(inner.clone(), 1..3),
                prop::option::of(inner.clone())
            )
                .prop_map(|(prefix, rest)| {
                    let mut s = json!({ "prefixItems": prefix });
                    if let Some(r) = rest {
                        s["items"] = r;
                    }
                    s
                }),
            (
                prop::sample::select(vec!["anyOf", "oneOf", "allOf"]),
                prop::collection::vec(inner.clone(), 1..3)
            )
                .prop_map(|(k, list)| json!({ k: list })),
            inner.clone().prop_map(|s| json!({ "not": s })),
            (
                inner.clone(),
                prop::option::of(inner.clone()),
                prop::option::of(inner.clone())
            )
                .prop_map(|(i, t, e)| {
                    let mut s = json!({ "if": i });
                    if let Some(t) = t {
                        s["then"] = t;
                    }
                    if let Some(e) = e {
                        s["else"] = e;
                    }
                    s
                }),
            (
                inner.clone(),
                prop::option::of(0u64..3),
                prop::option::of(0u64..3)
            )
                .prop_map(|(c, min, max)| {
                    let mut s = json!({ "contains": c });
                    if let Some(n) = min {
                        s["minContains"] = json!(n);
                    }
                    if let Some(n) = max {
                        s["maxContains"] = json!(n);
                    }
                    s
                }),
            inner.clone().prop_map(|s| json!({ "propertyNames": s })),
            (key(), inner.clone()).prop_map(|(k, s)| json!({"dependentSchemas": { k: s }})),
            (inner.clone(), inner).prop_map(|(a, b)| merge(a, b)),
        ]
    })
}

/// A root schema: `schema()` with the `$defs/d` and `definitions/e` its `$ref`s point to.
fn root_schema() -> impl Strategy<Value = Value> {
    (schema(), leaf_keyword(), leaf_keyword()).prop_map(|(s, d, e)| {
        let mut root = match s {
            Value::Object(m) if !m.contains_key("$defs") => Value::Object(m),
            other => json!({ "allOf": [other] }),
        };
        root["$defs"] = json!({ "d": d });
        root["definitions"] = json!({ "e": e });
        root
    })
}

/// Values for a schema: arbitrary ones, and ones built from the keys and constants it names.
fn value_for() -> impl Strategy<Value = Value> {
    prop_oneof![3 => small_value(), 1 => crate::proptest_json::any_json()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// The verdict equals jsonschema's (draft 2020-12), on schemas of the subset and values
    /// around them; every violation's path points into the value.
    #[test]
    fn verdict_equals_jsonschema(schema in root_schema(), values in prop::collection::vec(value_for(), 1..6)) {
        let theirs = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&schema)
            .map_err(|e| TestCaseError::fail(format!("jsonschema refuses {schema}: {e}")))?;
        let ours = ArgSchema::compile(&schema)
            .map_err(|e| TestCaseError::fail(format!("we refuse {schema}: {e}")))?;
        for value in &values {
            let verdict = ours.is_valid(value);
            prop_assert_eq!(
                verdict,
                theirs.is_valid(value),
                "schema {} value {}",
                schema,
                value
            );
            match ours.validate(value, 20) {
                Ok(()) => prop_assert!(verdict),
                Err(inv) => {
                    prop_assert!(!verdict);
                    prop_assert!(!inv.violations.is_empty());
                    for v in &inv.violations {
                        prop_assert!(value.pointer(&v.path).is_some(), "{} in {}", v.path, value);
                    }
                }
            }
        }
    }
}
