//! Server-sent events: feeds the events of a byte stream to a provider's parser, with an
//! inactivity timeout on every chunk and a cap on the reply's size. Framing (CRLF, multi-line
//! `data:`, comments, UTF-8 split across chunks) is eventsource-stream's job; what the events
//! mean is the parser's.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::{CallLimits, LlmError};

/// The raw event stream of one call may be this many times `max_reply_bytes`: the wire
/// wraps every few characters of content in a JSON event of a hundred bytes or more, and a
/// stream without line ends would otherwise be buffered whole.
pub(crate) const RAW_STREAM_FACTOR: usize = 64;

/// A provider's stream parser: it receives one SSE event at a time.
pub(crate) trait SseHandler {
    /// Handle one event (`event` is the SSE event name, `message` when the server sent none).
    /// Returns `Ok(true)` when this was the terminal event of the response.
    fn on_event(&mut self, event: &str, data: &str) -> Result<bool, LlmError>;

    /// Whether content (text, thinking or tool-call deltas) has arrived: a failure after that
    /// is not retried, since the model already produced (and billed) output.
    fn saw_content(&self) -> bool;

    /// Bytes of the reply accumulated so far: text, thinking, signatures and tool-call ids,
    /// names and inputs. Capped by `max_reply_bytes`.
    fn content_bytes(&self) -> usize;

    /// Whether a stream that ends without its terminal event still carried a complete answer
    /// (lenient servers). Default: no.
    fn accept_eof(&self) -> bool {
        false
    }
}

/// Drive `handler` over `bytes` until it reports the terminal event. Waiting more than
/// `limits.inactivity` for the next chunk is `LlmError::Timeout`; a stream that ends early is a
/// `LlmError::Stream` (retryable when no content had arrived); a reply beyond
/// `limits.max_reply_bytes` (or a raw stream beyond [`RAW_STREAM_FACTOR`] times that) is a
/// `LlmError::Decode`. The total deadline is the caller's (`http::stream_call`).
pub(crate) async fn drive<S, B, E, H>(
    bytes: S,
    handler: &mut H,
    provider: &str,
    limits: CallLimits,
) -> Result<(), LlmError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Display,
    H: SseHandler,
{
    let inactivity = limits.inactivity;
    let max = limits.max_reply_bytes;
    let too_large = |what: &str, limit: usize| LlmError::Decode {
        provider: provider.to_string(),
        message: format!(
            "{what} is larger than {limit} bytes; raise [behavior] max_reply_bytes ({max}) if \
             such replies are expected"
        ),
    };
    // Ends the byte stream once the raw cap is passed (and says so), so that not even one
    // event without a line end is buffered beyond it.
    let raw_cap = max.saturating_mul(RAW_STREAM_FACTOR);
    let over_raw = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&over_raw);
    let mut raw_seen = 0usize;
    let bytes = bytes.take_while(move |item| {
        if let Ok(chunk) = item {
            raw_seen = raw_seen.saturating_add(chunk.as_ref().len());
            if raw_seen > raw_cap {
                flag.store(true, Ordering::Relaxed);
                return std::future::ready(false);
            }
        }
        std::future::ready(true)
    });
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
            None if over_raw.load(Ordering::Relaxed) => {
                return Err(too_large("the event stream", raw_cap));
            }
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
                let done = handler.on_event(&event.event, &event.data)?;
                if handler.content_bytes() > max {
                    return Err(too_large("the reply", max));
                }
                if done {
                    return Ok(());
                }
            }
        }
    }
}

/// Test helpers: run a parser over a transcript cut into chunks.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    use super::*;

    /// `inactivity`, a deadline of a minute, replies up to 1 MiB.
    pub(crate) fn limits(inactivity: Duration) -> CallLimits {
        CallLimits {
            inactivity,
            deadline: Duration::from_secs(60),
            max_reply_bytes: 1024 * 1024,
        }
    }

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
            limits(Duration::from_secs(5)),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        fn content_bytes(&self) -> usize {
            self.events.iter().map(|(_, d)| d.len()).sum()
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
            testing::limits(Duration::from_secs(1)),
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
        let err = drive(
            stalled,
            &mut r,
            "p",
            testing::limits(Duration::from_secs(30)),
        )
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

    /// A reply beyond `max_reply_bytes` is refused as soon as it passes the cap, and a raw
    /// stream beyond the raw cap (here: one event that never ends its line) as well.
    #[tokio::test]
    async fn reply_and_raw_stream_caps() {
        let cap = |max_reply_bytes| CallLimits {
            max_reply_bytes,
            ..testing::limits(Duration::from_secs(5))
        };
        let events: Vec<Result<Vec<u8>, String>> = (0..100)
            .map(|_| Ok(format!("data: {}\n\n", "x".repeat(100)).into_bytes()))
            .collect();
        let mut r = Recorder::default();
        let err = drive(
            futures::stream::iter(events.clone()),
            &mut r,
            "p",
            cap(1000),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, LlmError::Decode { message, .. }
                if message.contains("the reply is larger than 1000 bytes")
                    && message.contains("max_reply_bytes")),
            "{err:?}"
        );
        assert!(!err.is_retryable());
        assert_eq!(
            r.events.len(),
            11,
            "stopped at the first event past the cap"
        );

        // Under the cap: every event arrives.
        let mut r = Recorder {
            eof_ok: true,
            ..Default::default()
        };
        drive(futures::stream::iter(events), &mut r, "p", cap(100_000))
            .await
            .unwrap();
        assert_eq!(r.events.len(), 100);

        // No line end, ever: cut at 64 × the cap, not buffered on.
        let endless = futures::stream::iter(std::iter::once(Ok::<_, String>(b"data: ".to_vec())))
            .chain(futures::stream::repeat_with(|| Ok(vec![b'x'; 4096])));
        let mut r = Recorder::default();
        let err = drive(endless, &mut r, "p", cap(1024)).await.unwrap_err();
        assert!(
            matches!(&err, LlmError::Decode { message, .. }
                if message.contains("the event stream is larger than 65536 bytes")),
            "{err:?}"
        );
        assert!(r.events.is_empty());
    }
}
