//! Checking a value against a compiled schema: every check of a node, in order; with a
//! collecting sink each violation is recorded at its path (its message built only when it is
//! listed), with a verdict-only sink the first failure ends the work. Depth and steps are
//! counted against [`MAX_EVAL_DEPTH`] and [`MAX_STEPS`].

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::number::{cmp_numbers, is_multiple_of, json_eq};
use super::{
    ArgSchema, Bound, Check, Id, Invalid, MAX_EVAL_DEPTH, MAX_LISTED_NAMES, MAX_STEPS, Size,
    Violation, escape_pointer, show,
};

pub(super) fn is_valid(schema: &ArgSchema, value: &Value) -> bool {
    let mut e = Eval::new(schema, 0, 0);
    e.node(0, value, &mut Sink::Verdict) && !e.exhausted
}

pub(super) fn validate(
    schema: &ArgSchema,
    value: &Value,
    max_listed: usize,
) -> Result<(), Invalid> {
    let mut e = Eval::new(schema, 0, 0);
    let mut sink = Sink::collect(max_listed);
    let ok = e.node(0, value, &mut sink);
    if e.exhausted {
        return Err(Invalid {
            violations: vec![Violation {
                path: String::new(),
                message: format!(
                    "the arguments could not be checked: the tool's schema needs more than \
                     {MAX_STEPS} steps or {MAX_EVAL_DEPTH} nested levels for them; send simpler \
                     arguments"
                ),
            }],
            total: 1,
        });
    }
    if ok {
        return Ok(());
    }
    let (violations, total) = sink.into_parts();
    Err(Invalid { violations, total })
}

/// Where violations go: nowhere (only the verdict counts), or into a list of at most `max`
/// (all of them counted).
enum Sink {
    Verdict,
    Collect {
        list: Vec<Violation>,
        total: usize,
        max: usize,
    },
}

impl Sink {
    fn collect(max: usize) -> Sink {
        Sink::Collect {
            list: Vec::new(),
            total: 0,
            max,
        }
    }

    fn collecting(&self) -> bool {
        matches!(self, Sink::Collect { .. })
    }

    fn into_parts(self) -> (Vec<Violation>, usize) {
        match self {
            Sink::Verdict => (Vec::new(), 0),
            Sink::Collect { list, total, .. } => (list, total),
        }
    }
}

/// One step of the path into the arguments.
#[derive(Clone, Copy)]
enum Seg<'v> {
    Key(&'v str),
    Index(usize),
}

struct Eval<'s, 'v> {
    schema: &'s ArgSchema,
    path: Vec<Seg<'v>>,
    depth: usize,
    steps: usize,
    /// A bound was hit: the verdict is "invalid", whatever the checks said.
    exhausted: bool,
}

impl<'s, 'v> Eval<'s, 'v> {
    fn new(schema: &'s ArgSchema, depth: usize, steps: usize) -> Self {
        Eval {
            schema,
            path: Vec::new(),
            depth,
            steps,
            exhausted: false,
        }
    }

    /// The current path as a JSON pointer.
    fn pointer(&self) -> String {
        let mut s = String::new();
        for seg in &self.path {
            s.push('/');
            match seg {
                Seg::Key(k) => s.push_str(&escape_pointer(k)),
                Seg::Index(i) => s.push_str(&i.to_string()),
            }
        }
        s
    }

    /// `ok`; when false, a violation at the current path, its message built only if listed.
    fn expect(&self, ok: bool, sink: &mut Sink, message: impl FnOnce() -> String) -> bool {
        if !ok && let Sink::Collect { list, total, max } = sink {
            *total += 1;
            if list.len() < *max {
                list.push(Violation {
                    path: self.pointer(),
                    message: message(),
                });
            }
        }
        ok
    }

    /// `f` for each item; all must pass. Without a collecting sink, the first failure ends it.
    fn each<T>(
        &mut self,
        sink: &mut Sink,
        items: impl IntoIterator<Item = T>,
        mut f: impl FnMut(&mut Self, &mut Sink, T) -> bool,
    ) -> bool {
        let mut ok = true;
        for item in items {
            if !f(self, sink, item) {
                ok = false;
                if !sink.collecting() || self.exhausted {
                    break;
                }
            }
        }
        ok
    }

    /// Apply node `id` to `v`: true when it matches.
    fn node(&mut self, id: Id, v: &'v Value, sink: &mut Sink) -> bool {
        self.steps += 1;
        if self.exhausted || self.steps > MAX_STEPS || self.depth >= MAX_EVAL_DEPTH {
            self.exhausted = true;
            return false;
        }
        self.depth += 1;
        let schema = self.schema;
        let ok = self.each(sink, &schema.nodes[id].checks, |e, sink, c| {
            e.check(c, v, sink)
        });
        self.depth -= 1;
        ok
    }

    /// Apply `id` to a child of the current value.
    fn child(&mut self, seg: Seg<'v>, id: Id, v: &'v Value, sink: &mut Sink) -> bool {
        self.path.push(seg);
        let ok = self.node(id, v, sink);
        self.path.pop();
        ok
    }

    /// Whether `id` matches `v`, with no message.
    fn matches(&mut self, id: Id, v: &'v Value) -> bool {
        self.node(id, v, &mut Sink::Verdict)
    }

    /// The first violation `id` finds in `v` (for the messages of `anyOf`/`oneOf`), `None`
    /// when it matches.
    fn first_violation(&mut self, id: Id, v: &'v Value) -> Option<Violation> {
        let mut sub = Sink::collect(1);
        if self.node(id, v, &mut sub) {
            return None;
        }
        let (mut list, _) = sub.into_parts();
        Some(list.pop().unwrap_or_else(|| Violation {
            path: self.pointer(),
            message: "does not match".into(),
        }))
    }

    fn check(&mut self, check: &Check, v: &'v Value, sink: &mut Sink) -> bool {
        match check {
            Check::Never => self.expect(false, sink, || "no value is allowed here".into()),
            Check::Type(types) => self.expect(types.matches(v), sink, || {
                format!("{} is not of type {types}", show(v))
            }),
            Check::Enum(values) => self.expect(values.iter().any(|e| json_eq(e, v)), sink, || {
                format!("{} is not one of {}", show(v), list_values(values))
            }),
            Check::Const(c) => self.expect(json_eq(c, v), sink, || {
                format!("{} is not {}", show(v), show(c))
            }),
            Check::Bound(kind, limit) => self.bound(*kind, limit, v, sink),
            Check::MultipleOf(d) => {
                let Value::Number(n) = v else { return true };
                self.expect(is_multiple_of(n, *d), sink, || {
                    format!("{n} is not a multiple of {d}")
                })
            }
            Check::MinSize(size, limit) => self.size(*size, *limit, true, v, sink),
            Check::MaxSize(size, limit) => self.size(*size, *limit, false, v, sink),
            Check::UniqueItems => self.unique_items(v, sink),
            Check::Items { prefix, rest } => self.items(prefix, *rest, v, sink),
            Check::Contains { schema, min, max } => self.contains(*schema, *min, *max, v, sink),
            Check::Required(names) => self.required(names, v, sink),
            Check::Properties {
                props,
                additional,
                unchecked_patterns,
            } => self.properties(props, *additional, *unchecked_patterns, v, sink),
            Check::PropertyNames(id) => self.property_names(*id, v, sink),
            Check::DependentRequired(deps) => self.dependent_required(deps, v, sink),
            Check::DependentSchemas(deps) => {
                let Value::Object(o) = v else { return true };
                let present = deps.iter().filter(|(key, _)| o.contains_key(key));
                self.each(sink, present, |e, sink, (_, id)| e.node(*id, v, sink))
            }
            Check::Ref(id) => self.node(*id, v, sink),
            Check::AllOf(ids) => self.each(sink, ids, |e, sink, id| e.node(*id, v, sink)),
            Check::AnyOf(ids) => self.any_of(ids, v, sink),
            Check::OneOf(ids) => self.one_of(ids, v, sink),
            Check::Not(id, text) => self.not(*id, text, v, sink),
            Check::If {
                cond,
                then,
                otherwise,
            } => self.if_then_else(*cond, *then, *otherwise, v, sink),
        }
    }

    /// `minimum`, `maximum` and their exclusive forms (numbers only).
    fn bound(&self, kind: Bound, limit: &Number, v: &Value, sink: &mut Sink) -> bool {
        let Value::Number(n) = v else { return true };
        let ord = cmp_numbers(n, limit);
        let (ok, words) = match kind {
            Bound::Min => (ord != Ordering::Less, "less than the minimum of"),
            Bound::Max => (ord != Ordering::Greater, "greater than the maximum of"),
            Bound::ExclusiveMin => (
                ord == Ordering::Greater,
                "less than or equal to the exclusive minimum of",
            ),
            Bound::ExclusiveMax => (
                ord == Ordering::Less,
                "greater than or equal to the exclusive maximum of",
            ),
        };
        self.expect(ok, sink, || format!("{n} is {words} {limit}"))
    }

    /// `uniqueItems` (lists only).
    fn unique_items(&self, v: &Value, sink: &mut Sink) -> bool {
        let Value::Array(a) = v else { return true };
        // Quadratic, as the definition: argument lists are short, and the work is
        // bounded by the step budget of what produced them.
        let dup = (0..a.len()).find_map(|i| {
            ((i + 1)..a.len())
                .find(|&j| json_eq(&a[i], &a[j]))
                .map(|j| (i, j))
        });
        self.expect(dup.is_none(), sink, || {
            let (i, j) = dup.unwrap_or_default();
            format!(
                "items {i} and {j} are equal ({}); every item must be unique",
                show(&a[i])
            )
        })
    }

    /// `prefixItems`/`items`: each item against the schema for its position (lists only).
    fn items(&mut self, prefix: &[Id], rest: Option<Id>, v: &'v Value, sink: &mut Sink) -> bool {
        let Value::Array(a) = v else { return true };
        let with_schema = a
            .iter()
            .enumerate()
            .map_while(|(i, item)| Some((i, item, *prefix.get(i).or(rest.as_ref())?)));
        self.each(sink, with_schema, |e, sink, (i, item, id)| {
            e.child(Seg::Index(i), id, item, sink)
        })
    }

    /// `contains` with `minContains`/`maxContains` (lists only).
    fn contains(
        &mut self,
        schema: Id,
        min: u64,
        max: Option<u64>,
        v: &'v Value,
        sink: &mut Sink,
    ) -> bool {
        let Value::Array(a) = v else { return true };
        let mut found = 0u64;
        for item in a {
            found += u64::from(self.matches(schema, item));
            if self.exhausted {
                return false;
            }
        }
        let too_many = max.is_some_and(|m| found > m);
        self.expect(found >= min && !too_many, sink, || match max {
            Some(m) if too_many => {
                format!("{found} items match the \"contains\" schema, more than the maximum of {m}")
            }
            _ => format!(
                "{found} {} the \"contains\" schema, fewer than the minimum of {min}",
                if found == 1 {
                    "item matches"
                } else {
                    "items match"
                }
            ),
        })
    }

    /// `required` (objects only).
    fn required(&mut self, names: &[String], v: &'v Value, sink: &mut Sink) -> bool {
        let Value::Object(o) = v else { return true };
        self.each(sink, names, |e, sink, name| {
            e.expect(o.contains_key(name), sink, || {
                format!("{} is a required property", quote(name))
            })
        })
    }

    /// `properties` and `additionalProperties` (objects only).
    fn properties(
        &mut self,
        props: &[(String, Id)],
        additional: Option<Id>,
        unchecked_patterns: bool,
        v: &'v Value,
        sink: &mut Sink,
    ) -> bool {
        let Value::Object(o) = v else { return true };
        self.each(sink, o, |e, sink, (key, value)| {
            if let Some((_, id)) = props.iter().find(|(k, _)| k == key) {
                return e.child(Seg::Key(key), *id, value, sink);
            }
            match additional {
                None => true,
                Some(_) if unchecked_patterns => true,
                // `additionalProperties: false`: name the property and the allowed
                // ones, at the object (where the fix is).
                Some(id) if e.is_never(id) => {
                    e.expect(false, sink, || unexpected_property(key, props))
                }
                Some(id) => e.child(Seg::Key(key), id, value, sink),
            }
        })
    }

    /// `propertyNames` (objects only).
    fn property_names(&mut self, id: Id, v: &'v Value, sink: &mut Sink) -> bool {
        let Value::Object(o) = v else { return true };
        self.each(sink, o.keys(), |e, sink, key| {
            let why = e.name_violation(id, key);
            e.expect(why.is_none(), sink, || {
                format!(
                    "property name {} is not allowed: {}",
                    quote(key),
                    why.unwrap_or_default()
                )
            })
        })
    }

    /// `dependentRequired` (objects only).
    fn dependent_required(
        &mut self,
        deps: &[(String, Vec<String>)],
        v: &'v Value,
        sink: &mut Sink,
    ) -> bool {
        let Value::Object(o) = v else { return true };
        let needed = deps
            .iter()
            .filter(|(key, _)| o.contains_key(key))
            .flat_map(|(key, names)| names.iter().map(move |n| (key, n)));
        self.each(sink, needed, |e, sink, (key, name)| {
            e.expect(o.contains_key(name), sink, || {
                format!("{} is required when {} is present", quote(name), quote(key))
            })
        })
    }

    /// `not`: `text` is the subschema, cut, for the message.
    fn not(&mut self, id: Id, text: &str, v: &'v Value, sink: &mut Sink) -> bool {
        let matched = self.matches(id, v);
        !self.exhausted
            && self.expect(!matched, sink, || {
                format!("{} must not match {text}", show(v))
            })
    }

    /// `if`/`then`/`else`.
    fn if_then_else(
        &mut self,
        cond: Id,
        then: Option<Id>,
        otherwise: Option<Id>,
        v: &'v Value,
        sink: &mut Sink,
    ) -> bool {
        let holds = self.matches(cond, v);
        if self.exhausted {
            return false;
        }
        match if holds { then } else { otherwise } {
            Some(id) => self.node(id, v, sink),
            None => true,
        }
    }

    fn size(&self, size: Size, limit: u64, min: bool, v: &Value, sink: &mut Sink) -> bool {
        let Some(n) = size.of(v) else { return true };
        let ok = if min { n >= limit } else { n <= limit };
        self.expect(ok, sink, || {
            let (what, noun) = match size {
                Size::Chars => (show(v), "character"),
                Size::Items => ("the list".to_string(), "item"),
                Size::Properties => ("the object".to_string(), "property"),
            };
            let side = if min {
                "fewer than the minimum"
            } else {
                "more than the maximum"
            };
            format!("{what} has {n} {}, {side} of {limit}", plural(n, noun))
        })
    }

    fn any_of(&mut self, ids: &[Id], v: &'v Value, sink: &mut Sink) -> bool {
        if !sink.collecting() {
            return ids.iter().any(|id| self.matches(*id, v)) && !self.exhausted;
        }
        let mut why = Vec::new();
        for id in ids {
            match self.first_violation(*id, v) {
                None => return !self.exhausted,
                Some(first) => why.push(first),
            }
        }
        let here = self.pointer();
        self.expect(false, sink, || {
            format!(
                "{} matches none of the allowed alternatives (anyOf): {}",
                show(v),
                alternatives(&why, &here)
            )
        })
    }

    fn one_of(&mut self, ids: &[Id], v: &'v Value, sink: &mut Sink) -> bool {
        let mut matched = Vec::new();
        let mut why = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if sink.collecting() {
                match self.first_violation(*id, v) {
                    None => matched.push(i + 1),
                    Some(first) => why.push(first),
                }
            } else if self.matches(*id, v) {
                matched.push(i + 1);
                if matched.len() > 1 {
                    break;
                }
            }
            if self.exhausted {
                return false;
            }
        }
        let here = self.pointer();
        self.expect(matched.len() == 1, sink, || {
            if matched.is_empty() {
                format!(
                    "{} matches none of the allowed alternatives (oneOf): {}",
                    show(v),
                    alternatives(&why, &here)
                )
            } else {
                let list: Vec<String> = matched.iter().map(usize::to_string).collect();
                format!(
                    "{} matches alternatives {} of oneOf; it must match exactly one",
                    show(v),
                    list.join(" and ")
                )
            }
        })
    }

    /// Whether node `id` is the `false` schema (so `additionalProperties: false`).
    fn is_never(&self, id: Id) -> bool {
        matches!(self.schema.nodes[id].checks.as_slice(), [Check::Never])
    }

    /// The first violation of a property name checked as a string (`propertyNames`): the name
    /// is not a value of the arguments, so it is checked on an evaluator of its own, sharing
    /// the depth and the step budget.
    fn name_violation(&mut self, id: Id, name: &str) -> Option<String> {
        let value = Value::String(name.to_string());
        let mut inner = Eval::new(self.schema, self.depth, self.steps);
        let first = inner.first_violation(id, &value).map(|f| f.message);
        self.steps = inner.steps;
        self.exhausted |= inner.exhausted;
        first
    }
}

/// A name as a JSON string, cut like any value.
fn quote(name: &str) -> String {
    show(&Value::String(name.to_string()))
}

fn plural(n: u64, word: &str) -> String {
    match (n, word) {
        (1, w) => w.to_string(),
        (_, "property") => "properties".to_string(),
        (_, w) => format!("{w}s"),
    }
}

fn unexpected_property(key: &str, props: &[(String, Id)]) -> String {
    if props.is_empty() {
        return format!(
            "property {} is not allowed: this object takes no properties",
            quote(key)
        );
    }
    let mut names: Vec<String> = props
        .iter()
        .take(MAX_LISTED_NAMES)
        .map(|(k, _)| quote(k))
        .collect();
    if props.len() > MAX_LISTED_NAMES {
        names.push("…".into());
    }
    format!(
        "property {} is not allowed; the allowed properties are {}",
        quote(key),
        names.join(", ")
    )
}

/// "1) msg; 2) at /x: msg": the first violation of each alternative.
fn alternatives(why: &[Violation], here: &str) -> String {
    why.iter()
        .enumerate()
        .map(|(i, v)| {
            if v.path == here {
                format!("{}) {}", i + 1, v.message)
            } else {
                format!("{}) at {}: {}", i + 1, v.path, v.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn list_values(values: &[Value]) -> String {
    let mut shown: Vec<String> = values.iter().take(MAX_LISTED_NAMES).map(show).collect();
    if values.len() > MAX_LISTED_NAMES {
        shown.push("…".into());
    }
    shown.join(", ")
}
