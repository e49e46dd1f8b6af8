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

    use proptest::prelude::*;

    /// One event: an optional name and its data lines.
    type Ev = (Option<String>, Vec<String>);

    /// The printer: events as a server may frame them — `\n` or `\r\n` after any line,
    /// comment lines in between, `data:` with or without its optional space.
    fn print(events: &[Ev], crlf: &[bool], comments: &[bool]) -> Vec<u8> {
        let mut out = String::new();
        let mut k = 0;
        let mut eol = |out: &mut String| {
            out.push_str(if crlf[k % crlf.len()] { "\r\n" } else { "\n" });
            k += 1;
        };
        for (i, (name, lines)) in events.iter().enumerate() {
            if comments[i % comments.len()] {
                out.push_str(": keep-alive");
                eol(&mut out);
            }
            if let Some(n) = name {
                out.push_str(&format!("event: {n}"));
                eol(&mut out);
            }
            for l in lines {
                // The one space after the colon is optional unless the value starts with one.
                if l.starts_with(' ') || i % 2 == 0 {
                    out.push_str(&format!("data: {l}"));
                } else {
                    out.push_str(&format!("data:{l}"));
                }
                eol(&mut out);
            }
            eol(&mut out);
        }
        out.into_bytes()
    }

    fn any_event() -> impl Strategy<Value = Ev> {
        (
            proptest::option::of("[a-z_]{1,12}"),
            proptest::collection::vec("[^\r\n]{0,20}", 1..4),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Whatever the framing and wherever the network cuts the bytes (also inside a UTF-8
        /// character or between `\r` and `\n`), the parser gets each event once, in order, with
        /// its name (`message` when none) and its data lines joined by `\n`.
        #[test]
        fn events_survive_any_framing_and_chunking(
            events in proptest::collection::vec(any_event(), 0..8),
            crlf in proptest::collection::vec(any::<bool>(), 1..8),
            comments in proptest::collection::vec(any::<bool>(), 1..4),
            cuts in proptest::collection::vec(any::<usize>(), 0..30),
        ) {
            let bytes = print(&events, &crlf, &comments);
            let mut r = Recorder { eof_ok: true, ..Default::default() };
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            rt.block_on(testing::run_split(&bytes, &cuts, &mut r)).unwrap();
            let want: Vec<(String, String)> = events
                .iter()
                .map(|(n, lines)| (n.clone().unwrap_or_else(|| "message".into()), lines.join("\n")))
                .collect();
            prop_assert_eq!(r.events, want);
        }

        /// Arbitrary bytes never panic the framing layer: they end in events, a decode error
        /// or an early end of stream.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                                       cuts in proptest::collection::vec(any::<usize>(), 0..10)) {
            let mut r = Recorder::default();
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let _ = rt.block_on(testing::run_split(&bytes, &cuts, &mut r));
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
