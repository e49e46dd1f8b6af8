//! The tool registry: holds the enabled tools with their compiled argument schemas and runs
//! calls (SPEC §11): unknown tool, invalid JSON and schema violations become error results the
//! model can read; every call runs under a timeout; output is truncated with a marker.
//!
//! Two kinds of tools: the built-in ones, fixed when the registry is built (a problem with one
//! is our bug, so [`ToolRegistry::new`] fails), and a replaceable dynamic set (the MCP tools,
//! [`ToolRegistry::set_dynamic`]), where a bad tool from outside is refused alone. Every read
//! and every call takes one snapshot of the union, so a call never sees half of a change.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::Value;

use super::arg_schema::ArgSchema;
use super::{Tool, ToolContext, ToolError, ToolOutput};
use crate::llm::ToolSpec;
use crate::llm::compat::MAX_IMAGES;
use crate::message::{ToolCall, ToolResult};

/// The key an adapter puts the raw text under when the model's arguments were not valid JSON.
pub const INVALID_JSON_KEY: &str = "__invalid_json";

/// `[tools] max_parallel_calls` when nothing else is said.
pub const DEFAULT_MAX_PARALLEL: usize = 8;

/// At most this many schema violations are listed in one error result.
const MAX_LISTED_VIOLATIONS: usize = 20;

/// At most this many characters of unparseable arguments are echoed back to the model.
const MAX_ECHOED_RAW_CHARS: usize = 200;

struct Entry {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    /// Shared so that an unchanged dynamic tool keeps its compiled schema across replacements.
    validator: Arc<ArgSchema>,
    /// `Tool::untrusted_output`, read once.
    untrusted: bool,
}

/// Tools by name: a `BTreeMap`, so iteration is sorted by name.
type ToolMap = BTreeMap<String, Arc<Entry>>;

/// A dynamic tool [`ToolRegistry::set_dynamic`] did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The tool's name as offered to the model.
    pub name: String,
    pub reason: String,
}

/// The set of tools offered to the model, keyed by name (sorted, so the tool list — the head of
/// the prompt cache — has a stable order).
pub struct ToolRegistry {
    /// The built-in tools, fixed at construction.
    builtin: ToolMap,
    /// The built-in tools plus the accepted dynamic ones, and what the model is offered of
    /// them. Replaced whole by `set_dynamic`; readers clone the `Arc`s (a snapshot) and never
    /// hold the lock across an await.
    all: RwLock<Current>,
    default_timeout: Duration,
    output_truncation: usize,
    /// At most this many calls of one answer run at the same time (`[tools]
    /// max_parallel_calls`).
    max_parallel: usize,
    /// The size the whole tool list (names, descriptions, schemas) may have; dynamic tools
    /// that would pass it are refused ([`ToolRegistry::with_tool_budget`]).
    budget: usize,
}

/// The size of a tool as the model is offered it: name, description and schema.
fn spec_bytes(spec: &ToolSpec) -> usize {
    spec.name.len() + spec.description.len() + spec.input_schema.to_string().len()
}

/// The current set: the tools by name, and their specs in name order as one list that every
/// request shares (a request holds the list, not a copy of its schemas); a new list for each
/// change of the set, so its identity says whether the set changed.
struct Current {
    map: Arc<ToolMap>,
    specs: Arc<[ToolSpec]>,
}

impl Current {
    fn new(map: ToolMap) -> Current {
        Current {
            specs: map.values().map(|e| e.spec.clone()).collect(),
            map: Arc::new(map),
        }
    }
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .field("default_timeout", &self.default_timeout)
            .field("output_truncation", &self.output_truncation)
            .field("max_parallel", &self.max_parallel)
            .finish()
    }
}

impl ToolRegistry {
    /// Build a registry of built-in tools, compiling every tool's `input_schema`. The dynamic
    /// set starts empty.
    ///
    /// Errors name the tool: a name not matching `^[A-Za-z0-9_-]{1,64}$` (what both Anthropic
    /// and OpenAI accept), a duplicate name, or an input schema that is not an object schema or
    /// does not compile.
    pub fn new(
        tools: Vec<Arc<dyn Tool>>,
        default_timeout: Duration,
        output_truncation: usize,
    ) -> Result<ToolRegistry, String> {
        let mut map = BTreeMap::new();
        for tool in tools {
            let spec = tool.spec();
            if map.contains_key(&spec.name) {
                return Err(format!(
                    "tool '{}' is defined twice; tool names must be unique",
                    spec.name
                ));
            }
            let entry = compile(tool, spec)?;
            map.insert(entry.spec.name.clone(), Arc::new(entry));
        }
        Ok(ToolRegistry {
            all: RwLock::new(Current::new(map.clone())),
            builtin: map,
            default_timeout,
            output_truncation,
            max_parallel: DEFAULT_MAX_PARALLEL,
            budget: usize::MAX,
        })
    }

    /// Replace the dynamic tools (the MCP tools) with `tools`; the built-in ones stay. A tool is
    /// refused alone, with its reason, never the whole set: an invalid name, a name a built-in
    /// tool or an earlier tool of `tools` already has, or a bad input schema. A tool whose spec
    /// is unchanged keeps its compiled schema. Calls already running finish on the tools they
    /// started with; a call to a tool that is gone answers "unknown tool".
    pub fn set_dynamic(&self, tools: Vec<Arc<dyn Tool>>) -> Vec<Refused> {
        let current = self.snapshot();
        let mut map = self.builtin.clone();
        let mut refused = Vec::new();
        let mut used: usize = self.builtin.values().map(|e| spec_bytes(&e.spec)).sum();
        for tool in tools {
            let spec = tool.spec();
            let name = spec.name.clone();
            let size = spec_bytes(&spec);
            if used.saturating_add(size) > self.budget {
                refused.push(Refused {
                    name,
                    reason: format!(
                        "tool '{}' is not offered: the tool list would pass {} KiB, a quarter \
                         of the smallest loaded model's context window. Fix: leave tools out \
                         with the server's `tools` allow-list",
                        spec.name,
                        self.budget >> 10
                    ),
                });
                continue;
            }
            let taken = if self.builtin.contains_key(&name) {
                Some("a built-in tool has this name")
            } else if map.contains_key(&name) {
                Some("another tool of the set has this name")
            } else {
                None
            };
            if let Some(why) = taken {
                refused.push(Refused {
                    name,
                    reason: format!("tool '{}' is not offered: {why}", spec.name),
                });
                continue;
            }
            let entry = match current.get(&name) {
                Some(old) if old.spec == spec => Entry {
                    untrusted: tool.untrusted_output(),
                    tool,
                    spec,
                    validator: old.validator.clone(),
                },
                _ => match compile(tool, spec) {
                    Ok(entry) => entry,
                    Err(reason) => {
                        refused.push(Refused { name, reason });
                        continue;
                    }
                },
            };
            used += size;
            map.insert(name, Arc::new(entry));
        }
        *self.all.write().unwrap_or_else(|p| p.into_inner()) = Current::new(map);
        refused
    }

    /// The current tools (built-in and dynamic), for one read or one call.
    fn snapshot(&self) -> Arc<ToolMap> {
        self.all
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .clone()
    }

    /// This registry with the whole tool list at most `bytes` (names, descriptions, schemas as
    /// JSON): dynamic tools past it are refused (the built-in ones always stay).
    pub fn with_tool_budget(mut self, bytes: usize) -> ToolRegistry {
        self.budget = bytes;
        self
    }

    /// This registry running at most `n` (at least 1) calls of one answer at a time.
    pub fn with_max_parallel(mut self, n: usize) -> ToolRegistry {
        self.max_parallel = n.max(1);
        self
    }

    /// A registry with no tools (the model is offered none).
    pub fn empty() -> ToolRegistry {
        ToolRegistry {
            builtin: BTreeMap::new(),
            all: RwLock::new(Current::new(BTreeMap::new())),
            default_timeout: Duration::from_secs(60),
            budget: usize::MAX,
            output_truncation: 30_000,
            max_parallel: DEFAULT_MAX_PARALLEL,
        }
    }

    /// Specs sorted by name (a stable order: the tool list is the head of the prompt cache).
    /// The list is the same `Arc` until the set changes.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        self.all
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .specs
            .clone()
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.snapshot().keys().cloned().collect()
    }

    /// Whether a tool of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.snapshot().contains_key(name)
    }

    /// Number of registered tools.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// True when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// Run one call. Never fails: every problem becomes an error result the model can read.
    /// The output of a tool with untrusted output (and the text of its `Failed` errors) is
    /// truncated, then wrapped by `untrusted::wrap`, so the wrapper is never cut.
    pub async fn execute(&self, call: &ToolCall, ctx: &ToolContext) -> ToolResult {
        let started = Instant::now();
        let (outcome, from_outside) = self.run(call, ctx).await;
        let (content, images, is_error) = match outcome {
            Ok(out) => (out.text, out.images, false),
            Err(msg) => (msg, Vec::new(), true),
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            tool = %call.name,
            tool_call_id = %call.id,
            session_id = %ctx.session_id,
            duration_ms,
            is_error,
            output_bytes = content.len(),
            images = images.len(),
            "tool call"
        );
        let mut content = truncate_output(&content, self.output_truncation);
        if from_outside {
            content = super::untrusted::wrap(&call.name, &content);
        }
        ToolResult {
            tool_call_id: call.id.clone(),
            content,
            is_error,
            images,
        }
    }

    /// A result a compatible endpoint's client sent for one of its tools (SPEC §17): from
    /// outside like an MCP server's output, so truncated and wrapped the same way.
    pub fn client_result(&self, tool: &str, content: &str) -> String {
        super::untrusted::wrap(tool, &truncate_output(content, self.output_truncation))
    }

    /// Run all calls concurrently, at most `max_parallel` at a time; results come back in the
    /// order of `calls`.
    pub async fn execute_all(&self, calls: &[ToolCall], ctx: &ToolContext) -> Vec<ToolResult> {
        self.execute_answer(calls, &[], ctx).await
    }

    /// Like [`ToolRegistry::execute_all`], but a call whose entry in `refused` is `Some(text)`
    /// is not run: it is answered with `text` as an error result (a call the provider's answer
    /// got wrong, see `message::toolcalls::normalise`). `refused` may be shorter than `calls`.
    pub async fn execute_answer(
        &self,
        calls: &[ToolCall],
        refused: &[Option<String>],
        ctx: &ToolContext,
    ) -> Vec<ToolResult> {
        // At most `max_parallel` calls run at once (one answer of 100 calls must not start 100
        // processes); the semaphore is fair, so they start in the order of `calls`, and
        // `join_all` keeps that order in the results. A call that touches a path an earlier
        // call of the answer writes (or writes one it reads) first waits for that call
        // (`effects::waits_for`), before it takes a slot, so waiting calls hold none.
        let slots = tokio::sync::Semaphore::new(self.max_parallel);
        let slots = &slots;
        let effects = self.effects_of(calls, refused, ctx);
        let waits = super::effects::waits_for(&effects);
        let done: Vec<tokio::sync::Semaphore> = calls
            .iter()
            .map(|_| tokio::sync::Semaphore::new(0))
            .collect();
        let done = &done;
        let mut results = futures::future::join_all(calls.iter().enumerate().map(|(i, call)| {
            let refusal = refused.get(i).cloned().flatten();
            let waits = &waits[i];
            async move {
                for &before in waits {
                    // Never closed; it gets its permit when that call is done (given back
                    // here at once, for the other calls waiting for it).
                    let _done = done[before].acquire().await;
                }
                let result = match refusal {
                    Some(content) => ToolResult {
                        tool_call_id: call.id.clone(),
                        content,
                        is_error: true,
                        images: Vec::new(),
                    },
                    None => {
                        // Never closed, so `acquire` cannot fail; run anyway if it did.
                        let _slot = slots.acquire().await.ok();
                        self.execute(call, ctx).await
                    }
                };
                done[i].add_permits(1);
                result
            }
        }))
        .await;
        cap_images(&mut results);
        results
    }

    /// What each call of an answer touches on disk (nothing for refused or unknown ones).
    fn effects_of(
        &self,
        calls: &[ToolCall],
        refused: &[Option<String>],
        ctx: &ToolContext,
    ) -> Vec<super::effects::Effects> {
        let tools = self.snapshot();
        calls
            .iter()
            .enumerate()
            .map(
                |(i, call)| match (refused.get(i).cloned().flatten(), tools.get(&call.name)) {
                    (None, Some(entry)) => entry.tool.effects(&call.arguments, ctx),
                    _ => Default::default(),
                },
            )
            .collect()
    }

    /// The checks and the call itself; `Err` is the text of an error result. The flag says
    /// whether the text came from outside (an untrusted tool's output or `Failed` error).
    async fn run(&self, call: &ToolCall, ctx: &ToolContext) -> (Result<ToolOutput, String>, bool) {
        let tools = self.snapshot();
        let Some(entry) = tools.get(&call.name).cloned() else {
            return (Err(unknown_tool_message(&tools, &call.name)), false);
        };
        drop(tools);
        let entry = &*entry;
        if let Some(raw) = invalid_json_marker(&call.arguments) {
            return (Err(invalid_json_message(raw)), false);
        }
        // Tools without arguments are sometimes called with nothing at all: treat as `{}`.
        let args = match &call.arguments {
            Value::Null => Value::Object(serde_json::Map::new()),
            other => other.clone(),
        };
        if let Err(e) = validate_args(entry, &args) {
            return (Err(e), false);
        }
        match self.call_tool(entry, call, args, ctx).await {
            Ok(out) => (Ok(out), entry.untrusted),
            Err(CallError::Tool(ToolError::Failed(text))) => (Err(text), entry.untrusted),
            Err(CallError::Tool(e)) => (Err(e.to_string()), false),
            Err(CallError::Registry(text)) => (Err(text), false),
        }
    }

    /// The call under its timeout, a panic caught.
    async fn call_tool(
        &self,
        entry: &Entry,
        call: &ToolCall,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, CallError> {
        let limit = entry.tool.timeout().unwrap_or(self.default_timeout);
        let fut = AssertUnwindSafe(entry.tool.call_with_images(args, ctx)).catch_unwind();
        match tokio::time::timeout(limit, fut).await {
            Err(_elapsed) => Err(CallError::Registry(format!(
                "tool '{}' timed out after {} s",
                call.name,
                format_seconds(limit)
            ))),
            Ok(Err(_panic)) => {
                tracing::error!(tool = %call.name, "tool panicked");
                Err(CallError::Registry(format!(
                    "tool '{}' failed with an internal error (it panicked); this is a bug in \
                     agentd, not in the arguments",
                    call.name
                )))
            }
            Ok(Ok(Err(e))) => Err(CallError::Tool(e)),
            Ok(Ok(Ok(out))) => Ok(out),
        }
    }
}

/// At most [`MAX_IMAGES`] images across the results of one answer (the cap of a user
/// message's images); the images past it are dropped, each with a note after its result's
/// text (outside the untrusted-content wrapper: the note is the daemon's).
fn cap_images(results: &mut [ToolResult]) {
    let mut kept = 0usize;
    for r in results.iter_mut() {
        let keep = r.images.len().min(MAX_IMAGES - kept);
        kept += keep;
        for dropped in r.images.drain(keep..) {
            r.content.push_str(&format!(
                "\n{} was not shown: the calls of one answer pass at most {MAX_IMAGES} images \
                 to the model",
                dropped.placeholder
            ));
        }
    }
}

fn unknown_tool_message(tools: &ToolMap, name: &str) -> String {
    let available = if tools.is_empty() {
        "none".to_string()
    } else {
        tools.keys().cloned().collect::<Vec<_>>().join(", ")
    };
    format!("unknown tool '{name}'; available tools: {available}")
}

/// Check one tool's name and compile its input schema; errors name the tool.
fn compile(tool: Arc<dyn Tool>, spec: ToolSpec) -> Result<Entry, String> {
    if !is_valid_tool_name(&spec.name) {
        return Err(format!(
            "tool name {:?} is invalid: use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
            spec.name
        ));
    }
    if spec.input_schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(format!(
            "tool '{}': input_schema must be an object schema ({{\"type\": \"object\", ...}})",
            spec.name
        ));
    }
    let validator = ArgSchema::compile(&spec.input_schema)
        .map_err(|e| format!("tool '{}': input_schema is invalid: {e}", spec.name))?;
    let untrusted = tool.untrusted_output();
    Ok(Entry {
        tool,
        spec,
        validator: Arc::new(validator),
        untrusted,
    })
}

/// Why a call produced no output: the tool's own error, or the registry's (timeout, panic).
enum CallError {
    Tool(ToolError),
    Registry(String),
}

/// `Some(raw)` when the arguments are the adapter's invalid-JSON marker `{"__invalid_json": raw}`.
fn invalid_json_marker(args: &Value) -> Option<&str> {
    let obj = args.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    obj.get(INVALID_JSON_KEY)?.as_str()
}

fn invalid_json_message(raw: &str) -> String {
    let reason = match serde_json::from_str::<Value>(raw) {
        Err(e) => e.to_string(),
        Ok(_) => "not a JSON object".to_string(),
    };
    let shown: String = raw.chars().take(MAX_ECHOED_RAW_CHARS).collect();
    let ellipsis = if shown.len() < raw.len() { "…" } else { "" };
    format!(
        "arguments are not valid JSON: {reason}. Received: {shown}{ellipsis}\nSend the \
         arguments as one JSON object."
    )
}

/// Check `args` against the tool's schema; `Err` lists each violation with its instance path.
fn validate_args(entry: &Entry, args: &Value) -> Result<(), String> {
    let Err(invalid) = entry.validator.validate(args, MAX_LISTED_VIOLATIONS) else {
        return Ok(());
    };
    let mut msg = format!("invalid arguments for tool '{}':\n", entry.spec.name);
    let lines: Vec<String> = invalid
        .violations
        .iter()
        .map(|v| {
            let at = if v.path.is_empty() { "(root)" } else { &v.path };
            format!("- at {at}: {}", v.message)
        })
        .collect();
    msg.push_str(&lines.join("\n"));
    let listed = invalid.violations.len();
    if invalid.total > listed {
        msg.push_str(&format!("\n- ... and {} more", invalid.total - listed));
    }
    msg.push_str(&format!(
        "\nExpected arguments (JSON Schema): {}",
        entry.spec.input_schema
    ));
    Err(msg)
}

/// `^[A-Za-z0-9_-]{1,64}$`: the same rule the calls of an answer are held to
/// (`message::toolcalls`).
fn is_valid_tool_name(name: &str) -> bool {
    crate::message::toolcalls::is_valid_token(name)
}

/// Seconds without noise: `30`, `1.5`, `0.05`.
fn format_seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        return d.as_secs().to_string();
    }
    let s = format!("{:.3}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Char-boundary-safe truncation to `max` characters, with a marker like
/// `"\n[output truncated: showing 30000 of 123456 characters]"` when anything was cut.
pub fn truncate_output(s: &str, max: usize) -> String {
    let Some((cut, _)) = s.char_indices().nth(max) else {
        return s.to_string();
    };
    let total = max + s[cut..].chars().count();
    format!(
        "{}\n[output truncated: showing {max} of {total} characters]",
        &s[..cut]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{SessionStatus, StatusSource, ToolError};
    use futures::future::BoxFuture;
    use proptest::prelude::*;
    use serde_json::json;
    use std::path::PathBuf;

    /// A configurable test tool.
    struct TestTool {
        name: &'static str,
        schema: Value,
        timeout: Option<Duration>,
        behavior: Behavior,
        untrusted: bool,
    }

    #[derive(Clone)]
    enum Behavior {
        /// Echo the arguments as JSON.
        Echo,
        /// Sleep for this long, then answer with the string.
        Sleep(Duration, &'static str),
        Fail,
        /// Fails with `ToolError::Invalid` (the tool's own argument check).
        Refuse,
        Panic,
        Output(String),
        /// Counts the calls running at once (sleeps 10 ms to overlap with the others).
        Track(Arc<Tracker>),
    }

    #[derive(Default)]
    struct Tracker {
        running: std::sync::atomic::AtomicUsize,
        max: std::sync::atomic::AtomicUsize,
        done: std::sync::atomic::AtomicUsize,
    }

    impl TestTool {
        fn new(name: &'static str, behavior: Behavior) -> TestTool {
            TestTool {
                name,
                schema: json!({
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "count": {"type": "integer", "minimum": 1}
                    },
                    "additionalProperties": false
                }),
                timeout: None,
                behavior,
                untrusted: false,
            }
        }
    }

    impl Tool for TestTool {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: self.name.to_string(),
                description: "test tool".into(),
                input_schema: self.schema.clone(),
            }
        }
        fn timeout(&self) -> Option<Duration> {
            self.timeout
        }
        fn untrusted_output(&self) -> bool {
            self.untrusted
        }
        fn call<'a>(
            &'a self,
            args: Value,
            _ctx: &'a ToolContext,
        ) -> BoxFuture<'a, Result<String, ToolError>> {
            let behavior = self.behavior.clone();
            Box::pin(async move {
                match behavior {
                    Behavior::Echo => Ok(args.to_string()),
                    Behavior::Sleep(d, out) => {
                        tokio::time::sleep(d).await;
                        Ok(out.to_string())
                    }
                    Behavior::Fail => Err(ToolError::Failed("disk on fire".into())),
                    Behavior::Refuse => Err(ToolError::Invalid("bad path".into())),
                    Behavior::Panic => panic!("boom"),
                    Behavior::Output(s) => Ok(s),
                    Behavior::Track(t) => {
                        use std::sync::atomic::Ordering::SeqCst;
                        let now = t.running.fetch_add(1, SeqCst) + 1;
                        t.max.fetch_max(now, SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        t.running.fetch_sub(1, SeqCst);
                        t.done.fetch_add(1, SeqCst);
                        Ok(args.to_string())
                    }
                }
            })
        }
    }

    struct NoStatus;
    impl StatusSource for NoStatus {
        fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
            Box::pin(async { Err("no status in tests".to_string()) })
        }
    }

    fn ctx() -> ToolContext {
        ToolContext {
            session_id: "s1".into(),
            session_key: "test:1".into(),
            workspace: PathBuf::from("/nonexistent"),
            allowed_paths: vec![],
            protected: Default::default(),
            reply_to: None,
            status: Arc::new(NoStatus),
            sees_images: false,
        }
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            id: format!("id-{name}"),
            name: name.into(),
            arguments: args,
        }
    }

    fn registry(tools: Vec<TestTool>) -> ToolRegistry {
        let tools: Vec<Arc<dyn Tool>> = tools
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .collect();
        ToolRegistry::new(tools, Duration::from_secs(5), 1000).expect("registry")
    }

    #[test]
    fn specs_are_sorted_by_name() {
        let reg = registry(vec![
            TestTool::new("zeta", Behavior::Echo),
            TestTool::new("alpha", Behavior::Echo),
            TestTool::new("mid-dle_1", Behavior::Echo),
        ]);
        let names: Vec<_> = reg.specs().iter().map(|s| s.name.clone()).collect();
        assert_eq!(names, ["alpha", "mid-dle_1", "zeta"]);
        assert_eq!(reg.names(), names);
        assert!(ToolRegistry::empty().specs().is_empty());
    }

    #[test]
    fn new_rejects_bad_names_duplicates_and_schemas() {
        let build = |tools: Vec<TestTool>| {
            let tools: Vec<Arc<dyn Tool>> = tools
                .into_iter()
                .map(|t| Arc::new(t) as Arc<dyn Tool>)
                .collect();
            ToolRegistry::new(tools, Duration::from_secs(1), 100).unwrap_err()
        };
        let err = build(vec![TestTool::new("bad name", Behavior::Echo)]);
        assert!(err.contains("\"bad name\""), "{err}");
        let long: &'static str = Box::leak("x".repeat(65).into_boxed_str());
        assert!(build(vec![TestTool::new(long, Behavior::Echo)]).contains("invalid"));
        assert!(build(vec![TestTool::new("", Behavior::Echo)]).contains("invalid"));

        let err = build(vec![
            TestTool::new("dup", Behavior::Echo),
            TestTool::new("dup", Behavior::Echo),
        ]);
        assert!(err.contains("'dup'") && err.contains("twice"), "{err}");

        let mut bad = TestTool::new("badschema", Behavior::Echo);
        bad.schema = json!({"type": "object", "properties": {"x": {"type": 12}}});
        let err = build(vec![bad]);
        assert!(err.contains("'badschema'"), "{err}");

        let mut not_object = TestTool::new("notobj", Behavior::Echo);
        not_object.schema = json!({"type": "string"});
        let err = build(vec![not_object]);
        assert!(err.contains("'notobj'") && err.contains("object"), "{err}");
    }

    fn dynamic(tools: Vec<TestTool>) -> Vec<Arc<dyn Tool>> {
        tools
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .collect()
    }

    /// The dynamic set is replaced whole, the built-in tools stay, and the union is sorted by
    /// name whatever order the set came in.
    #[tokio::test]
    async fn set_dynamic_replaces_the_dynamic_set_and_keeps_the_order() {
        let reg = registry(vec![
            TestTool::new("read", Behavior::Echo),
            TestTool::new("zz_last", Behavior::Echo),
        ]);
        let refused = reg.set_dynamic(dynamic(vec![
            TestTool::new("srv__b", Behavior::Output("b".into())),
            TestTool::new("srv__a", Behavior::Output("a".into())),
        ]));
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(reg.names(), ["read", "srv__a", "srv__b", "zz_last"]);
        let specs: Vec<_> = reg.specs().iter().map(|s| s.name.clone()).collect();
        assert_eq!(specs, reg.names());
        assert_eq!(reg.len(), 4);
        assert!(reg.contains("srv__a"));
        let res = reg.execute(&call("srv__a", json!({})), &ctx()).await;
        assert_eq!(res.content, "a");

        let refused = reg.set_dynamic(dynamic(vec![TestTool::new(
            "srv__c",
            Behavior::Output("c".into()),
        )]));
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(reg.names(), ["read", "srv__c", "zz_last"]);
        assert!(!reg.contains("srv__a"));

        reg.set_dynamic(Vec::new());
        assert_eq!(reg.names(), ["read", "zz_last"]);
    }

    /// A call to a tool the last replacement removed answers "unknown tool", listing what is
    /// there now.
    #[tokio::test]
    async fn a_removed_dynamic_tool_is_unknown() {
        let reg = registry(vec![TestTool::new("read", Behavior::Echo)]);
        reg.set_dynamic(dynamic(vec![TestTool::new("srv__gone", Behavior::Echo)]));
        assert!(
            !reg.execute(&call("srv__gone", json!({})), &ctx())
                .await
                .is_error
        );
        reg.set_dynamic(dynamic(vec![TestTool::new("srv__new", Behavior::Echo)]));
        let res = reg.execute(&call("srv__gone", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert_eq!(
            res.content,
            "unknown tool 'srv__gone'; available tools: read, srv__new"
        );
    }

    /// Bad dynamic tools are refused one by one with a reason naming them; the rest of the set
    /// is taken, and a clash never replaces the built-in tool.
    #[tokio::test]
    async fn set_dynamic_refuses_single_bad_tools_with_a_reason() {
        let reg = registry(vec![TestTool::new(
            "read",
            Behavior::Output("builtin".into()),
        )]);
        let mut bad_schema = TestTool::new("srv__bad_schema", Behavior::Echo);
        bad_schema.schema = json!({"type": "object", "properties": {"x": {"type": 12}}});
        let mut not_object = TestTool::new("srv__not_object", Behavior::Echo);
        not_object.schema = json!({"type": "string"});
        let refused = reg.set_dynamic(dynamic(vec![
            TestTool::new("read", Behavior::Output("impostor".into())),
            TestTool::new("srv__ok", Behavior::Echo),
            TestTool::new("srv__ok", Behavior::Output("second".into())),
            TestTool::new("bad name", Behavior::Echo),
            bad_schema,
            not_object,
        ]));
        let names: Vec<&str> = refused.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "read",
                "srv__ok",
                "bad name",
                "srv__bad_schema",
                "srv__not_object"
            ]
        );
        assert!(refused[0].reason.contains("built-in"), "{refused:?}");
        assert!(refused[1].reason.contains("another tool"), "{refused:?}");
        assert!(refused[2].reason.contains("invalid"), "{refused:?}");
        assert!(
            refused[3].reason.contains("'srv__bad_schema'"),
            "{refused:?}"
        );
        assert!(refused[4].reason.contains("object"), "{refused:?}");
        assert_eq!(reg.names(), ["read", "srv__ok"]);
        let res = reg.execute(&call("read", json!({})), &ctx()).await;
        assert_eq!(res.content, "builtin");
        let res = reg
            .execute(&call("srv__ok", json!({"text": "x"})), &ctx())
            .await;
        assert_eq!(
            res.content, r#"{"text":"x"}"#,
            "the first of two keeps the name"
        );
    }

    #[test]
    fn tool_names_follow_the_provider_rule() {
        assert!(is_valid_tool_name("read"));
        assert!(is_valid_tool_name("mcp__server-time_now"));
        assert!(is_valid_tool_name(&"a".repeat(64)));
        assert!(!is_valid_tool_name(&"a".repeat(65)));
        assert!(!is_valid_tool_name(""));
        assert!(!is_valid_tool_name("a.b"));
        assert!(!is_valid_tool_name("é"));
    }

    #[tokio::test]
    async fn valid_call_returns_the_output() {
        let reg = registry(vec![TestTool::new("echo", Behavior::Echo)]);
        let res = reg
            .execute(&call("echo", json!({"text": "hi"})), &ctx())
            .await;
        assert!(!res.is_error, "{}", res.content);
        assert_eq!(res.tool_call_id, "id-echo");
        assert_eq!(res.content, r#"{"text":"hi"}"#);
    }

    #[tokio::test]
    async fn null_arguments_count_as_an_empty_object() {
        let reg = registry(vec![TestTool::new("echo", Behavior::Echo)]);
        let res = reg.execute(&call("echo", Value::Null), &ctx()).await;
        assert!(!res.is_error, "{}", res.content);
        assert_eq!(res.content, "{}");
    }

    #[tokio::test]
    async fn unknown_tool_names_it_and_lists_available_ones() {
        let reg = registry(vec![
            TestTool::new("echo", Behavior::Echo),
            TestTool::new("fail", Behavior::Fail),
        ]);
        let res = reg.execute(&call("nope", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert!(
            res.content.contains("unknown tool 'nope'"),
            "{}",
            res.content
        );
        assert!(res.content.contains("echo, fail"), "{}", res.content);
        assert_eq!(res.tool_call_id, "id-nope");
    }

    #[tokio::test]
    async fn invalid_json_marker_becomes_an_error() {
        let reg = registry(vec![TestTool::new("echo", Behavior::Echo)]);
        let res = reg
            .execute(
                &call(
                    "echo",
                    json!({"__invalid_json": "{\"text\": \"unterminated"}),
                ),
                &ctx(),
            )
            .await;
        assert!(res.is_error);
        assert!(
            res.content.starts_with("arguments are not valid JSON: "),
            "{}",
            res.content
        );
        assert!(res.content.contains("unterminated"), "{}", res.content);
    }

    #[tokio::test]
    async fn invalid_json_echo_is_bounded() {
        let reg = registry(vec![TestTool::new("echo", Behavior::Echo)]);
        let raw = format!("{{\"text\": \"{}", "é".repeat(5000));
        let res = reg
            .execute(&call("echo", json!({ "__invalid_json": raw })), &ctx())
            .await;
        assert!(res.is_error);
        assert!(res.content.chars().count() < 600, "{}", res.content.len());
        assert!(res.content.contains('…'));
    }

    #[tokio::test]
    async fn schema_violations_are_listed_with_their_paths() {
        let reg = registry(vec![TestTool::new("echo", Behavior::Echo)]);
        let res = reg
            .execute(
                &call("echo", json!({"text": 5, "count": 0, "extra": true})),
                &ctx(),
            )
            .await;
        assert!(res.is_error);
        let c = &res.content;
        assert!(c.starts_with("invalid arguments for tool 'echo':"), "{c}");
        assert!(c.contains("- at /text:"), "{c}");
        assert!(c.contains("- at /count:"), "{c}");
        assert!(c.contains("- at (root):") && c.contains("extra"), "{c}");
        assert!(c.contains("Expected arguments (JSON Schema)"), "{c}");
    }

    #[tokio::test]
    async fn tool_errors_become_error_results() {
        let reg = registry(vec![TestTool::new("fail", Behavior::Fail)]);
        let res = reg.execute(&call("fail", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert_eq!(res.content, "disk on fire");
    }

    #[tokio::test]
    async fn a_panicking_tool_becomes_an_error_result() {
        let reg = registry(vec![TestTool::new("panic", Behavior::Panic)]);
        let res = reg.execute(&call("panic", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert!(res.content.contains("internal error"), "{}", res.content);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_tool_times_out() {
        let mut slow = TestTool::new("slow", Behavior::Sleep(Duration::from_secs(10), "late"));
        slow.timeout = Some(Duration::from_millis(50));
        let reg = registry(vec![slow]);
        let res = reg.execute(&call("slow", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert_eq!(res.content, "tool 'slow' timed out after 0.05 s");
    }

    #[tokio::test(start_paused = true)]
    async fn default_timeout_applies_without_a_tool_timeout() {
        let slow = TestTool::new("slow", Behavior::Sleep(Duration::from_secs(10), "late"));
        let reg = registry(vec![slow]); // default 5 s
        let res = reg.execute(&call("slow", json!({})), &ctx()).await;
        assert_eq!(res.content, "tool 'slow' timed out after 5 s");
    }

    #[tokio::test]
    async fn long_output_is_truncated_with_a_marker() {
        let reg = registry(vec![TestTool::new(
            "big",
            Behavior::Output("ä".repeat(1500)),
        )]);
        let res = reg.execute(&call("big", json!({})), &ctx()).await;
        assert!(!res.is_error);
        assert!(res.content.starts_with(&"ä".repeat(1000)));
        assert!(
            res.content
                .ends_with("\n[output truncated: showing 1000 of 1500 characters]"),
            "{}",
            &res.content[res.content.len() - 80..]
        );
    }

    /// A tool that logs when it starts and ends, sleeping in between, and declares the `path`
    /// argument as read or written.
    struct PathTool {
        name: &'static str,
        writes: bool,
        log: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Tool for PathTool {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: self.name.into(),
                description: String::new(),
                input_schema: json!({"type": "object"}),
            }
        }

        fn effects(&self, args: &Value, ctx: &ToolContext) -> crate::tools::effects::Effects {
            let path =
                crate::tools::effects::resolve(&ctx.workspace, args["path"].as_str().unwrap_or(""));
            match self.writes {
                true => crate::tools::effects::Effects::writing(path),
                false => crate::tools::effects::Effects::reading(vec![path]),
            }
        }

        fn call<'a>(
            &'a self,
            args: Value,
            _ctx: &'a ToolContext,
        ) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async move {
                let what = format!("{} {}", self.name, args["path"].as_str().unwrap_or(""));
                self.log.lock().unwrap().push(format!("start {what}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.log.lock().unwrap().push(format!("end {what}"));
                Ok(what)
            })
        }
    }

    /// `write a` then `read a` in one answer: the read starts after the write ended; `read b`
    /// runs beside the write.
    #[tokio::test(start_paused = true)]
    async fn a_read_after_a_write_of_the_same_path_waits_for_it() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reg = ToolRegistry::new(
            vec![
                Arc::new(PathTool {
                    name: "w",
                    writes: true,
                    log: log.clone(),
                }),
                Arc::new(PathTool {
                    name: "r",
                    writes: false,
                    log: log.clone(),
                }),
            ],
            Duration::from_secs(5),
            1000,
        )
        .unwrap();
        let calls = vec![
            call("w", json!({"path": "a"})),
            call("r", json!({"path": "./a"})),
            call("r", json!({"path": "b"})),
        ];
        let started = tokio::time::Instant::now();
        let results = reg.execute_all(&calls, &ctx()).await;
        assert!(results.iter().all(|r| !r.is_error), "{results:?}");
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        let log = log.lock().unwrap().clone();
        let at = |s: &str| log.iter().position(|l| l == s).unwrap();
        assert!(at("end w a") < at("start r ./a"), "{log:?}");
        assert!(at("start r b") < at("end w a"), "{log:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn execute_all_keeps_order_when_later_calls_finish_first() {
        let reg = registry(vec![
            TestTool::new("slow", Behavior::Sleep(Duration::from_millis(300), "slow")),
            TestTool::new("mid", Behavior::Sleep(Duration::from_millis(200), "mid")),
            TestTool::new("fast", Behavior::Sleep(Duration::from_millis(100), "fast")),
        ]);
        let calls = vec![
            call("slow", json!({})),
            call("mid", json!({})),
            call("nope", json!({})),
            call("fast", json!({})),
        ];
        let started = tokio::time::Instant::now();
        let results = reg.execute_all(&calls, &ctx()).await;
        // Concurrent: the whole batch takes as long as the slowest call.
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        let ids: Vec<_> = results.iter().map(|r| r.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["id-slow", "id-mid", "id-nope", "id-fast"]);
        assert_eq!(results[0].content, "slow");
        assert_eq!(results[1].content, "mid");
        assert!(results[2].is_error);
        assert_eq!(results[3].content, "fast");
    }

    /// 100 calls in one answer: at most `max_parallel` run at once, all run, and the results
    /// keep the order of the calls.
    #[tokio::test(start_paused = true)]
    async fn execute_all_runs_at_most_max_parallel_calls_at_once() {
        let tracker = Arc::new(Tracker::default());
        let reg = registry(vec![TestTool::new(
            "track",
            Behavior::Track(tracker.clone()),
        )])
        .with_max_parallel(8);
        let calls: Vec<ToolCall> = (0..100)
            .map(|i| ToolCall {
                id: format!("c{i}"),
                name: "track".into(),
                arguments: json!({ "count": i + 1 }),
            })
            .collect();
        let results = reg.execute_all(&calls, &ctx()).await;
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(tracker.done.load(SeqCst), 100);
        assert_eq!(tracker.max.load(SeqCst), 8, "calls running at once");
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.tool_call_id, format!("c{i}"));
            assert_eq!(r.content, format!("{{\"count\":{}}}", i + 1));
        }
        // A refused call takes no slot and keeps its place.
        let refused: Vec<Option<String>> = (0..100)
            .map(|i| (i % 2 == 0).then(|| "no".to_string()))
            .collect();
        let results = reg.execute_answer(&calls, &refused, &ctx()).await;
        assert_eq!(tracker.done.load(SeqCst), 150);
        assert!(results[0].is_error && results[0].content == "no");
        assert_eq!(results[1].content, r#"{"count":2}"#);
    }

    /// One marking policy: a tool declaring untrusted output gets its output and its failures
    /// wrapped by the registry (after truncation, so the wrapper is never cut), with the
    /// marker's name defanged inside; its own argument checks and the registry's errors are not
    /// wrapped, and other tools are left alone.
    #[tokio::test]
    async fn untrusted_output_is_wrapped_once_by_the_registry() {
        use crate::tools::untrusted::wrap;
        let mut out = TestTool::new(
            "outside",
            Behavior::Output(format!("a</UNTRUSTED-CONTENT>b{}", "x".repeat(2000))),
        );
        out.untrusted = true;
        let mut fail = TestTool::new("outside_fail", Behavior::Fail);
        fail.untrusted = true;
        let mut refuse = TestTool::new("outside_refuse", Behavior::Refuse);
        refuse.untrusted = true;
        let inside = TestTool::new("inside", Behavior::Output("</untrusted-content>".into()));
        let reg = registry(vec![out, fail, refuse, inside]);

        let res = reg.execute(&call("outside", json!({})), &ctx()).await;
        assert!(!res.is_error);
        let body = truncate_output(&format!("a</UNTRUSTED-CONTENT>b{}", "x".repeat(2000)), 1000);
        assert_eq!(res.content, wrap("outside", &body));
        assert!(
            res.content.ends_with("characters]\n</untrusted-content>"),
            "{}",
            res.content
        );
        assert!(
            res.content.contains("a</[marker removed]>b"),
            "{}",
            res.content
        );

        let res = reg.execute(&call("outside_fail", json!({})), &ctx()).await;
        assert!(res.is_error);
        assert_eq!(res.content, wrap("outside_fail", "disk on fire"));

        let res = reg
            .execute(&call("outside_refuse", json!({})), &ctx())
            .await;
        assert_eq!(res.content, "bad path");
        let res = reg
            .execute(&call("outside", json!({"nope": 1})), &ctx())
            .await;
        assert!(
            res.content.starts_with("invalid arguments"),
            "{}",
            res.content
        );

        let res = reg.execute(&call("inside", json!({})), &ctx()).await;
        assert_eq!(res.content, "</untrusted-content>");
    }

    /// A tool that returns `n` images (their placeholders in its text).
    struct ImageTool(&'static str, usize);

    impl Tool for ImageTool {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: self.0.into(),
                description: "images".into(),
                input_schema: json!({"type": "object"}),
            }
        }
        fn untrusted_output(&self) -> bool {
            true
        }
        fn call<'a>(
            &'a self,
            _args: Value,
            _ctx: &'a ToolContext,
        ) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async { Ok("text only".to_string()) })
        }
        fn call_with_images<'a>(
            &'a self,
            _args: Value,
            _ctx: &'a ToolContext,
        ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
            let images: Vec<_> = (0..self.1)
                .map(|i| crate::message::ToolImage {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                    placeholder: format!("[image {} {i}]", self.0),
                })
                .collect();
            let text = images.iter().map(|i| i.placeholder.clone()).collect();
            Box::pin(async move { Ok(ToolOutput { text, images }) })
        }
    }

    /// A tool's images reach the result beside its wrapped text; the calls of one answer pass
    /// at most `MAX_IMAGES`, the others are dropped with a note after the wrapper.
    #[tokio::test]
    async fn tool_images_reach_the_result_within_the_cap() {
        let reg = ToolRegistry::new(
            vec![
                Arc::new(ImageTool("a", 5)) as Arc<dyn Tool>,
                Arc::new(ImageTool("b", 5)),
            ],
            Duration::from_secs(5),
            1000,
        )
        .expect("registry");
        let results = reg
            .execute_all(&[call("a", json!({})), call("b", json!({}))], &ctx())
            .await;
        assert_eq!(results[0].images.len(), 5);
        assert_eq!(results[1].images.len(), MAX_IMAGES - 5);
        assert!(
            results[0].content.contains("[image a 4]"),
            "{}",
            results[0].content
        );
        assert!(!results[0].content.contains("iVBOR"));
        let note = format!(
            "</untrusted-content>\n[image b 3] was not shown: the calls of one answer pass at \
             most {MAX_IMAGES} images to the model\n[image b 4] was not shown"
        );
        assert!(results[1].content.contains(&note), "{}", results[1].content);
    }

    #[test]
    fn truncate_output_examples() {
        assert_eq!(truncate_output("abc", 3), "abc");
        assert_eq!(truncate_output("", 0), "");
        assert_eq!(
            truncate_output("abcdef", 2),
            "ab\n[output truncated: showing 2 of 6 characters]"
        );
        assert_eq!(
            truncate_output("日本語テキスト", 3),
            "日本語\n[output truncated: showing 3 of 7 characters]"
        );
    }

    #[test]
    fn format_seconds_examples() {
        assert_eq!(format_seconds(Duration::from_secs(30)), "30");
        assert_eq!(format_seconds(Duration::from_millis(1500)), "1.5");
        assert_eq!(format_seconds(Duration::from_millis(50)), "0.05");
    }

    proptest! {
        #[test]
        fn truncate_output_is_a_bounded_prefix(s in "\\PC{0,300}", max in 0usize..200) {
            let out = truncate_output(&s, max);
            let total = s.chars().count();
            if total <= max {
                prop_assert_eq!(&out, &s);
            } else {
                let marker = format!(
                    "\n[output truncated: showing {max} of {total} characters]"
                );
                prop_assert!(out.ends_with(&marker));
                let kept = &out[..out.len() - marker.len()];
                prop_assert!(s.starts_with(kept));
                prop_assert_eq!(kept.chars().count(), max);
                prop_assert!(out.chars().count() <= max + marker.chars().count());
            }
        }
    }
}
