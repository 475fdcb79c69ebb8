//! Open function calls of a conversation chain, and the context budget.
//!
//! A `function_call_output` must answer a `function_call` of the chain that has no
//! output yet: one the model made earlier (cached state) or one replayed earlier in the
//! same input. [`OpenCalls`] is that state; the conversation keeps it with its cached
//! tokens and clones it on fork. Both checks here are O(new items), never O(history).

use std::collections::HashMap;

use crate::error::{Code, Error, Result};
use crate::item::Item;

/// Function calls of a chain by call id: their function name and whether an output
/// answered them. Answered calls stay known so a tool result can still name its function.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenCalls {
    calls: HashMap<String, Call>,
    open: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    name: String,
    answered: bool,
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
                    self.calls.insert(
                        call_id.clone(),
                        Call {
                            name: name.clone(),
                            answered: false,
                        },
                    );
                    self.open += 1;
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    if let Some(call) = self.calls.get_mut(call_id) {
                        call.answered = true;
                        self.open -= 1;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The check of [`OpenCalls::apply`] without recording anything.
    pub fn check(&self, items: &[Item]) -> Result<()> {
        // Calls opened or answered by this delta, by call id (true = answered).
        let mut delta: HashMap<&str, bool> = HashMap::new();
        for item in items {
            match item {
                Item::FunctionCall { call_id, .. } => {
                    let open_before = self.is_open(call_id);
                    if open_before || delta.get(call_id.as_str()) == Some(&false) {
                        return Err(input_error(format!(
                            "Duplicate function call '{call_id}': a call with this call_id is \
                             already waiting for its output."
                        )));
                    }
                    delta.insert(call_id, false);
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    let open = match delta.get(call_id.as_str()) {
                        Some(answered) => !answered,
                        None => self.is_open(call_id),
                    };
                    if !open {
                        let why = if self.calls.contains_key(call_id) || delta.contains_key(call_id.as_str())
                        {
                            "that call already has an output"
                        } else {
                            "no function call with this call_id was made in this conversation"
                        };
                        return Err(input_error(format!(
                            "No open function call found for function_call_output with call_id \
                             '{call_id}': {why}."
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
        self.calls.get(call_id).is_some_and(|c| !c.answered)
    }

    /// Function name of a call of this chain (answered or not).
    pub fn name(&self, call_id: &str) -> Option<&str> {
        self.calls.get(call_id).map(|c| c.name.as_str())
    }

    /// Call ids still waiting for an output (unordered).
    pub fn open_ids(&self) -> impl Iterator<Item = &str> {
        self.calls
            .iter()
            .filter(|(_, c)| !c.answered)
            .map(|(id, _)| id.as_str())
    }

    pub fn open_count(&self) -> usize {
        self.open
    }

    /// Approximate heap bytes held, for the conversation's memory accounting.
    pub fn memory_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<(String, Call)>() + 8;
        self.calls.capacity() * per_entry
            + self
                .calls
                .iter()
                .map(|(id, c)| id.capacity() + c.name.capacity())
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
        assert_eq!(calls.open_count(), 2);
        calls.apply(&[output("a"), call("c", "rm"), output("c")]).unwrap();
        assert!(calls.is_open("b"));
        assert!(!calls.is_open("a") && !calls.is_open("c"));
        assert_eq!(calls.name("a"), Some("ls"));
        assert_eq!(calls.open_ids().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(calls.open_count(), 1);
    }

    #[test]
    fn failures_name_the_call_and_change_nothing() {
        let mut calls = OpenCalls::new();
        calls.apply(&[call("a", "ls")]).unwrap();
        let before = calls.clone();
        for bad in [
            vec![output("zz")],
            vec![output("a"), output("a")],
            vec![call("a", "ls")],
            vec![call("n", "x"), call("n", "x")],
        ] {
            let e = calls.apply(&bad).unwrap_err();
            assert_eq!(e.code, Code::UnknownCallId);
            assert_eq!(e.param.as_deref(), Some("input"));
            assert_eq!(calls, before);
        }
        let e = calls.apply(&[output("zz")]).unwrap_err();
        assert!(e.message.contains("'zz'"), "{}", e.message);
        calls.apply(&[output("a")]).unwrap();
        let e = calls.apply(&[output("a")]).unwrap_err();
        assert!(e.message.contains("already has an output"), "{}", e.message);
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
