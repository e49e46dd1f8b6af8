//! The MCP `ServerHandler`: what a client can list, call, read and subscribe to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, RequestId, ResourceUpdatedNotificationParam, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use super::McpOptions;
use super::resources::{self, MONITOR_URI};
use crate::api::backend::ApiBackend;

/// How often a subscription to the monitor looks for a change.
const MONITOR_POLL: Duration = Duration::from_millis(500);

/// One MCP session's handler (HTTP makes one per session, stdio one per process).
pub struct AgentdMcp {
    pub(super) backend: Arc<dyn ApiBackend>,
    pub(super) opts: Arc<McpOptions>,
    /// The `ask` calls in flight: request id → session key, so `notifications/cancelled`
    /// stops the work (a client that merely goes away stops nothing).
    pub(super) running: Arc<Mutex<HashMap<RequestId, String>>>,
    /// Ends the monitor subscription (also when the session ends: see `Drop`).
    watch: Mutex<Option<CancellationToken>>,
    shutdown: CancellationToken,
}

impl AgentdMcp {
    pub(super) fn new(
        backend: Arc<dyn ApiBackend>,
        opts: Arc<McpOptions>,
        shutdown: CancellationToken,
    ) -> AgentdMcp {
        AgentdMcp {
            backend,
            opts,
            running: Arc::default(),
            watch: Mutex::new(None),
            shutdown,
        }
    }

    /// Watch the monitor for this session's subscriber; one watcher at most.
    fn watch_monitor(&self, peer: Peer<RoleServer>) {
        let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
        if watch.is_some() {
            return;
        }
        let token = self.shutdown.child_token();
        *watch = Some(token.clone());
        let backend = self.backend.clone();
        tokio::spawn(async move {
            let mut last = backend.monitor().await.ok();
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(MONITOR_POLL) => {}
                }
                let now = backend.monitor().await.ok();
                if now != last {
                    last = now;
                    let note = ResourceUpdatedNotificationParam::new(MONITOR_URI);
                    if peer.notify_resource_updated(note).await.is_err() {
                        return;
                    }
                }
            }
        });
    }

    fn unwatch(&self) {
        let watch = self
            .watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = watch {
            t.cancel();
        }
    }
}

impl Drop for AgentdMcp {
    fn drop(&mut self) {
        self.unwatch();
    }
}

impl ServerHandler for AgentdMcp {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .build();
        ServerConfig::new(caps)
            .with_server_info(Implementation::new("agentd", crate::VERSION))
            .with_instructions(format!(
                "{}: an always-on AI agent. `ask` sends a message to a session and waits for the \
                 reply; `send` queues one; the other tools read its sessions, memory and costs.",
                self.opts.agent_name
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(super::tools::list(
            self.opts.allow_approvals,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        super::tools::call(self, request, context)
            .await
            .map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(
            resources::list(&self.opts).await,
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(self, &request.uri).await.map(Into::into)
    }

    #[allow(
        deprecated,
        reason = "the clients of today subscribe with resources/subscribe"
    )]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if request.uri != MONITOR_URI {
            return Err(McpError::invalid_params(
                format!("only {MONITOR_URI} can be subscribed to"),
                None,
            ));
        }
        self.watch_monitor(context.peer);
        Ok(())
    }

    #[allow(deprecated, reason = "the pair of `subscribe`")]
    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.unwatch();
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(
            resources::prompts(&self.opts).await,
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        resources::prompt(&self.opts, &request.name)
            .await
            .map(Into::into)
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let Some(id) = notification.request_id else {
            return;
        };
        let key = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some(key) = key {
            tracing::info!(session_key = %key, "MCP client cancelled an ask: stopping the message");
            if let Err(e) = self.backend.stop(key).await {
                tracing::warn!(error = %e, "MCP cancellation: cannot stop the message");
            }
        }
    }
}
