//! The provider gateway (SPEC §6, §8): the one way to call a model provider. [`Gateway`] owns
//! the clients (`llm::Llm`: the model's resolution, the §6 retries, the `fallback` list), the
//! cost ledger and the metrics, and every call of every kind takes the same four steps:
//!
//! 1. the budget check ([`Bill`]: `Ledger::check_call` for a call of a message, under the
//!    message's call gate; `Ledger::gate` for one outside any message): refused, nothing is sent;
//! 2. the call, with its retries (a failed call writes nothing);
//! 3. its cost row (`Ledger::record_call` in tokens, `Ledger::record_audio` per minute or per
//!    character), written before the call gate opens again;
//! 4. the metrics (`Metrics::llm_call`: the call, its tokens, its cost, its duration), so
//!    `agentd_cost_usd_total` is the ledger's sum.
//!
//! Adding a kind of call is one method here that builds its call and its [`Charge`]. Nothing
//! else holds a client: `tests/it/architecture.rs` fails on `Llm`, `Provider`, `provider_for`, a
//! client type or an `llm::audio` call named outside `llm/` and this file.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::{Config, ModelSet, ModelSpec};
use crate::cost::{AudioCall, BudgetError, CallPermit, Ledger};
use crate::llm::audio::{AudioFile, Speech};
use crate::llm::{ChatOutcome, ChatRequest, EmbedOutcome, Llm, LlmError, LlmEvent};
use crate::message::Usage;
use crate::metrics::Metrics;
use crate::store::CallType;

/// Who pays for a call, and the budget check it passes before it is made.
#[derive(Debug, Clone, Copy)]
pub struct Bill<'a> {
    /// The session the cost row is billed to (`""` for none).
    pub session: &'a str,
    /// Checked against the spend of the session's message in flight, under its call gate.
    in_message: bool,
}

impl<'a> Bill<'a> {
    /// A call made for the message in flight in `session` (if any): the daily, monthly and
    /// per-message limits apply, and with a per-message limit the message's calls pass one
    /// at a time (`Ledger::check_call`).
    pub fn message(session: &'a str) -> Bill<'a> {
        Bill {
            session,
            in_message: true,
        }
    }

    /// A call made for no message (consolidation, a transcription at intake, `doctor`): the
    /// daily and monthly limits apply (`Ledger::gate`). Its row is still billed to `session`.
    pub fn outside(session: &'a str) -> Bill<'a> {
        Bill {
            session,
            in_message: false,
        }
    }
}

/// Why a call through the gateway did not answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The budget check refused (a limit is reached, or cost rows cannot be written): nothing
    /// was sent. The message names the limit and its key.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The call failed after its retries (and, for a chat, its fallbacks): no row was written.
    #[error(transparent)]
    Failed(#[from] LlmError),
    /// The caller's cancellation fired while the call waited or ran: no row was written.
    #[error("cancelled")]
    Cancelled,
}

/// A call's answer, with what it cost.
#[derive(Debug)]
pub struct Paid<T> {
    pub out: T,
    /// The cost of its row.
    pub cost_usd: f64,
    /// When it was sent (after its budget check).
    pub sent: Instant,
}

/// One chat call (streamed when the request carries a delta sink): the model, the row's kind,
/// who pays, and the options of a message's calls.
#[derive(Debug, Clone, Copy)]
pub struct ChatCall<'a> {
    pub model: &'a str,
    /// `chat`, `subagent`, `compaction` or `consolidation`.
    pub kind: CallType,
    pub bill: Bill<'a>,
    /// `[behavior] message_retries`: after the retries and fallbacks gave up on a transient
    /// error, the whole call is made again this many times (a message's calls; 0 elsewhere).
    pub message_retries: u32,
    /// Ends the wait for the budget check and the call; the row of an answered call is
    /// written regardless.
    pub cancel: Option<&'a CancellationToken>,
}

impl<'a> ChatCall<'a> {
    /// A call of `model` billed as `kind` by `bill`, without message retries or cancellation.
    pub fn new(model: &'a str, kind: CallType, bill: Bill<'a>) -> ChatCall<'a> {
        ChatCall {
            model,
            kind,
            bill,
            message_retries: 0,
            cancel: None,
        }
    }
}

/// A transcription (SPEC §19): the text, and the seconds billed.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcribed {
    pub text: String,
    /// The longer of the file's own length and the provider's count.
    pub seconds: f64,
}

/// What a call's cost row records.
enum Charge {
    /// Priced in tokens (`cost_per_mtok`); `fallback_from` names the model asked for when a
    /// fallback answered (SPEC §18.3).
    Tokens {
        spec: Arc<ModelSpec>,
        kind: CallType,
        usage: Usage,
        fallback_from: Option<String>,
    },
    /// Priced per minute of audio or per 1,000 characters (SPEC §19).
    Audio {
        spec: Arc<ModelSpec>,
        call: AudioCall,
    },
}

/// The provider clients with the ledger and the metrics (module docs). `Send + Sync`; share it
/// in an `Arc`.
pub struct Gateway {
    llm: Llm,
    ledger: Ledger,
    metrics: Arc<Metrics>,
    /// The waits before message-level retries: twice `[behavior] api_retry_base_delay` each.
    message_retry: Backoff,
}

impl Gateway {
    /// The clients of `cfg`'s models (`[behavior]` bounds and retries), recording into `ledger`
    /// and counting into `metrics`.
    pub fn new(cfg: &Config, ledger: Ledger, metrics: Arc<Metrics>) -> Gateway {
        Gateway {
            llm: Llm::new(cfg.models.clone(), &cfg.behavior),
            ledger,
            metrics,
            message_retry: Backoff::exponential(
                cfg.behavior.api_retry_base_delay * 2,
                cfg.behavior.api_retry_base_delay * 2,
            )
            .exact(),
        }
    }

    /// Given clients (unit tests of the layers above).
    #[cfg(test)]
    pub(crate) fn with_llm(llm: Llm, ledger: Ledger, metrics: Arc<Metrics>) -> Gateway {
        Gateway {
            llm,
            ledger,
            metrics,
            message_retry: Backoff::exponential(Duration::from_millis(2), Duration::from_millis(2))
                .exact(),
        }
    }

    /// Every defined model, loaded or skipped.
    pub fn models(&self) -> &ModelSet {
        self.llm.models()
    }

    /// The ledger the calls are checked against and recorded in.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The metrics the calls are counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A chat call (SPEC §6): retries, then the model's `fallback` list, then `call`'s message
    /// retries. `on_event` hears each retry and fallback.
    pub async fn chat(
        &self,
        call: ChatCall<'_>,
        req: &ChatRequest,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<Paid<ChatOutcome>, CallError> {
        let answer = async {
            let outcome = self
                .chat_retrying(call.model, req, on_event, call.message_retries)
                .await?;
            let charge = Charge::Tokens {
                spec: outcome.model.clone(),
                kind: call.kind,
                usage: outcome.response.usage,
                fallback_from: outcome.fell_back.as_ref().map(|f| f.from.clone()),
            };
            Ok((outcome, charge))
        };
        self.through(call.bill, call.cancel, answer).await
    }

    /// An embeddings request to `model` (SPEC §13): with the chat retries when `retry`, else
    /// one attempt; never a fallback model. Billed as `embedding` in input tokens.
    pub async fn embed(
        &self,
        bill: Bill<'_>,
        model: &str,
        texts: &[String],
        retry: bool,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<Paid<EmbedOutcome>, CallError> {
        let answer = async {
            let outcome = self.llm.embed(model, texts, retry, on_event).await?;
            let charge = Charge::Tokens {
                spec: outcome.model.clone(),
                kind: CallType::Embedding,
                usage: Usage {
                    input_tokens: outcome.embeddings.prompt_tokens,
                    ..Usage::default()
                },
                fallback_from: None,
            };
            Ok((outcome, charge))
        };
        self.through(bill, None, answer).await
    }

    /// Transcribe `audio` with `model` (SPEC §19), retried like a chat call, no fallback.
    /// `measured`: the file's length in seconds, read from its bytes; the bill is the longer
    /// of that and the provider's count, at the model's `cost_per_minute`.
    pub async fn transcribe(
        &self,
        bill: Bill<'_>,
        model: &str,
        audio: &AudioFile,
        measured: f64,
    ) -> Result<Paid<Transcribed>, CallError> {
        let answer = async {
            let (t, spec) = self.llm.transcribe(model, audio).await?;
            let seconds = t.seconds.map_or(measured, |s| s.max(measured));
            let call = AudioCall::Transcription { seconds };
            let text = t.text;
            Ok((Transcribed { text, seconds }, Charge::Audio { spec, call }))
        };
        self.through(bill, None, answer).await
    }

    /// Speak `text` in `voice` with `model` as OGG/Opus of at most `max_bytes` (SPEC §19),
    /// retried like a chat call, billed per character at the model's `cost_per_1k_chars`.
    pub async fn speak(
        &self,
        bill: Bill<'_>,
        model: &str,
        text: &str,
        voice: &str,
        max_bytes: usize,
    ) -> Result<Paid<Speech>, CallError> {
        let chars = text.chars().count();
        let answer = async {
            let (speech, spec) = self.llm.speak(model, text, voice, max_bytes).await?;
            let call = AudioCall::Speech { chars };
            Ok((speech, Charge::Audio { spec, call }))
        };
        self.through(bill, None, answer).await
    }

    /// The four steps of every call (module docs): check `bill`, make the call `answer`,
    /// write its row, count it. `cancel` ends the first two only.
    async fn through<T>(
        &self,
        bill: Bill<'_>,
        cancel: Option<&CancellationToken>,
        answer: impl Future<Output = Result<(T, Charge), LlmError>>,
    ) -> Result<Paid<T>, CallError> {
        let permit = until_cancelled(cancel, self.check(bill)).await??;
        let sent = Instant::now();
        let (out, charge) = until_cancelled(cancel, answer).await??;
        let took = sent.elapsed();
        let cost_usd = self.record(bill.session, &charge).await;
        drop(permit);
        self.count(&charge, cost_usd, took);
        Ok(Paid {
            out,
            cost_usd,
            sent,
        })
    }

    async fn check(&self, bill: Bill<'_>) -> Result<Option<CallPermit>, BudgetError> {
        if bill.in_message {
            self.ledger.check_call(bill.session).await.map(Some)
        } else {
            self.ledger.gate().await.map(|()| None)
        }
    }

    /// The call's row; its cost.
    async fn record(&self, session: &str, charge: &Charge) -> f64 {
        match charge {
            Charge::Tokens {
                spec,
                kind,
                usage,
                fallback_from,
            } => {
                let from = fallback_from.as_deref();
                (self.ledger)
                    .record_call(session, spec, *kind, *usage, from)
                    .await
            }
            Charge::Audio { spec, call } => self.ledger.record_audio(session, spec, *call).await,
        }
    }

    fn count(&self, charge: &Charge, cost_usd: f64, took: Duration) {
        let (spec, usage) = match charge {
            Charge::Tokens { spec, usage, .. } => (spec, *usage),
            Charge::Audio { spec, .. } => (spec, Usage::default()),
        };
        self.metrics.llm_call(&spec.model, &usage, cost_usd, took);
    }

    /// [`Llm::chat`], made again up to `retries` times on a transient error.
    async fn chat_retrying(
        &self,
        model: &str,
        req: &ChatRequest,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
        retries: u32,
    ) -> Result<ChatOutcome, LlmError> {
        let mut backoff = self.message_retry.clone();
        loop {
            match self.llm.chat(model, req, on_event).await {
                Err(e) if e.is_retryable() && backoff.failures() < retries => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, attempt = backoff.failures(), "message-level retry");
                    tokio::time::sleep(delay).await;
                }
                r => return r,
            }
        }
    }
}

/// `work`'s result, or `Cancelled` once `cancel` fires first.
async fn until_cancelled<T>(
    cancel: Option<&CancellationToken>,
    work: impl Future<Output = T>,
) -> Result<T, CallError> {
    match cancel {
        Some(c) => tokio::select! {
            biased;
            _ = c.cancelled() => Err(CallError::Cancelled),
            r = work => Ok(r),
        },
        None => Ok(work.await),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::*;
    use crate::config::{BudgetConfig, Pricing, ProviderKind};
    use crate::llm::testutil::{model_spec, sample_request};
    use crate::llm::{ChatResponse, Embeddings, Provider, StopReason};
    use crate::store::Db;

    /// Answers every chat with 1,000 input tokens (the `down` model fails with a 503 instead)
    /// and every embeddings request with 10 tokens; counts the calls.
    #[derive(Default)]
    struct Counted {
        calls: Mutex<u32>,
        down: bool,
    }

    impl Provider for Counted {
        fn chat<'a>(
            &'a self,
            _req: &'a ChatRequest,
        ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
            *self.calls.lock().unwrap() += 1;
            Box::pin(async move {
                if self.down {
                    return Err(LlmError::Http {
                        provider: "p".into(),
                        status: 503,
                        message: "down".into(),
                        retry_after: None,
                    });
                }
                Ok(ChatResponse {
                    text: "ok".into(),
                    tool_calls: vec![],
                    thinking: vec![],
                    stop_reason: StopReason::EndTurn,
                    usage: Usage {
                        input_tokens: 1000,
                        ..Usage::default()
                    },
                    model: "fake".into(),
                })
            })
        }

        fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, LlmError>> {
            *self.calls.lock().unwrap() += 1;
            Box::pin(async move {
                Ok(Embeddings {
                    vectors: texts.iter().map(|_| vec![1.0]).collect(),
                    prompt_tokens: 10,
                })
            })
        }
    }

    struct Fixture {
        dir: tempfile::TempDir,
        db: Db,
        gateway: Gateway,
        up: Arc<Counted>,
    }

    /// `primary` (falling back to `backup` when `down`) and `embeddings`, all at $1 per
    /// million input tokens, with `budget`.
    fn fixture(budget: BudgetConfig, down: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("agentd.db")).unwrap();
        let mut models = ModelSet::default();
        let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
        let up = Arc::new(Counted::default());
        for name in ["primary", "backup", "embeddings"] {
            let mut spec = model_spec(name, ProviderKind::OpenAi, "http://127.0.0.1:9");
            spec.pricing = Pricing {
                input: 1.0,
                ..Pricing::default()
            };
            let failing = name == "primary" && down;
            if failing {
                spec.fallback = vec!["backup".into()];
            }
            models.loaded.insert(name.into(), Arc::new(spec));
            let provider: Arc<dyn Provider> = match failing {
                true => Arc::new(Counted {
                    calls: Mutex::new(0),
                    down: true,
                }),
                false => up.clone(),
            };
            providers.insert(name.into(), provider);
        }
        let ledger = Ledger::for_tests(db.clone(), budget);
        let llm = Llm::with_providers(models, providers);
        let gateway = Gateway::with_llm(llm, ledger, Arc::new(Metrics::new()));
        Fixture {
            dir,
            db,
            gateway,
            up,
        }
    }

    fn metrics_cost(m: &Metrics) -> f64 {
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix("agentd_cost_usd_total "))
            .and_then(|v| v.trim().parse().ok())
            .expect("agentd_cost_usd_total")
    }

    fn no_events(_: LlmEvent) {}

    #[tokio::test]
    async fn every_call_writes_one_row_and_counts_its_cost() {
        let f = fixture(BudgetConfig::default(), false);
        let g = &f.gateway;
        let chat = ChatCall::new("primary", CallType::Chat, Bill::message("s"));
        let paid = g.chat(chat, &sample_request(), &no_events).await.unwrap();
        assert!((paid.cost_usd - 0.001).abs() < 1e-12, "{}", paid.cost_usd);
        let texts = vec!["a".to_string()];
        let e = g
            .embed(Bill::outside(""), "embeddings", &texts, true, &no_events)
            .await
            .unwrap();
        assert!((e.cost_usd - 0.00001).abs() < 1e-12, "{}", e.cost_usd);
        let summary = f.db.cost_summary(None).await.unwrap();
        assert!((summary.total_cost - 0.00101).abs() < 1e-12);
        assert!((metrics_cost(g.metrics()) - summary.total_cost).abs() < 1e-12);
        assert_eq!(*f.up.calls.lock().unwrap(), 2);
    }

    #[tokio::test]
    async fn a_spent_budget_sends_nothing_and_writes_nothing() {
        let f = fixture(BudgetConfig::default(), false);
        let g = &f.gateway;
        let chat = ChatCall::new("primary", CallType::Chat, Bill::message("s"));
        g.chat(chat, &sample_request(), &no_events).await.unwrap();
        g.ledger().set_budget(BudgetConfig {
            daily_usd: 0.001,
            ..BudgetConfig::default()
        });
        for bill in [Bill::message("s"), Bill::outside("s")] {
            let chat = ChatCall::new("primary", CallType::Consolidation, bill);
            let err = g
                .chat(chat, &sample_request(), &no_events)
                .await
                .unwrap_err();
            assert!(
                matches!(&err, CallError::Budget(BudgetError::Exceeded(_))),
                "{err:?}"
            );
            assert!(err.to_string().contains("daily budget of $0.001"), "{err}");
        }
        assert_eq!(*f.up.calls.lock().unwrap(), 1, "refused calls are not sent");
        let summary = f.db.cost_summary(None).await.unwrap();
        assert!((metrics_cost(g.metrics()) - summary.total_cost).abs() < 1e-12);
        assert!((summary.total_cost - 0.001).abs() < 1e-12);
    }

    #[tokio::test]
    async fn a_fallback_answer_names_the_model_asked_for_in_its_row() {
        let f = fixture(BudgetConfig::default(), true);
        let chat = ChatCall::new("primary", CallType::Compaction, Bill::message("s"));
        let paid = f
            .gateway
            .chat(chat, &sample_request(), &no_events)
            .await
            .unwrap();
        assert_eq!(paid.out.model.name, "backup");
        let conn = rusqlite::Connection::open(f.dir.path().join("agentd.db")).unwrap();
        let rows: Vec<(String, String, Option<String>)> = conn
            .prepare("SELECT call_type, model, fallback_from FROM costs")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            rows,
            [(
                "compaction".into(),
                "backup-model".into(),
                Some("primary".into())
            )],
            "one row, the failed call none"
        );
    }

    #[tokio::test]
    async fn a_cancelled_call_writes_nothing() {
        let f = fixture(BudgetConfig::default(), false);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let mut chat = ChatCall::new("primary", CallType::Chat, Bill::message("s"));
        chat.cancel = Some(&cancel);
        let err = f
            .gateway
            .chat(chat, &sample_request(), &no_events)
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Cancelled), "{err:?}");
        assert_eq!(*f.up.calls.lock().unwrap(), 0);
        assert_eq!(f.db.cost_summary(None).await.unwrap().total_cost, 0.0);
    }
}
