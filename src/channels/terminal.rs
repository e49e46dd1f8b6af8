//! The terminal channel of `agentd chat` (SPEC §5.1): each stdin line is a message from source
//! `terminal` (session `terminal`), accepted durably like any other; the reply is printed on
//! stdout.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::agent::Finish;
use crate::daemon::intake::IntakeHandler;
use crate::daemon::workers::Dispatcher;
use crate::session::Intake;

/// Read lines until end of input or `stop`.
pub async fn run(intake: Arc<IntakeHandler>, dispatcher: Arc<Dispatcher>, stop: CancellationToken) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    let _ = out
        .write_all(b"agentd chat: type a message, Ctrl-D to quit\n> ")
        .await;
    let _ = out.flush().await;
    loop {
        let line = tokio::select! {
            _ = stop.cancelled() => return,
            l = lines.next_line() => match l {
                Ok(Some(l)) => l,
                Ok(None) | Err(_) => return,
            },
        };
        let text = line.trim();
        if text.is_empty() {
            let _ = out.write_all(b"> ").await;
            let _ = out.flush().await;
            continue;
        }
        let id = uuid::Uuid::now_v7().to_string();
        let done = dispatcher.wait_for(&id);
        let intake_item = Intake {
            id: id.clone(),
            source: "terminal".into(),
            from: "terminal".into(),
            text: text.to_string(),
            tier: None,
            attachments: vec![],
            route: None,
        };
        let answer = match intake.accept("terminal", intake_item).await {
            Err(e) => {
                dispatcher.forget(&id);
                format!("[error] {e}")
            }
            Ok(()) => tokio::select! {
                _ = stop.cancelled() => return,
                c = done => match c.map(|c| c.finish) {
                    Ok(Finish::Reply { text, silent: false, .. }) => text,
                    Ok(Finish::Reply { silent: true, .. }) => "(silent reply)".to_string(),
                    Ok(Finish::Failed { reply, .. }) => format!("[error] {reply}"),
                    Ok(Finish::Cancelled) | Err(_) => "[interrupted]".to_string(),
                },
            },
        };
        let _ = out.write_all(format!("{answer}\n> ").as_bytes()).await;
        let _ = out.flush().await;
    }
}
