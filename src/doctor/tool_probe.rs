//! `doctor`'s tool-list probe (issue 38): each chat model gets one tiny request carrying the
//! daemon's whole tool list (`max_tokens` 1), as a message would. A provider whose grammar
//! refuses a tool schema (llama.cpp refused `maxLength: 2000`: every message failed) fails
//! here, naming the tool and the provider's error. The call is a real one: it goes through the
//! provider gateway (the budget check, the cost ledger).

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Check, Status, check};
use crate::config::Config;
use crate::cost::Ledger;
use crate::gateway::{Bill, CallError, ChatCall, Gateway};
use crate::llm::{ChatRequest, LlmError, ToolChoice, ToolSpec};
use crate::message::{Message, UserBlock};
use crate::metrics::Metrics;
use crate::store::{CallType, Db};
use crate::tools::outbound::{Address, FileKind, Outbound, PartError};

/// Tool-list checks of every loaded chat model; none when no chat model is loaded.
pub async fn run(cfg: &Config) -> Vec<Check> {
    if cfg.chat_models().next().is_none() {
        return Vec::new();
    }
    let specs = match tool_specs(cfg).await {
        Ok(s) => s,
        Err(e) => return vec![check("tool list", Status::Fail, e)],
    };
    let gateway = match Db::open(&cfg.paths.state_dir.join("agentd.db")) {
        Ok(db) => Gateway::new(cfg, Ledger::new(db, cfg), Arc::new(Metrics::new())),
        Err(e) => {
            return vec![check(
                "tool list",
                Status::Fail,
                format!("cannot open agentd.db to record the probe's cost: {e}"),
            )];
        }
    };
    let mut out = Vec::new();
    for spec in cfg.chat_models() {
        let name = format!("model {} tools", spec.name);
        out.push(match probe(&gateway, &spec.name, &specs).await {
            Ok(()) => check(
                name,
                Status::Pass,
                format!("accepts the {} tools in one request", specs.len()),
            ),
            Err(e) => check(name, Status::Fail, e),
        });
    }
    out
}

/// The tools a message would be offered: the daemon's own assembly, with the state it needs
/// in a throwaway directory (nothing of the real state is read or written) and the MCP
/// servers started as the daemon starts them.
async fn tool_specs(cfg: &Config) -> Result<Arc<[ToolSpec]>, String> {
    let dir = Scratch::new()?;
    let mut tmp = cfg.clone();
    tmp.paths.state_dir = dir.path().to_path_buf();
    let tmp = Arc::new(tmp);
    let db = Db::open(&dir.path().join("agentd.db")).map_err(|e| e.to_string())?;
    let sessions = Arc::new(
        crate::session::SessionStore::open(
            &dir.path().join("sessions"),
            cfg.agent.timezone.clone(),
        )
        .map_err(|e| e.to_string())?,
    );
    // Nothing calls a model here: the tools only need to exist for their schemas.
    let ledger = Ledger::new(db.clone(), &tmp);
    let gateway = Arc::new(Gateway::new(&tmp, ledger, Arc::new(Metrics::new())));
    let memory = match cfg.memory.enabled {
        true => {
            Some(crate::memory::Memory::open(&tmp, gateway.clone()).map_err(|e| e.to_string())?)
        }
        false => None,
    };
    let speaker = cfg.voice.tts_model.is_some().then(|| {
        Arc::new(crate::tools::tts::Speaker {
            gateway: gateway.clone(),
            cfg: cfg.voice.clone(),
            inbox: dir.path().join("inbox"),
        })
    });
    let cancel = tokio_util::sync::CancellationToken::new();
    let mcp = crate::tools::mcp::McpManager::start(
        &cfg.mcp_servers,
        crate::tools::mcp::McpSandbox::from_config(cfg),
        cancel.clone(),
    );
    // The probe sends the whole list: every server's tools first (bounded).
    mcp.wait_ready(std::time::Duration::from_secs(10)).await;
    let skills = Arc::new(crate::skills::SkillSet::load(
        &cfg.agent.skills.dir,
        &cfg.agent.skills.always_on,
    ));
    let outbound: Option<Arc<dyn Outbound>> = match crate::daemon::chat::any_enabled(cfg) {
        true => Some(Arc::new(NoSend)),
        false => None,
    };
    let live = crate::config::Live::new(tmp.clone());
    let deps = crate::tools::ToolDeps {
        contacts: crate::daemon::chat::contacts(&live),
        live,
        db,
        sessions,
        memory: memory.as_ref(),
        outbound,
        schedule_wake: Arc::new(tokio::sync::Notify::new()),
        mcp,
        extra: vec![Arc::new(crate::skills::LoadSkillTool { skills })],
        speaker,
    };
    let assembled = crate::tools::assemble(&tmp, deps).await;
    cancel.cancel();
    Ok(assembled?.registry.specs())
}

/// A private directory under the system's temporary directory, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        let path = std::env::temp_dir().join(format!("agentd-doctor-{}", uuid::Uuid::new_v4()));
        crate::fsutil::create_private_dir(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Scratch(path))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One request with `specs`; on a refusal, each tool alone, to name the ones refused.
async fn probe(gateway: &Gateway, model: &str, specs: &Arc<[ToolSpec]>) -> Result<(), String> {
    let whole = call(gateway, model, specs.clone()).await;
    let Err(e) = whole else {
        return Ok(());
    };
    if !refused(&e) {
        return Err(e.to_string());
    }
    let mut refused_tools = Vec::new();
    for spec in specs.iter() {
        if let Err(one) = call(gateway, model, Arc::from(vec![spec.clone()])).await
            && refused(&one)
        {
            refused_tools.push(format!("{} ({one})", spec.name));
        }
    }
    Err(match refused_tools.is_empty() {
        true => format!("refuses the whole tool list, no tool alone: {e}"),
        false => format!(
            "refuses tool(s) {}. Fix: set schema_keywords / schema_max_length in its provider \
             file (docs/configuration.md, \"Local models\"), or leave the tools out",
            refused_tools.join(", ")
        ),
    })
}

/// The provider answered that the request is wrong (not a network or budget problem).
fn refused(e: &CallError) -> bool {
    matches!(e, CallError::Failed(LlmError::Http { status, .. }) if (400..500).contains(status) && *status != 429)
}

/// One probe request to `model` through the gateway, billed to `doctor` outside any message.
async fn call(gateway: &Gateway, model: &str, tools: Arc<[ToolSpec]>) -> Result<(), CallError> {
    let req = ChatRequest {
        session_id: "doctor".into(),
        system: Vec::new(),
        messages: vec![Message::User {
            content: vec![UserBlock::Text {
                text: "Reply with OK.".into(),
            }],
        }],
        tools,
        tool_choice: ToolChoice::Auto,
        previous_messages: None,
        rendered: Default::default(),
        options: crate::message::call::CallOptions {
            max_tokens: Some(1),
            ..Default::default()
        },
        deltas: None,
        stable_ttl: None,
    };
    let call = ChatCall::new(model, CallType::Chat, Bill::outside("doctor"));
    let paid = gateway.chat(call, &req, &|_| {}).await?;
    match paid.out.fell_back {
        Some(f) => Err(CallError::Failed(LlmError::Stream {
            provider: model.to_string(),
            message: format!("answered by the fallback {}: {}", f.to, f.reason),
            after_content: false,
            retryable: false,
        })),
        None => Ok(()),
    }
}

/// An outbound channel that sends nothing: `message` and `react` only need to exist for their
/// schemas to be in the list.
struct NoSend;

impl Outbound for NoSend {
    fn parts(&self, _to: &Address, text: &str) -> Vec<String> {
        vec![text.to_string()]
    }
    fn send_part<'a>(
        &'a self,
        _to: &'a Address,
        _part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async { Err(PartError::Failed("doctor sends nothing".into())) })
    }
    fn send_file<'a>(
        &'a self,
        _to: &'a Address,
        _path: &'a std::path::Path,
        _kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async { Err(PartError::Failed("doctor sends nothing".into())) })
    }
    fn react<'a>(
        &'a self,
        _to: &'a Address,
        _message: &'a str,
        _emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async { Err(PartError::Failed("doctor sends nothing".into())) })
    }
    fn typing<'a>(&'a self, _to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn attempt_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
}
