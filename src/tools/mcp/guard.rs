//! [`Guarded`]: the transport of every MCP connection (stdio and HTTP) wrapped so that one
//! server cannot grow the daemon without bound. rmcp answers each server-to-client request
//! (`ping`, …) in a task of its own and queues every answer until the server reads it, so a
//! flood of requests, or a server that never reads its answers, would hold memory for each one.
//! Here a server that sends more messages than its bucket allows ([`limits::MESSAGE_BURST`],
//! then [`limits::MESSAGES_PER_SECOND`]), leaves more than [`limits::MAX_PENDING_SENDS`]
//! answers unread, or lets one wait [`limits::SEND_STALL`], trips the wire: the connection ends
//! and the supervisor restarts the server with backoff, saying why.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::limits::{self, Bucket};

/// Why a connection was cut: set once, read by the supervisor.
#[derive(Default)]
pub(super) struct Tripwire {
    cut: CancellationToken,
    why: Mutex<Option<String>>,
}

impl Tripwire {
    pub fn trip(&self, why: String) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(why);
        }
        self.cut.cancel();
    }

    /// The reason, when the wire was tripped.
    pub fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub(super) struct Guarded<T> {
    inner: T,
    messages: Bucket,
    pending: Arc<Semaphore>,
    wire: Arc<Tripwire>,
}

impl<T> Guarded<T> {
    pub fn new(inner: T, wire: Arc<Tripwire>) -> Guarded<T> {
        Guarded {
            inner,
            messages: Bucket::new(
                limits::MESSAGE_BURST,
                limits::MESSAGES_PER_SECOND,
                Instant::now(),
            ),
            pending: Arc::new(Semaphore::new(limits::MAX_PENDING_SENDS)),
            wire,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Guarded<T> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let permit = self.pending.clone().try_acquire_owned();
        let wire = self.wire.clone();
        let send = self.inner.send(item);
        // Once the wire is tripped a message is dropped, not failed: the connection is going
        // down, and rmcp would log an error for each one.
        async move {
            let Ok(_permit) = permit else {
                wire.trip(format!(
                    "more than {} messages wait for the server to read them",
                    limits::MAX_PENDING_SENDS
                ));
                return Ok(());
            };
            let cut = wire.cut.clone();
            tokio::select! {
                sent = tokio::time::timeout(limits::SEND_STALL, send) => match sent {
                    Ok(sent) => sent.map_err(std::io::Error::other),
                    Err(_) => {
                        wire.trip(format!(
                            "a message waited {} s for the server to read it",
                            limits::SEND_STALL.as_secs()
                        ));
                        Ok(())
                    }
                },
                _ = cut.cancelled() => Ok(()),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let cut = self.wire.cut.clone();
        let message = tokio::select! {
            m = self.inner.receive() => m?,
            _ = cut.cancelled() => return None,
        };
        if !self.messages.take(1, Instant::now()) {
            self.wire.trip(format!(
                "it sent more than {} messages a second",
                limits::MESSAGES_PER_SECOND
            ));
            return None;
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await.map_err(std::io::Error::other)
    }
}
