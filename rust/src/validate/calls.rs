//! Open function calls of a conversation chain, and the context budget.
//!
//! A `function_call_output` must answer a `function_call` of the chain that has no
//! output yet: one the model made earlier (cached state) or one replayed earlier in the
//! same input. [`OpenCalls`] is that state; the conversation keeps it with its cached
//! tokens and clones it on fork. Both checks here are O(new items), never O(history).

use std::collections::HashMap;

use crate::error::{Code, Error, Result};
use crate::item::Item;

/// The function calls of a chain still waiting for their output, by call id, with their
/// function names. Answered calls leave the set, so it stays as small as the number of
/// calls in flight and a conversation can clone it per turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenCalls {
    calls: HashMap<String, String>,
}

impl OpenCalls {
    pub fn new() -> Self {
        Self::default()
    }

    /// Check `items` (new items, in order) against the chain and, only if all pass,
    /// record their calls and outputs. On error nothing changes.
    pub fn apply(&mut self, items: &[Item]) -> Result<()> {
        self.check(items)?;
        for item in items {
            match item {
                Item::FunctionCall { call_id, name, .. } => {
                    self.calls.insert(call_id.clone(), name.clone());
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    self.calls.remove(call_id);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The check of [`OpenCalls::apply`] without recording anything: a
    /// `function_call_output` must answer a call open before it (in the chain or earlier in
    /// `items`), and a `function_call` must not reuse the id of an open call.
    pub fn check(&self, items: &[Item]) -> Result<()> {
        // Calls this delta opened (false) or answered (true), by call id.
        let mut delta: HashMap<&str, bool> = HashMap::new();
        let open = |delta: &HashMap<&str, bool>, id: &str| match delta.get(id) {
            Some(answered) => !answered,
            None => self.calls.contains_key(id),
        };
        for (i, item) in items.iter().enumerate() {
            match item {
                Item::FunctionCall { call_id, .. } => {
                    if open(&delta, call_id) {
                        return Err(input_error(format!(
                            "input[{i}] is a function_call with call_id '{call_id}', but a call \
                             with this call_id is already waiting for its output."
                        )));
                    }
                    delta.insert(call_id, false);
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    if !open(&delta, call_id) {
                        return Err(input_error(format!(
                            "input[{i}] is a function_call_output for call_id '{call_id}', which \
                             is not an open function_call of this conversation (never made, or \
                             already answered)."
                        )));
                    }
                    delta.insert(call_id, true);
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn is_open(&self, call_id: &str) -> bool {
        self.calls.contains_key(call_id)
    }

    /// Function name of an open call.
    pub fn name(&self, call_id: &str) -> Option<&str> {
        self.calls.get(call_id).map(String::as_str)
    }

    /// Call ids waiting for an output (unordered).
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.calls.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Approximate heap bytes held, for the conversation's memory accounting.
    pub fn memory_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<(String, String)>() + 8;
        self.calls.capacity() * per_entry
            + self
                .calls
                .iter()
                .map(|(id, name)| id.capacity() + name.capacity())
                .sum::<usize>()
    }
}

fn input_error(message: String) -> Error {
    Error::new(Code::UnknownCallId, message).at("input")
}

/// The context budget, an O(1) check: the prompt (cached tokens + the delta's new
/// tokens) plus the room reserved for output must fit the model's window.
pub fn check_context_budget(
    cached_tokens: usize,
    new_tokens: usize,
    max_output_tokens: usize,
    context_window: usize,
) -> Result<()> {
    let prompt = cached_tokens.saturating_add(new_tokens);
    let needed = prompt.saturating_add(max_output_tokens);
    if needed <= context_window {
        return Ok(());
    }
    Err(Error::new(
        Code::ContextLengthExceeded,
        format!(
            "This model's context window is {context_window} tokens, but the request needs \
             {needed} ({cached_tokens} cached + {new_tokens} new prompt tokens + \
             {max_output_tokens} max_output_tokens). Shorten the input, start a new \
             conversation, or lower max_output_tokens."
        ),
    )
    .at("input"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str) -> Item {
        Item::FunctionCall {
            call_id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        }
    }

    fn output(id: &str) -> Item {
        Item::FunctionCallOutput {
            call_id: id.into(),
            output: "ok".into(),
        }
    }

    #[test]
    fn outputs_answer_calls_of_the_chain_or_the_same_input() {
        let mut calls = OpenCalls::new();
        calls.apply(&[call("a", "ls"), call("b", "cat")]).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls.name("a"), Some("ls"));
        calls.apply(&[output("a"), call("c", "rm"), output("c")]).unwrap();
        assert!(calls.is_open("b"));
        assert!(!calls.is_open("a") && !calls.is_open("c"));
        assert_eq!(calls.ids().collect::<Vec<_>>(), vec!["b"]);
        // An answered id may be used again by a later call.
        calls.apply(&[call("a", "ls"), output("a")]).unwrap();
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn failures_name_the_call_and_change_nothing() {
        let mut calls = OpenCalls::new();
        calls.apply(&[call("a", "ls")]).unwrap();
        let before = calls.clone();
        for (bad, at) in [
            (vec![output("zz")], "input[0]"),
            (vec![output("a"), output("a")], "input[1]"),
            (vec![call("a", "ls")], "input[0]"),
            (vec![call("n", "x"), call("n", "x")], "input[1]"),
        ] {
            let e = calls.apply(&bad).unwrap_err();
            assert_eq!(e.code, Code::UnknownCallId);
            assert_eq!(e.param.as_deref(), Some("input"));
            assert!(e.message.starts_with(at), "{}", e.message);
            assert_eq!(calls, before);
        }
        let e = calls.apply(&[output("zz")]).unwrap_err();
        assert!(e.message.contains("'zz'"), "{}", e.message);
    }

    proptest::proptest! {
        /// Against a model of the rule: an output answers a call open before it; a call
        /// may not reuse an open id; a failing delta changes nothing.
        #[test]
        fn apply_matches_the_rule_and_is_atomic(
            deltas in proptest::collection::vec(
                proptest::collection::vec((proptest::bool::ANY, 0u8..4), 0..5),
                1..8,
            )
        ) {
            let mut calls = OpenCalls::new();
            let mut model: Vec<String> = Vec::new();
            for delta in deltas {
                let items: Vec<Item> = delta
                    .iter()
                    .map(|&(is_call, id)| {
                        let id = format!("c{id}");
                        if is_call { call(&id, "f") } else { output(&id) }
                    })
                    .collect();
                let mut next = model.clone();
                let valid = items.iter().all(|item| match item {
                    Item::FunctionCall { call_id, .. } if !next.contains(call_id) => {
                        next.push(call_id.clone());
                        true
                    }
                    Item::FunctionCallOutput { call_id, .. } if next.contains(call_id) => {
                        next.retain(|c| c != call_id);
                        true
                    }
                    _ => false,
                });
                let before = calls.clone();
                let result = calls.apply(&items);
                proptest::prop_assert_eq!(result.is_ok(), valid);
                if valid {
                    model = next;
                } else {
                    proptest::prop_assert_eq!(&calls, &before);
                }
                let mut ids: Vec<_> = calls.ids().map(str::to_string).collect();
                ids.sort();
                let mut expected = model.clone();
                expected.sort();
                proptest::prop_assert_eq!(ids, expected);
            }
        }
    }

    #[test]
    fn context_budget() {
        check_context_budget(100, 20, 8, 128).unwrap();
        let e = check_context_budget(100, 20, 9, 128).unwrap_err();
        assert_eq!(e.code, Code::ContextLengthExceeded);
        assert!(e.message.contains("129"), "{}", e.message);
        check_context_budget(usize::MAX, 1, 1, 10).unwrap_err();
    }
}
