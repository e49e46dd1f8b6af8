//! Values computed from one list of tool specs, kept while that list is current.
//! `ToolRegistry::specs` hands out the same `Arc<[ToolSpec]>` until the set of tools changes,
//! so a value derived from the list (its token estimate, its wire JSON) is made once per set
//! instead of once per call: serialising every schema per call was 9% of the daemon's
//! instructions for the estimate and 8% for the request body (measured with `perf`, in git history).

use std::sync::{Arc, Mutex, Weak};

use crate::llm::ToolSpec;

/// One value for the most recent list. Its identity is the key: the `Weak` keeps the list's
/// allocation, so no other list can take its address while it is remembered. A single slot:
/// callers that alternate between lists recompute, and are still right.
#[derive(Default)]
pub struct ToolListMemo<T>(Mutex<Option<Remembered<T>>>);

/// The list a value was made from, the tag it was made with, and the value.
type Remembered<T> = (Weak<[ToolSpec]>, u64, T);

impl<T: Clone> ToolListMemo<T> {
    pub const fn new() -> Self {
        ToolListMemo(Mutex::new(None))
    }

    /// The value for `specs`, from `compute` when this list has none yet. An error is
    /// returned and nothing remembered.
    pub fn try_get<E>(
        &self,
        specs: &Arc<[ToolSpec]>,
        compute: impl FnOnce(&[ToolSpec]) -> Result<T, E>,
    ) -> Result<T, E> {
        self.try_get_tagged(specs, 0, compute)
    }

    /// [`ToolListMemo::try_get`] of a value that also depends on `tag` (what else went into
    /// it: a provider's schema dialect); another tag recomputes.
    pub fn try_get_tagged<E>(
        &self,
        specs: &Arc<[ToolSpec]>,
        tag: u64,
        compute: impl FnOnce(&[ToolSpec]) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut memo = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((list, t, value)) = memo.as_ref()
            && std::ptr::eq(list.as_ptr(), Arc::as_ptr(specs))
            && *t == tag
        {
            return Ok(value.clone());
        }
        let value = compute(specs)?;
        *memo = Some((Arc::downgrade(specs), tag, value.clone()));
        Ok(value)
    }

    /// [`ToolListMemo::try_get`] of a computation that cannot fail.
    pub fn get(&self, specs: &Arc<[ToolSpec]>, compute: impl FnOnce(&[ToolSpec]) -> T) -> T {
        match self.try_get(specs, |s| Ok::<T, std::convert::Infallible>(compute(s))) {
            Ok(v) => v,
        }
    }
}

/// Ends a request body whose keys after "messages" were written by `rest` into `out` as an
/// object of their own, without the tool keys (the last keys of both wire formats): its
/// opening brace becomes the comma after "messages", and `"tool_choice"` (already serialised
/// as `choice`) and `"tools"` (the list's JSON array from `memo`, serialised once per list by
/// `tools_json`; `memo` with the tag of what else went into it) are spliced in before its
/// closing brace.
pub fn finish_body(
    out: &mut Vec<u8>,
    rest: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
    specs: &Arc<[ToolSpec]>,
    choice: &[u8],
    memo: (&ToolListMemo<Arc<[u8]>>, u64),
    tools_json: impl FnOnce(&[ToolSpec]) -> serde_json::Result<Vec<u8>>,
) -> serde_json::Result<()> {
    let start = out.len();
    rest(out)?;
    debug_assert!(out[start] == b'{' && out.last() == Some(&b'}'));
    out[start] = b',';
    if !specs.is_empty() {
        let (memo, tag) = memo;
        let tools = memo.try_get_tagged(specs, tag, |s| tools_json(s).map(Arc::from))?;
        out.pop();
        out.extend_from_slice(b",\"tool_choice\":");
        out.extend_from_slice(choice);
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(&tools);
        out.push(b'}');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn specs(name: &str) -> Arc<[ToolSpec]> {
        Arc::from(vec![ToolSpec {
            name: name.into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        }])
    }

    #[test]
    fn computed_once_per_list_and_again_for_another() {
        let memo = ToolListMemo::<usize>::new();
        let (a, b) = (specs("a"), specs("b"));
        let mut calls = 0;
        let mut get = |s: &Arc<[ToolSpec]>| {
            memo.get(s, |l| {
                calls += 1;
                l[0].name.len() + calls
            })
        };
        assert_eq!(get(&a), 2);
        assert_eq!(get(&a), 2, "the same list: remembered");
        assert_eq!(get(&b), 3, "another list: computed");
        assert_eq!(
            get(&a.clone()),
            4,
            "a clone of the Arc is the same list, but b replaced it"
        );
    }

    #[test]
    fn an_error_is_not_remembered() {
        let memo = ToolListMemo::<u8>::new();
        let a = specs("a");
        assert_eq!(memo.try_get(&a, |_| Err::<u8, _>("no")), Err("no"));
        assert_eq!(memo.try_get(&a, |_| Ok::<_, &str>(7)), Ok(7));
        assert_eq!(memo.try_get(&a, |_| Err::<u8, _>("no")), Ok(7));
    }
}
