//! The supervisor of one MCP server: connect (spawn through the sandbox helper, or over
//! HTTP), serve the connection (re-listing the tools when the server says they changed), and
//! restart it with [`Backoff`] when it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::PaginatedRequestParams;
use rmcp::service::{Peer, RoleClient, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use secrecy::ExposeSecret;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::Client;
use super::guard::{Guarded, Tripwire};
use super::{
    Handle, MAX_LIST_PAGES, MAX_TOOLS_PER_SERVER, RELIST_MIN_INTERVAL, RESTART_DELAYS,
    STABLE_AFTER, STOP_WAIT, Server, State, stdio,
};
use crate::backoff::Backoff;
use crate::config::McpTransport;

/// Cancel the servers' supervisors and wait for them (each at most [`STOP_WAIT`]); a
/// supervisor kills its child before it ends.
pub(super) async fn stop_all(handles: Vec<Handle>) {
    for h in &handles {
        h.cancel.cancel();
    }
    let waits = handles.into_iter().filter_map(|h| {
        let name = h.server.cfg.name.clone();
        h.task.map(|task| async move {
            if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
                tracing::warn!(server = %name, "MCP server did not stop in time");
            }
        })
    });
    futures::future::join_all(waits).await;
}

/// Keep one server running until `cancel` fires.
pub(super) async fn supervise(server: Arc<Server>, cancel: CancellationToken) {
    let name = server.cfg.name.clone();
    let mut backoff = Backoff::steps(&RESTART_DELAYS);
    loop {
        {
            let mut s = server.lock();
            s.state = State::Starting;
        }
        let started = tokio::select! {
            _ = cancel.cancelled() => return stopped(&server),
            r = connect(&server) => r,
        };
        match started {
            Ok(conn) => {
                tracing::info!(server = %name, tools = conn.tools.len(), "MCP server ready");
                {
                    let mut s = server.lock();
                    s.state = State::Ready;
                    s.peer = Some(conn.session.service.peer().clone());
                }
                // Tools first, then `settled`: whoever waited for it finds them in place.
                let _ = server.set_tools(conn.tools);
                server.lock().settled = true;
                server.settled.notify_waiters();
                let up_since = Instant::now();
                let why = match serve(&server, conn.session, &conn.relist, &cancel).await {
                    Ended::Stopped => return stopped(&server),
                    Ended::Closed(why) => why,
                };
                if up_since.elapsed() >= STABLE_AFTER {
                    backoff.reset();
                }
                let why = why.map_or_else(
                    || "connection closed".to_string(),
                    |w| format!("cut off: {w}"),
                );
                tracing::warn!(server = %name, "MCP server {why}; restarting");
                let mut s = server.lock();
                s.peer = None;
                s.last_error = Some(why);
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %e, "MCP server failed to start");
                {
                    let mut s = server.lock();
                    s.last_error = Some(e);
                    s.settled = true;
                }
                server.settled.notify_waiters();
            }
        }
        let delay = backoff.next_delay();
        {
            let mut s = server.lock();
            s.state = State::Backoff;
            s.restarts += 1;
        }
        tokio::select! {
            _ = cancel.cancelled() => return stopped(&server),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The state of a server whose supervisor was cancelled: no calls reach it any more.
fn stopped(server: &Server) {
    let mut s = server.lock();
    s.state = State::Disabled;
    s.peer = None;
    s.last_error = Some("stopped".to_string());
}

/// How a connection ended.
enum Ended {
    /// `cancel` fired: the server was stopped for good.
    Stopped,
    /// The connection closed, cut off by its guard when the reason is given.
    Closed(Option<String>),
}

/// Serve one connection until it closes or `cancel` fires, re-listing the tools when the
/// server says they changed. Either way the service and the process tree have ended when this
/// returns.
async fn serve(
    server: &Server,
    session: Session,
    relist: &Notify,
    cancel: &CancellationToken,
) -> Ended {
    let name = &server.cfg.name;
    let timeout = server.cfg.timeout;
    let Session {
        service,
        process,
        wire,
    } = session;
    let peer = service.peer().clone();
    let stop = service.cancellation_token();
    let waiting = service.waiting();
    tokio::pin!(waiting);
    let closed = server.closed.notified();
    tokio::pin!(closed);
    let mut last_relist: Option<Instant> = None;
    let mut finished = false;
    let ended = loop {
        tokio::select! {
            _ = cancel.cancelled() => break Ended::Stopped,
            _ = &mut closed => break Ended::Closed(wire.why()),
            _ = &mut waiting => {
                finished = true;
                break Ended::Closed(wire.why());
            }
            _ = relist.notified() => {
                let pause = last_relist
                    .map(|at| RELIST_MIN_INTERVAL.saturating_sub(at.elapsed()))
                    .unwrap_or_default();
                let listed = async {
                    tokio::time::sleep(pause).await;
                    tokio::time::timeout(timeout, list_tools(&peer, name)).await
                };
                let listed = tokio::select! {
                    _ = cancel.cancelled() => break Ended::Stopped,
                    r = listed => r,
                };
                last_relist = Some(Instant::now());
                match listed {
                    Ok(Ok(tools)) => {
                        let count = tools.len();
                        // A server may re-list every second: a line at INFO only for a change.
                        if server.set_tools(tools) {
                            tracing::info!(server = %name, tools = count, "MCP tools re-listed; the offer changed");
                        } else {
                            tracing::debug!(server = %name, tools = count, "MCP tools re-listed; unchanged");
                        }
                    }
                    Ok(Err(e)) => {
                        let e = server.scrub(&e.to_string());
                        tracing::warn!(server = %name, error = %e, "MCP tools/list failed; keeping the last list");
                    }
                    Err(_) => {
                        tracing::warn!(server = %name, "MCP tools/list timed out after {}s; keeping the last list", timeout.as_secs());
                    }
                }
            }
        }
    };
    stop.cancel();
    if !finished {
        let _ = tokio::time::timeout(STOP_WAIT, &mut waiting).await;
    }
    if let Some(p) = process {
        p.end().await;
    }
    ended
}

/// `tools/list`, every page, at most [`MAX_TOOLS_PER_SERVER`] tools and [`MAX_LIST_PAGES`]
/// pages; a longer list is cut with a warning.
async fn list_tools(
    peer: &Peer<RoleClient>,
    server: &str,
) -> Result<Vec<rmcp::model::Tool>, ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await?;
        tools.extend(page.tools);
        if tools.len() > MAX_TOOLS_PER_SERVER {
            break;
        }
        match page.next_cursor {
            None => return Ok(tools),
            Some(next) => cursor = Some(next),
        }
    }
    tracing::warn!(
        server = %server,
        max_tools = MAX_TOOLS_PER_SERVER,
        max_pages = MAX_LIST_PAGES,
        "MCP server lists too many tools; only the first are taken"
    );
    tools.truncate(MAX_TOOLS_PER_SERVER);
    Ok(tools)
}

type Running = rmcp::service::RunningService<RoleClient, Client>;

/// A started server: the session, its process (stdio), the wire its guard trips, its first
/// tool list, and the re-list signal.
struct Connection {
    session: Session,
    tools: Vec<rmcp::model::Tool>,
    relist: Arc<Notify>,
}

/// One connection to a server: rmcp's service over the [`Guarded`] transport, and for stdio
/// the process tree behind it.
struct Session {
    service: Running,
    process: Option<stdio::ServerProcess>,
    wire: Arc<Tripwire>,
}

impl Session {
    /// Stop the service and kill the process tree, waiting (bounded) for both: after this the
    /// server runs no more, so a restart never runs it twice.
    async fn end(self) {
        let Session {
            service, process, ..
        } = self;
        let stop = service.cancellation_token();
        stop.cancel();
        let _ = tokio::time::timeout(STOP_WAIT, service.waiting()).await;
        if let Some(p) = process {
            p.end().await;
        }
    }
}

/// Spawn the child (or connect), do the handshake and list its tools (bounded by the server
/// timeout). Every error text is scrubbed of the server URL's secrets.
async fn connect(server: &Server) -> Result<Connection, String> {
    let timeout = server.cfg.timeout;
    let relist = Arc::new(Notify::new());
    let session = start_session(server, relist.clone())
        .await
        .map_err(|e| server.scrub(&e))?;
    let listed = tokio::time::timeout(
        timeout,
        list_tools(session.service.peer(), &server.cfg.name),
    )
    .await;
    let tools = match listed {
        Ok(Ok(tools)) => tools,
        failed => {
            let why = match failed {
                Err(_) => format!("tools/list timed out after {}s", timeout.as_secs()),
                Ok(Err(e)) => format!("tools/list failed: {e}"),
                Ok(Ok(_)) => String::new(),
            };
            let why = session.wire.why().map_or(why, |w| format!("cut off: {w}"));
            session.end().await;
            return Err(server.scrub(&why));
        }
    };
    Ok(Connection {
        session,
        tools,
        relist,
    })
}

/// Spawn the child (or connect) and do the handshake, bounded by the server timeout.
async fn start_session(server: &Server, relist: Arc<Notify>) -> Result<Session, String> {
    let client = Client {
        relist,
        server: server.cfg.name.clone(),
        secrets: server.secrets(),
    };
    let timeout = server.cfg.timeout;
    let wire = Arc::new(Tripwire::default());
    let (command, args, env, cwd) = match &server.cfg.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => (command, args, env, cwd),
        McpTransport::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            for (k, v) in headers {
                let v = v.expose_secret();
                if k.eq_ignore_ascii_case("authorization") {
                    config.auth_header = Some(v.strip_prefix("Bearer ").unwrap_or(v).to_string());
                } else {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("headers: {k:?} is not a valid header name"))?;
                    let value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|_| format!("headers.{k}: not a valid header value"))?;
                    config.custom_headers.insert(name, value);
                }
            }
            let transport = Guarded::new(
                StreamableHttpClientTransport::from_config(config),
                wire.clone(),
            );
            let service = tokio::time::timeout(timeout, client.serve(transport))
                .await
                .map_err(|_| format!("initialize timed out after {}s", timeout.as_secs()))?
                .map_err(|e| format!("initialize failed: {e}"))?;
            return Ok(Session {
                service,
                process: None,
                wire,
            });
        }
    };
    let cmd = server
        .sandbox
        .command(&server.cfg, command, args, env, cwd.as_ref())?;
    let spawned = stdio::spawn(cmd, &server.cfg.name, server.task_only.clone())
        .map_err(|e| format!("cannot start `{command}`: {e}"))?;
    let transport = Guarded::new(
        AsyncRwTransport::new_client(spawned.stdout, spawned.stdin),
        wire.clone(),
    );
    let process = spawned.process;
    match tokio::time::timeout(timeout, client.serve(transport)).await {
        Ok(Ok(service)) => Ok(Session {
            service,
            process: Some(process),
            wire,
        }),
        failed => {
            process.end().await;
            // Let the stderr reader see the helper's last line.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The helper's own complaint (sandbox setup failed, command not found) explains a
            // failed handshake better than "connection closed".
            let why = spawned
                .setup_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            Err(match (failed, why) {
                (Err(_), _) => format!("initialize timed out after {}s", timeout.as_secs()),
                (Ok(Err(e)), Some(why)) => format!("initialize failed: {e} ({why})"),
                (Ok(Err(e)), None) => format!("initialize failed: {e}"),
                (Ok(Ok(_)), _) => "initialize failed".to_string(),
            })
        }
    }
}
