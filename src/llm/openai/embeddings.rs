//! OpenAI-compatible embeddings (`POST {base_url}/embeddings`, not streamed): the request
//! body and the answer's parsing. Servers: OpenAI, Ollama, llama.cpp, vLLM, LM Studio, and the
//! like.

use serde::Deserialize;
use serde_json::json;

use crate::llm::{Embeddings, LlmError};

/// The request body for `texts`.
pub(super) fn render(model: &str, texts: &[String]) -> serde_json::Value {
    json!({ "model": model, "input": texts })
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
    #[serde(default)]
    usage: Option<AnswerUsage>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct AnswerUsage {
    #[serde(default)]
    prompt_tokens: u64,
}

/// Parse an answer for `expected` input texts: one vector per text, ordered by `index` (the
/// position in the list when a server omits it), all of one non-zero size.
pub(super) fn parse(body: &[u8], expected: usize, label: &str) -> Result<Embeddings, LlmError> {
    let decode = |message: String| LlmError::Decode {
        provider: label.to_string(),
        message,
    };
    let answer: Answer = serde_json::from_slice(body)
        .map_err(|e| decode(format!("embeddings answer is not the expected JSON: {e}")))?;
    if answer.data.len() != expected {
        return Err(decode(format!(
            "embeddings answer has {} vectors for {expected} inputs",
            answer.data.len()
        )));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (pos, item) in answer.data.into_iter().enumerate() {
        let i = item.index.unwrap_or(pos);
        let slot = slots
            .get_mut(i)
            .ok_or_else(|| decode(format!("embeddings answer has index {i} out of range")))?;
        if slot.replace(item.embedding).is_some() {
            return Err(decode(format!("embeddings answer repeats index {i}")));
        }
    }
    let vectors: Vec<Vec<f32>> = slots.into_iter().flatten().collect();
    let dims = vectors.first().map_or(0, Vec::len);
    if vectors.len() != expected || dims == 0 || vectors.iter().any(|v| v.len() != dims) {
        return Err(decode(
            "embeddings answer has missing, empty or differently sized vectors".into(),
        ));
    }
    if vectors.iter().flatten().any(|x| !x.is_finite()) {
        return Err(decode("embeddings answer has a non-finite number".into()));
    }
    let prompt_tokens = answer.usage.map_or(0, |u| u.prompt_tokens);
    if prompt_tokens > crate::message::MAX_TOKENS_PER_CALL {
        return Err(decode(format!(
            "embeddings usage prompt_tokens = {prompt_tokens} is not plausible for one call \
             (more than {}); the answer is refused and not billed",
            crate::message::MAX_TOKENS_PER_CALL
        )));
    }
    Ok(Embeddings {
        vectors,
        prompt_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_shape() {
        assert_eq!(
            render("m", &["a".into(), "b".into()]),
            json!({"model": "m", "input": ["a", "b"]})
        );
    }

    #[test]
    fn answers_are_ordered_by_index() {
        let body = br#"{"object":"list","data":[
            {"object":"embedding","index":1,"embedding":[0.0,1.0]},
            {"object":"embedding","index":0,"embedding":[1.0,0.0]}],
            "model":"m","usage":{"prompt_tokens":7,"total_tokens":7}}"#;
        let e = parse(body, 2, "x").unwrap();
        assert_eq!(e.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(e.prompt_tokens, 7);
        // No index, no usage (some local servers).
        let e = parse(br#"{"data":[{"embedding":[0.5]}]}"#, 1, "x").unwrap();
        assert_eq!((e.vectors, e.prompt_tokens), (vec![vec![0.5]], 0));
    }

    /// A usage figure beyond the per-call cap is a malformed answer (SPEC §16.9).
    #[test]
    fn implausible_usage_is_refused() {
        let body =
            br#"{"data":[{"embedding":[0.5]}],"usage":{"prompt_tokens":18446744073709551615}}"#;
        assert!(matches!(parse(body, 1, "x"), Err(LlmError::Decode { .. })));
        let body = br#"{"data":[{"embedding":[0.5]}],"usage":{"prompt_tokens":10000000}}"#;
        assert_eq!(parse(body, 1, "x").unwrap().prompt_tokens, 10_000_000);
    }

    use proptest::prelude::*;

    /// `n` vectors of `dims` finite numbers.
    fn vectors() -> impl Strategy<Value = Vec<Vec<f32>>> {
        (1usize..6, 1usize..8).prop_flat_map(|(n, dims)| {
            proptest::collection::vec(
                proptest::collection::vec(-1.0e6f32..1.0e6, dims..=dims),
                n..=n,
            )
        })
    }

    /// The answer an OpenAI-compatible server gives for `vectors`, items in the order `order`
    /// picks (servers may reorder; `index` says where each belongs), with or without usage.
    fn answer(vectors: &[Vec<f32>], order: &[usize], usage: Option<u64>) -> serde_json::Value {
        let mut idx: Vec<usize> = (0..vectors.len()).collect();
        let n = idx.len();
        for (i, o) in order.iter().enumerate() {
            idx.swap(i % n, o % n);
        }
        let data: Vec<serde_json::Value> = idx
            .iter()
            .map(|&i| json!({"object": "embedding", "index": i, "embedding": vectors[i]}))
            .collect();
        let mut a = json!({"object": "list", "data": data, "model": "m"});
        if let Some(t) = usage {
            a["usage"] = json!({"prompt_tokens": t, "total_tokens": t});
        }
        a
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Round trip: whatever order the server sends the items in, the vectors come back in
        /// input order, exactly.
        #[test]
        fn answers_round_trip_in_any_order(vs in vectors(),
                                           order in proptest::collection::vec(any::<usize>(), 0..8),
                                           usage in proptest::option::of(0u64..100_000)) {
            let body = answer(&vs, &order, usage).to_string();
            let got = parse(body.as_bytes(), vs.len(), "srv").unwrap();
            prop_assert_eq!(got.vectors, vs);
            prop_assert_eq!(got.prompt_tokens, usage.unwrap_or(0));
        }

        /// A broken answer (a field missing, a wrong type, an extra item, a string for a
        /// number) is a `Decode` error naming the server, or a well-formed result — never a
        /// panic, a short list or vectors of different sizes.
        #[test]
        fn broken_answers_are_decode_errors(vs in vectors(),
                                            edits in crate::proptest_json::edits(3)) {
            let doc = crate::proptest_json::mutate(&answer(&vs, &[], Some(1)), &edits);
            match parse(doc.to_string().as_bytes(), vs.len(), "srv (m)") {
                Ok(e) => {
                    prop_assert_eq!(e.vectors.len(), vs.len());
                    let dims = e.vectors[0].len();
                    prop_assert!(dims > 0 && e.vectors.iter().all(|v| v.len() == dims));
                    prop_assert!(e.vectors.iter().flatten().all(|x| x.is_finite()));
                }
                Err(err) => {
                    prop_assert!(matches!(err, LlmError::Decode { .. }), "{err:?}");
                    prop_assert!(err.to_string().contains("srv (m)"));
                }
            }
        }

        #[test]
        fn arbitrary_bytes_are_decode_errors(bytes in proptest::collection::vec(any::<u8>(), 0..300),
                                             n in 0usize..4) {
            if let Err(err) = parse(&bytes, n, "srv") {
                prop_assert!(matches!(err, LlmError::Decode { .. }), "{err:?}");
            }
        }
    }

    #[test]
    fn malformed_answers_are_decode_errors() {
        for (body, n) in [
            (&br#"{"data":[]}"#[..], 1),
            (
                br#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[1]}]}"#,
                2,
            ),
            (br#"{"data":[{"index":5,"embedding":[1]}]}"#, 1),
            (
                br#"{"data":[{"index":0,"embedding":[1]},{"index":1,"embedding":[1,2]}]}"#,
                2,
            ),
            (br#"{"data":[{"index":0,"embedding":[]}]}"#, 1),
            (b"<html>", 1),
        ] {
            let err = parse(body, n, "srv (m)").unwrap_err();
            assert!(matches!(err, LlmError::Decode { .. }), "{err}");
            assert!(err.to_string().contains("srv (m)"));
        }
    }
}
