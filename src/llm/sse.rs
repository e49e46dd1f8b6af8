//! Server-sent events: feeds the events of a byte stream to a provider's parser, with an
//! inactivity timeout on every chunk. Framing (CRLF, multi-line `data:`, comments, UTF-8 split
//! across chunks) is eventsource-stream's job; what the events mean is the parser's.

use std::fmt::Display;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::LlmError;

/// A provider's stream parser: it receives one SSE event at a time.
pub(crate) trait SseHandler {
    /// Handle one event (`event` is the SSE event name, `message` when the server sent none).
    /// Returns `Ok(true)` when this was the terminal event of the response.
    fn on_event(&mut self, event: &str, data: &str) -> Result<bool, LlmError>;

    /// Whether content (text, thinking or tool-call deltas) has arrived: a failure after that
    /// is not retried, since the model already produced (and billed) output.
    fn saw_content(&self) -> bool;

    /// Whether a stream that ends without its terminal event still carried a complete answer
    /// (lenient servers). Default: no.
    fn accept_eof(&self) -> bool {
        false
    }
}

/// Drive `handler` over `bytes` until it reports the terminal event. Waiting more than
/// `inactivity` for the next chunk is `LlmError::Timeout`; a stream that ends early is a
/// `LlmError::Stream` (retryable when no content had arrived).
pub(crate) async fn drive<S, B, E, H>(
    bytes: S,
    handler: &mut H,
    provider: &str,
    inactivity: Duration,
) -> Result<(), LlmError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Display,
    H: SseHandler,
{
    let events = bytes.eventsource();
    let mut events = std::pin::pin!(events);
    loop {
        let next = tokio::time::timeout(inactivity, events.next())
            .await
            .map_err(|_| LlmError::Timeout {
                provider: provider.to_string(),
                seconds: inactivity.as_secs(),
                after_content: handler.saw_content(),
            })?;
        match next {
            None if handler.accept_eof() => return Ok(()),
            None => {
                return Err(LlmError::Stream {
                    provider: provider.to_string(),
                    message: "the stream ended before the response was complete".into(),
                    after_content: handler.saw_content(),
                    retryable: true,
                });
            }
            Some(Err(EventStreamError::Transport(e))) => {
                return Err(LlmError::Stream {
                    provider: provider.to_string(),
                    message: e.to_string(),
                    after_content: handler.saw_content(),
                    retryable: true,
                });
            }
            Some(Err(e)) => {
                return Err(LlmError::Decode {
                    provider: provider.to_string(),
                    message: format!("invalid event stream: {e}"),
                });
            }
            Some(Ok(event)) => {
                if handler.on_event(&event.event, &event.data)? {
                    return Ok(());
                }
            }
        }
    }
}

/// Test helpers: run a parser over a transcript cut into chunks.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Feed `transcript` split at `cuts` (byte offsets, any order, duplicates allowed).
    pub(crate) async fn run_split<H: SseHandler>(
        transcript: &[u8],
        cuts: &[usize],
        handler: &mut H,
    ) -> Result<(), LlmError> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (transcript.len() + 1)).collect();
        points.push(0);
        points.push(transcript.len());
        points.sort_unstable();
        points.dedup();
        let chunks: Vec<Result<Vec<u8>, String>> = points
            .windows(2)
            .map(|w| Ok(transcript[w[0]..w[1]].to_vec()))
            .collect();
        drive(
            futures::stream::iter(chunks),
            handler,
            "test",
            Duration::from_secs(5),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records events; terminal on `stop`.
    #[derive(Default)]
    struct Recorder {
        events: Vec<(String, String)>,
        eof_ok: bool,
    }

    impl SseHandler for Recorder {
        fn on_event(&mut self, event: &str, data: &str) -> Result<bool, LlmError> {
            self.events.push((event.to_string(), data.to_string()));
            Ok(event == "stop")
        }
        fn saw_content(&self) -> bool {
            !self.events.is_empty()
        }
        fn accept_eof(&self) -> bool {
            self.eof_ok
        }
    }

    #[tokio::test]
    async fn framing_crlf_comments_and_multiline_data() {
        let t = b": comment\r\nevent: a\r\ndata: x\r\ndata: y\r\n\r\ndata: plain\n\nevent: stop\ndata: {}\n\n";
        let mut r = Recorder::default();
        testing::run_split(t, &[], &mut r).await.unwrap();
        assert_eq!(
            r.events,
            vec![
                ("a".into(), "x\ny".into()),
                ("message".into(), "plain".into()),
                ("stop".into(), "{}".into())
            ]
        );
    }

    #[tokio::test]
    async fn early_end_is_a_retryable_stream_error_before_content() {
        let mut r = Recorder::default();
        let err = testing::run_split(b"", &[], &mut r).await.unwrap_err();
        assert!(matches!(
            err,
            LlmError::Stream {
                after_content: false,
                retryable: true,
                ..
            }
        ));
        assert!(err.is_retryable());

        let mut r = Recorder::default();
        let err = testing::run_split(b"data: 1\n\n", &[], &mut r)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            LlmError::Stream {
                after_content: true,
                ..
            }
        ));
        assert!(!err.is_retryable());

        let mut r = Recorder {
            eof_ok: true,
            ..Default::default()
        };
        testing::run_split(b"data: 1\n\n", &[], &mut r)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn transport_error_maps_to_stream_error() {
        let chunks: Vec<Result<&[u8], String>> = vec![
            Ok(b"data: 1\n\n".as_slice()),
            Err("connection reset".to_string()),
        ];
        let mut r = Recorder::default();
        let err = drive(
            futures::stream::iter(chunks),
            &mut r,
            "p",
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        match err {
            LlmError::Stream {
                message,
                after_content,
                ..
            } => {
                assert!(message.contains("connection reset"));
                assert!(after_content);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn inactivity_timeout() {
        let first = futures::stream::iter(vec![Ok::<_, String>(b"data: 1\n\n".to_vec())]);
        let stalled = first.chain(futures::stream::pending());
        let mut r = Recorder::default();
        let err = drive(stalled, &mut r, "p", Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            LlmError::Timeout {
                seconds: 30,
                after_content: true,
                ..
            }
        ));
    }
}
