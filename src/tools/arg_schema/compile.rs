//! Compiling a schema into the arena of checks: keywords read in a fixed order, `$ref`s
//! resolved to nodes (memoised by location, so recursion is a cycle of indices), and the
//! bounds on depth, size and self-reference enforced.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};

use super::{
    Bound, Check, Id, MAX_NODES, MAX_SCHEMA_DEPTH, Node, SchemaError, Size, TYPE_NAMES, Types,
    escape_pointer, show,
};

/// The arena of `schema`, its root first.
pub(super) fn compile(schema: &Value) -> Result<Vec<Node>, SchemaError> {
    let dialect = schema.get("$schema").and_then(Value::as_str).unwrap_or("");
    let mut c = Compiler {
        root: schema,
        legacy: ["draft-04", "draft-06", "draft-07"]
            .iter()
            .any(|d| dialect.contains(d)),
        draft4: dialect.contains("draft-04"),
        nodes: Vec::new(),
        pointers: Vec::new(),
        by_pointer: HashMap::new(),
    };
    c.compile(schema, "#".to_string(), 0)?;
    c.refuse_cycles()?;
    Ok(c.nodes)
}

/// The size keywords: what each counts, and whether it is a minimum. `minContains` and
/// `maxContains` are read with `contains`.
const SIZES: [(&str, Size, bool); 6] = [
    ("minLength", Size::Chars, true),
    ("maxLength", Size::Chars, false),
    ("minItems", Size::Items, true),
    ("maxItems", Size::Items, false),
    ("minProperties", Size::Properties, true),
    ("maxProperties", Size::Properties, false),
];

struct Compiler<'a> {
    root: &'a Value,
    /// Draft 4, 6 or 7: `$ref` replaces its siblings.
    legacy: bool,
    /// Draft 4: `exclusiveMinimum`/`exclusiveMaximum` are booleans.
    draft4: bool,
    nodes: Vec<Node>,
    /// The schema location of each node, for errors.
    pointers: Vec<String>,
    /// Nodes by schema location, so a `$ref` to a place compiled before (or being compiled:
    /// recursion) reuses its node.
    by_pointer: HashMap<String, Id>,
}

fn err(at: &str, keyword: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError {
        at: at.to_string(),
        keyword: keyword.to_string(),
        reason: reason.into(),
    }
}

/// A keyword whose value has the wrong shape.
fn wrong(at: &str, keyword: &str, expected: &str, v: &Value) -> SchemaError {
    err(at, keyword, format!("must be {expected}, not {}", show(v)))
}

impl<'a> Compiler<'a> {
    /// Compile the schema at `pointer` (a `#`-prefixed JSON pointer), or return its node.
    fn compile(
        &mut self,
        schema: &'a Value,
        pointer: String,
        depth: usize,
    ) -> Result<Id, SchemaError> {
        if let Some(&id) = self.by_pointer.get(&pointer) {
            return Ok(id);
        }
        if depth > MAX_SCHEMA_DEPTH {
            let why = format!(
                "the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels (counting $ref); \
                 flatten it"
            );
            return Err(err(&pointer, "$ref", why));
        }
        if self.nodes.len() >= MAX_NODES {
            let why = format!("the schema has more than {MAX_NODES} subschemas; make it smaller");
            return Err(err(&pointer, "$ref", why));
        }
        let id = self.nodes.len();
        self.nodes.push(Node::default());
        self.pointers.push(pointer.clone());
        self.by_pointer.insert(pointer.clone(), id);
        let checks = match schema {
            Value::Bool(true) => Vec::new(),
            Value::Bool(false) => vec![Check::Never],
            Value::Object(obj) => self.keywords(obj, &pointer, depth)?,
            other => return Err(wrong(&pointer, "(schema)", "an object or a boolean", other)),
        };
        self.nodes[id].checks = checks;
        Ok(id)
    }

    /// The subschema under `keyword` (and `key`, for a member of a list or map).
    fn sub(
        &mut self,
        s: &'a Value,
        at: &str,
        keyword: &str,
        key: Option<&str>,
        depth: usize,
    ) -> Result<Id, SchemaError> {
        let mut pointer = format!("{at}/{}", escape_pointer(keyword));
        if let Some(key) = key {
            pointer.push('/');
            pointer.push_str(&escape_pointer(key));
        }
        self.compile(s, pointer, depth + 1)
    }

    /// The subschema under `keyword` in `obj`, if there is one.
    fn sub_at(
        &mut self,
        obj: &'a Map<String, Value>,
        at: &str,
        keyword: &str,
        depth: usize,
    ) -> Result<Option<Id>, SchemaError> {
        obj.get(keyword)
            .map(|s| self.sub(s, at, keyword, None, depth))
            .transpose()
    }

    /// A list of subschemas; `non_empty` for `allOf`/`anyOf`/`oneOf`.
    fn sub_list(
        &mut self,
        v: &'a Value,
        at: &str,
        keyword: &str,
        non_empty: bool,
        depth: usize,
    ) -> Result<Vec<Id>, SchemaError> {
        match v.as_array() {
            Some(list) if !(non_empty && list.is_empty()) => list
                .iter()
                .enumerate()
                .map(|(i, s)| self.sub(s, at, keyword, Some(&i.to_string()), depth))
                .collect(),
            _ => Err(wrong(at, keyword, "a non-empty list of schemas", v)),
        }
    }

    fn sub_map(
        &mut self,
        v: &'a Value,
        at: &str,
        keyword: &str,
        depth: usize,
    ) -> Result<Vec<(String, Id)>, SchemaError> {
        let Some(map) = v.as_object() else {
            return Err(wrong(at, keyword, "an object of schemas", v));
        };
        map.iter()
            .map(|(k, s)| Ok((k.clone(), self.sub(s, at, keyword, Some(k), depth)?)))
            .collect()
    }

    fn keywords(
        &mut self,
        obj: &'a Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<Vec<Check>, SchemaError> {
        let mut checks = Vec::new();
        if let Some(r) = obj.get("$ref") {
            checks.push(Check::Ref(self.reference(r, at, depth)?));
            if self.legacy {
                return Ok(checks);
            }
        }
        if let Some(t) = obj.get("type") {
            let mut types = parse_types(t).map_err(|reason| err(at, "type", reason))?;
            if obj.get("nullable") == Some(&Value::Bool(true)) {
                types.0 |= Types::bit("null").unwrap_or(0);
            }
            checks.push(Check::Type(types));
        }
        if let Some(v) = obj.get("enum") {
            let list = v
                .as_array()
                .ok_or_else(|| wrong(at, "enum", "a list of values", v))?;
            checks.push(Check::Enum(list.clone()));
        }
        if let Some(v) = obj.get("const") {
            checks.push(Check::Const(v.clone()));
        }
        self.bounds(obj, at, &mut checks)?;
        if let Some(v) = obj.get("multipleOf") {
            match v.as_f64() {
                Some(d) if d > 0.0 => checks.push(Check::MultipleOf(d)),
                _ => return Err(wrong(at, "multipleOf", "a number above 0", v)),
            }
        }
        for (keyword, size, min) in SIZES {
            match count(obj, at, keyword)? {
                Some(0) if min => {}
                Some(n) if min => checks.push(Check::MinSize(size, n)),
                Some(n) => checks.push(Check::MaxSize(size, n)),
                None => {}
            }
        }
        if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
            checks.push(Check::UniqueItems);
        }
        self.items(obj, at, depth, &mut checks)?;
        if let Some(schema) = self.sub_at(obj, at, "contains", depth)? {
            let min = count(obj, at, "minContains")?.unwrap_or(1);
            let max = count(obj, at, "maxContains")?;
            checks.push(Check::Contains { schema, min, max });
        }
        if let Some(v) = obj.get("required") {
            let names =
                strings(v).ok_or_else(|| wrong(at, "required", "a list of property names", v))?;
            checks.push(Check::Required(names));
        }
        self.properties(obj, at, depth, &mut checks)?;
        if let Some(id) = self.sub_at(obj, at, "propertyNames", depth)? {
            checks.push(Check::PropertyNames(id));
        }
        if let Some(v) = obj.get("dependentRequired") {
            let deps = dependent_names(v).ok_or_else(|| {
                wrong(
                    at,
                    "dependentRequired",
                    "an object of lists of property names",
                    v,
                )
            })?;
            checks.push(Check::DependentRequired(deps));
        }
        if let Some(v) = obj.get("dependentSchemas") {
            checks.push(Check::DependentSchemas(self.sub_map(
                v,
                at,
                "dependentSchemas",
                depth,
            )?));
        }
        if let Some(v) = obj.get("dependencies") {
            self.dependencies(v, at, depth, &mut checks)?;
        }
        for keyword in ["allOf", "anyOf", "oneOf"] {
            if let Some(v) = obj.get(keyword) {
                let ids = self.sub_list(v, at, keyword, true, depth)?;
                checks.push(match keyword {
                    "allOf" => Check::AllOf(ids),
                    "anyOf" => Check::AnyOf(ids),
                    _ => Check::OneOf(ids),
                });
            }
        }
        if let Some(id) = self.sub_at(obj, at, "not", depth)? {
            checks.push(Check::Not(id, obj.get("not").map(show).unwrap_or_default()));
        }
        if let Some(cond) = self.sub_at(obj, at, "if", depth)? {
            let then = self.sub_at(obj, at, "then", depth)?;
            let otherwise = self.sub_at(obj, at, "else", depth)?;
            checks.push(Check::If {
                cond,
                then,
                otherwise,
            });
        }
        Ok(checks)
    }

    fn bounds(
        &self,
        obj: &Map<String, Value>,
        at: &str,
        checks: &mut Vec<Check>,
    ) -> Result<(), SchemaError> {
        let number = |k: &str| -> Result<Option<Number>, SchemaError> {
            match obj.get(k) {
                None => Ok(None),
                Some(Value::Number(n)) => Ok(Some(n.clone())),
                // Draft 4: `"exclusiveMinimum": true` makes `minimum` exclusive (read below).
                Some(Value::Bool(_)) if self.draft4 && k.starts_with("exclusive") => Ok(None),
                Some(v) => Err(wrong(at, k, "a number", v)),
            }
        };
        let draft4_flag = |k: &str| self.draft4 && obj.get(k) == Some(&Value::Bool(true));
        let plain = [
            (
                "minimum",
                Bound::Min,
                draft4_flag("exclusiveMinimum").then_some(Bound::ExclusiveMin),
            ),
            (
                "maximum",
                Bound::Max,
                draft4_flag("exclusiveMaximum").then_some(Bound::ExclusiveMax),
            ),
            ("exclusiveMinimum", Bound::ExclusiveMin, None),
            ("exclusiveMaximum", Bound::ExclusiveMax, None),
        ];
        for (keyword, bound, draft4) in plain {
            if let Some(n) = number(keyword)? {
                checks.push(Check::Bound(draft4.unwrap_or(bound), n));
            }
        }
        Ok(())
    }

    fn items(
        &mut self,
        obj: &'a Map<String, Value>,
        at: &str,
        depth: usize,
        checks: &mut Vec<Check>,
    ) -> Result<(), SchemaError> {
        let (prefix, rest) = match (obj.get("prefixItems"), obj.get("items")) {
            // Drafts up to 2019-09: a list under `items` is the tuple, `additionalItems` the rest.
            (_, Some(list @ Value::Array(_))) => (
                self.sub_list(list, at, "items", false, depth)?,
                self.sub_at(obj, at, "additionalItems", depth)?,
            ),
            (Some(list), _) => (
                self.sub_list(list, at, "prefixItems", false, depth)?,
                self.sub_at(obj, at, "items", depth)?,
            ),
            (None, Some(_)) => (Vec::new(), self.sub_at(obj, at, "items", depth)?),
            (None, None) => return Ok(()),
        };
        checks.push(Check::Items { prefix, rest });
        Ok(())
    }

    fn properties(
        &mut self,
        obj: &'a Map<String, Value>,
        at: &str,
        depth: usize,
        checks: &mut Vec<Check>,
    ) -> Result<(), SchemaError> {
        let props = match obj.get("properties") {
            Some(v) => self.sub_map(v, at, "properties", depth)?,
            None => Vec::new(),
        };
        let additional = self.sub_at(obj, at, "additionalProperties", depth)?;
        if let Some(v) = obj.get("patternProperties")
            && !v.is_object()
        {
            return Err(wrong(at, "patternProperties", "an object of schemas", v));
        }
        if !props.is_empty() || additional.is_some() {
            checks.push(Check::Properties {
                props,
                additional,
                unchecked_patterns: obj.contains_key("patternProperties"),
            });
        }
        Ok(())
    }

    /// Drafts 4–7's `dependencies`: per property, a list of names (as `dependentRequired`) or
    /// a schema (as `dependentSchemas`).
    fn dependencies(
        &mut self,
        v: &'a Value,
        at: &str,
        depth: usize,
        checks: &mut Vec<Check>,
    ) -> Result<(), SchemaError> {
        let Some(map) = v.as_object() else {
            return Err(wrong(at, "dependencies", "an object", v));
        };
        let mut names = Vec::new();
        let mut schemas = Vec::new();
        for (k, d) in map {
            if d.is_array() {
                let list = strings(d)
                    .ok_or_else(|| wrong(at, "dependencies", "a list of property names", d))?;
                names.push((k.clone(), list));
            } else {
                schemas.push((k.clone(), self.sub(d, at, "dependencies", Some(k), depth)?));
            }
        }
        checks.push(Check::DependentRequired(names));
        checks.push(Check::DependentSchemas(schemas));
        Ok(())
    }

    /// Resolve a `$ref` (a JSON pointer into the same document, as a URI fragment) and compile
    /// its target.
    fn reference(&mut self, r: &Value, at: &str, depth: usize) -> Result<Id, SchemaError> {
        let refuse = |why: &str| err(at, "$ref", format!("{} {why}", show(r)));
        let text = r.as_str().ok_or_else(|| wrong(at, "$ref", "a string", r))?;
        let fragment = text.strip_prefix('#').ok_or_else(|| {
            refuse(
                "is not supported: only references inside the same schema are \
                 (\"#/$defs/name\", \"#/definitions/name\")",
            )
        })?;
        let fragment =
            percent_decode(fragment).ok_or_else(|| refuse("is not a valid URI fragment"))?;
        if !fragment.is_empty() && !fragment.starts_with('/') {
            return Err(refuse(
                "is not supported: anchors are not; use a JSON pointer like \"#/$defs/name\"",
            ));
        }
        let mut target = self.root;
        let mut pointer = "#".to_string();
        for token in fragment.split('/').skip(1) {
            let token = token.replace("~1", "/").replace("~0", "~");
            target = match target {
                Value::Object(m) => m.get(&token),
                Value::Array(a) => token.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| refuse("points to nothing in the schema"))?;
            pointer.push('/');
            pointer.push_str(&escape_pointer(&token));
        }
        self.compile(target, pointer, depth + 1)
    }

    /// Refuse a schema that reaches a subschema again at the same place in the arguments
    /// (through `$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else` or
    /// `dependentSchemas`): checking it would never end.
    fn refuse_cycles(&self) -> Result<(), SchemaError> {
        let edges: Vec<Vec<Id>> = self.nodes.iter().map(same_place_edges).collect();
        // 0 = not visited, 1 = on the current path, 2 = done.
        let mut state = vec![0u8; self.nodes.len()];
        for start in 0..self.nodes.len() {
            if state[start] != 0 {
                continue;
            }
            // Depth-first without recursion: (node, index of the next edge to follow).
            let mut stack = vec![(start, 0usize)];
            state[start] = 1;
            while let Some((node, next)) = stack.last_mut() {
                let Some(&to) = edges[*node].get(*next) else {
                    state[*node] = 2;
                    stack.pop();
                    continue;
                };
                *next += 1;
                match state[to] {
                    0 => {
                        state[to] = 1;
                        stack.push((to, 0));
                    }
                    1 => {
                        return Err(err(
                            &self.pointers[to],
                            "$ref",
                            "the schema refers to itself without descending into the \
                             arguments, so no value can be checked against it",
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// The subschemas a node applies to the same value it is checking.
fn same_place_edges(node: &Node) -> Vec<Id> {
    let mut out = Vec::new();
    for c in &node.checks {
        match c {
            Check::Ref(id) | Check::Not(id, _) => out.push(*id),
            Check::AllOf(ids) | Check::AnyOf(ids) | Check::OneOf(ids) => out.extend(ids),
            Check::If {
                cond,
                then,
                otherwise,
            } => {
                out.push(*cond);
                out.extend(then);
                out.extend(otherwise);
            }
            Check::DependentSchemas(list) => out.extend(list.iter().map(|(_, id)| *id)),
            _ => {}
        }
    }
    out
}

fn parse_types(t: &Value) -> Result<Types, String> {
    let names = TYPE_NAMES.join(", ");
    let list: Vec<&Value> = match t {
        Value::String(_) => vec![t],
        Value::Array(list) if !list.is_empty() => list.iter().collect(),
        other => {
            return Err(format!(
                "must be a type name or a non-empty list of them, not {}; the names are {names}",
                show(other)
            ));
        }
    };
    let mut bits = 0u8;
    for n in list {
        bits |= n
            .as_str()
            .and_then(Types::bit)
            .ok_or_else(|| format!("{} is not a type name; the names are {names}", show(n)))?;
    }
    Ok(Types(bits))
}

/// The count under `keyword`: a whole number ≥ 0 (`2` or `2.0`).
fn count(obj: &Map<String, Value>, at: &str, keyword: &str) -> Result<Option<u64>, SchemaError> {
    let Some(v) = obj.get(keyword) else {
        return Ok(None);
    };
    let n = v.as_number().and_then(|n| {
        n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
                .map(|f| f as u64)
        })
    });
    n.map(Some)
        .ok_or_else(|| wrong(at, keyword, "a whole number ≥ 0", v))
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn dependent_names(v: &Value) -> Option<Vec<(String, Vec<String>)>> {
    v.as_object()?
        .iter()
        .map(|(k, d)| Some((k.clone(), strings(d)?)))
        .collect()
}

/// `%XX` escapes of a URI fragment; `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
