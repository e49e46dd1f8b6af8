//! The render cache (`message::rendered`, SPEC §16.6) against full renders: for random
//! histories and random sequences of the operations that change a session's history —
//! appends (the user turn with its images swapped in, answers with a breakpoint position,
//! tool results), compaction, repairs (of stored calls, of dangling calls), the image
//! placeholder swap — every request rendered through the session's cache has exactly the bytes
//! of a full render, in both wire formats, and the cache never holds more entries than the
//! history has messages.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::{ModelSpec, ProviderKind};
use crate::llm::testutil::arb;
use crate::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice, ToolSpec};
use crate::message::rendered::{RenderCache, WireFormat};
use crate::message::{Message, ToolResult, UserBlock};
use crate::session::{Event, MessageEvent, SessionState, TrailLine};

#[derive(Debug, Clone)]
enum Op {
    /// A user turn: recorded without images, then the copy with images swapped in (as
    /// `Agent::run_message` does).
    User(Vec<UserBlock>),
    /// Any message recorded as it is; `sent` is the answer's `sent_messages`.
    Append(Message, Option<usize>),
    ToolResults(Vec<ToolResult>, Option<String>),
    Compact(usize, String),
    /// `SessionState::repair_tool_calls`.
    RepairHistory,
    /// Error results for the last message's calls (`Agent::repair_dangling`).
    RepairDangling,
    /// The end of a message: images become placeholders.
    StripImages,
    /// A call: the request rendered through the cache in both formats, with this position of
    /// the previous call's end (or the state's), these tools and this system prompt.
    Render(Box<Call>),
}

#[derive(Debug, Clone)]
struct Call {
    previous: Option<Option<usize>>,
    anthropic: ModelSpec,
    openai: ModelSpec,
    system: Vec<(bool, String)>,
}

fn op() -> impl Strategy<Value = Op> {
    let image =
        (arb::text(), arb::text(), arb::text()).prop_map(|(media_type, data, placeholder)| {
            UserBlock::Image {
                media_type,
                data,
                placeholder,
            }
        });
    let block = prop_oneof![
        3 => arb::text().prop_map(|text| UserBlock::Text { text }),
        1 => image,
    ];
    let result =
        (arb::text(), arb::text(), any::<bool>()).prop_map(|(tool_call_id, content, is_error)| {
            ToolResult {
                tool_call_id,
                content,
                is_error,
                images: Vec::new(),
            }
        });
    prop_oneof![
        3 => vec(block, 0..4).prop_map(Op::User),
        3 => (arb::message(), proptest::option::of(0usize..12)).prop_map(|(m, s)| Op::Append(m, s)),
        2 => (vec(result, 0..3), proptest::option::of(arb::text()))
            .prop_map(|(r, n)| Op::ToolResults(r, n)),
        1 => (0usize..8, arb::text()).prop_map(|(n, s)| Op::Compact(n, s)),
        1 => Just(Op::RepairHistory),
        1 => Just(Op::RepairDangling),
        2 => Just(Op::StripImages),
        5 => (
            proptest::option::of(proptest::option::of(0usize..14)),
            arb::spec(ProviderKind::Anthropic),
            arb::spec(ProviderKind::OpenAi),
            vec((any::<bool>(), arb::text()), 0..3),
        )
            .prop_map(|(previous, anthropic, openai, system)| Op::Render(Box::new(Call {
                previous,
                anthropic,
                openai,
                system,
            }))),
    ]
}

fn record(state: &mut SessionState, event: Event) {
    let line = TrailLine {
        v: 1,
        seq: state.last_seq + 1,
        ts: "2026-11-03T14:05:00+00:00".into(),
        event,
    };
    state.apply(&line);
}

/// Tool lists a session's calls may carry: none, one, two with an escaped description.
static TOOL_LISTS: std::sync::LazyLock<[std::sync::Arc<[ToolSpec]>; 3]> = std::sync::LazyLock::new(
    || {
        let spec = |name: &str, description: &str| ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: serde_json::json!({"type": "object", "properties": {"p": {"type": "string"}}}),
        };
        [
            Vec::new().into(),
            vec![spec("read", "Read")].into(),
            vec![spec("read", "Read"), spec("write", "Write \"x\"\n\u{e9}")].into(),
        ]
    },
);

/// One call as `agent::run` makes it: history and cache lent to the request, given back after.
fn render(
    state: &mut SessionState,
    previous: Option<Option<usize>>,
    specs: (&ModelSpec, &ModelSpec),
    system: &[(bool, String)],
) -> Result<(), TestCaseError> {
    let n = state.messages.len();
    let req = ChatRequest {
        options: Default::default(),
        deltas: None,
        stable_ttl: None,
        session_id: "s".into(),
        system: system
            .iter()
            .map(|(stable, text)| SystemBlock {
                tier: if *stable {
                    SystemTier::Stable
                } else {
                    SystemTier::SemiStable
                },
                text: text.clone(),
            })
            .collect(),
        messages: std::mem::take(&mut state.messages),
        // The same few lists in turn, as the registry hands them out (one `Arc` per set), so
        // the renderers' per-list JSON (`tool_memo`) is both reused and replaced.
        tools: TOOL_LISTS[(n / 4) % TOOL_LISTS.len()].clone(),
        tool_choice: if n % 5 == 4 {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        },
        previous_messages: previous.unwrap_or(state.previous_messages),
        rendered: std::mem::take(&mut state.rendered),
    };
    let mut full = req.clone();
    full.rendered = RenderCache::default();
    let outcome = (|| {
        prop_assert_eq!(
            String::from_utf8(crate::llm::anthropic::render_body(specs.0, &req).unwrap()).unwrap(),
            String::from_utf8(crate::llm::anthropic::render_body(specs.0, &full).unwrap()).unwrap()
        );
        prop_assert_eq!(
            String::from_utf8(crate::llm::openai::render_body(specs.1, &req).unwrap()).unwrap(),
            String::from_utf8(crate::llm::openai::render_body(specs.1, &full).unwrap()).unwrap()
        );
        // Bounded by the history: one entry per message and format at most.
        for format in [WireFormat::Anthropic, WireFormat::OpenAi] {
            prop_assert_eq!(req.rendered.len(format), req.messages.len());
        }
        Ok(())
    })();
    state.messages = req.messages;
    state.rendered = req.rendered;
    outcome
}

fn apply(state: &mut SessionState, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::User(content) => {
            let msg = Message::User { content };
            record(
                state,
                Event::Message(MessageEvent::new(msg.without_images())),
            );
            let last = state.messages.len() - 1;
            state.replace_message(last, msg);
        }
        Op::Append(message, sent) => {
            let mut ev = MessageEvent::new(message);
            ev.sent_messages = sent;
            record(state, Event::Message(ev));
        }
        Op::ToolResults(results, notice) => record(state, Event::ToolResult { results, notice }),
        Op::Compact(removed, summary) => record(state, Event::Compaction { summary, removed }),
        Op::RepairHistory => {
            state.repair_tool_calls();
        }
        Op::RepairDangling => {
            let results: Vec<ToolResult> = state
                .messages
                .last()
                .map(Message::tool_calls)
                .unwrap_or_default()
                .iter()
                .map(|c| ToolResult {
                    tool_call_id: c.id.clone(),
                    content: "error: did not finish".into(),
                    is_error: true,
                    images: Vec::new(),
                })
                .collect();
            if !results.is_empty() {
                record(
                    state,
                    Event::ToolResult {
                        results,
                        notice: None,
                    },
                );
            }
        }
        Op::StripImages => state.strip_images(),
        Op::Render(call) => render(
            state,
            call.previous,
            (&call.anthropic, &call.openai),
            &call.system,
        )?,
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A cached render is a full render, whatever happened to the history in between.
    #[test]
    fn cached_render_equals_full_render(
        history in vec(arb::message(), 0..10),
        ops in vec(op(), 1..40),
        first in (arb::spec(ProviderKind::Anthropic), arb::spec(ProviderKind::OpenAi)),
    ) {
        let mut state = SessionState::new("s", "k", "primary", 0);
        for m in history {
            record(&mut state, Event::Message(MessageEvent::new(m)));
        }
        // The history is rendered (and cached) before the first operation.
        render(&mut state, None, (&first.0, &first.1), &[])?;
        for op in ops {
            apply(&mut state, op)?;
        }
        render(&mut state, None, (&first.0, &first.1), &[])?;
    }
}

/// The cache is what makes the second call cheap: after a call, only the new messages are
/// rendered (the others are served from it), and the snapshot's clone carries none of it.
#[test]
fn a_second_call_renders_only_the_new_messages() {
    let spec = crate::llm::testutil::model_spec("p", ProviderKind::Anthropic, "http://x");
    let openai = crate::llm::testutil::model_spec("o", ProviderKind::OpenAi, "http://x");
    let mut state = SessionState::new("s", "k", "primary", 0);
    for i in 0..20 {
        record(
            &mut state,
            Event::Message(MessageEvent::new(Message::user_text(format!("q{i}")))),
        );
    }
    render(&mut state, None, (&spec, &openai), &[]).unwrap();
    assert_eq!(state.rendered.len(WireFormat::Anthropic), 20);
    let before = state.rendered.bytes();
    record(
        &mut state,
        Event::Message(MessageEvent::new(Message::user_text("new"))),
    );
    render(&mut state, None, (&spec, &openai), &[]).unwrap();
    assert_eq!(state.rendered.len(WireFormat::Anthropic), 21);
    assert!(state.rendered.bytes() > before);
    assert!(state.clone().rendered.is_empty());
    // Compaction empties it; the next call fills it again.
    record(
        &mut state,
        Event::Compaction {
            summary: "sum".into(),
            removed: 10,
        },
    );
    assert!(state.rendered.is_empty());
    render(&mut state, None, (&spec, &openai), &[]).unwrap();
    assert_eq!(state.rendered.len(WireFormat::OpenAi), 12);
}
