//! Our side of each connection ([`Client`]): what a server's notifications do. A
//! `notifications/tools/list_changed` asks the supervisor to re-list (whether or not the server
//! advertised `tools.listChanged`; many at once make one re-list). Every notification a server
//! sends (log messages, progress, list and resource changes, task status, its own kinds) is
//! logged at DEBUG only, cut to [`MAX_LOGGED`] bytes and scrubbed of the server's secrets: a
//! server may send many, and they are its business, not the operator's.

use std::sync::Arc;

#[allow(
    deprecated,
    reason = "servers on protocol versions before SEP-2577 still send log messages"
)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    CancelledNotificationParam, CustomNotification, ProgressNotificationParam,
    ResourceUpdatedNotificationParam, TaskStatusNotificationParams,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RoleClient};
use tokio::sync::Notify;

use super::content::cut;

/// The most bytes of one notification's text that are logged.
const MAX_LOGGED: usize = 1024;

pub(super) struct Client {
    pub(super) relist: Arc<Notify>,
    /// The server's name, for the log.
    pub(super) server: String,
    /// The server's secrets ([`super::Server::secrets`]), kept out of the log.
    pub(super) secrets: Vec<String>,
}

impl Client {
    /// One DEBUG line for a notification of `kind` that says `text` (made only when DEBUG is
    /// on).
    fn log(&self, kind: &str, text: impl FnOnce() -> String) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let text = super::scrub(&cut(&text(), MAX_LOGGED), &self.secrets);
        tracing::debug!(server = %self.server, kind = %kind, "MCP notification: {text}");
    }
}

impl rmcp::ClientHandler for Client {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("tools/list_changed", String::new);
        self.relist.notify_one();
        std::future::ready(())
    }

    #[allow(
        deprecated,
        reason = "servers on protocol versions before SEP-2577 still send log messages"
    )]
    fn on_logging_message(
        &self,
        p: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("message", || {
            let logger = p.logger.as_deref().unwrap_or("-");
            format!("{:?} {logger}: {}", p.level, p.data)
        });
        std::future::ready(())
    }

    fn on_progress(
        &self,
        p: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("progress", || {
            let total = p.total.map(|t| format!("/{t}")).unwrap_or_default();
            let message = p.message.unwrap_or_default();
            format!("{}{total} {message}", p.progress)
        });
        std::future::ready(())
    }

    fn on_resource_updated(
        &self,
        p: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("resources/updated", || p.uri);
        std::future::ready(())
    }

    fn on_resource_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("resources/list_changed", String::new);
        std::future::ready(())
    }

    fn on_prompt_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("prompts/list_changed", String::new);
        std::future::ready(())
    }

    fn on_cancelled(
        &self,
        p: CancelledNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("cancelled", || p.reason.unwrap_or_default());
        std::future::ready(())
    }

    fn on_task_status(
        &self,
        p: TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("tasks/status", || format!("{:?}", p.task));
        std::future::ready(())
    }

    fn on_custom_notification(
        &self,
        n: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.log("custom", || n.method);
        std::future::ready(())
    }
}
