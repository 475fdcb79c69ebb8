//! The context budget: whether a request's prompt and its reserved output fit the
//! model's window, checked in O(1) from the cached and new token counts.
//!
//! (The open-call rule of protocol.md section 4 is the conversation's: it keeps the
//! still-open calls with its cached tokens, see `prompt_chain::admit_calls`.)

use crate::error::{Code, Error, Result};

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

    #[test]
    fn context_budget() {
        check_context_budget(100, 20, 8, 128).unwrap();
        let e = check_context_budget(100, 20, 9, 128).unwrap_err();
        assert_eq!(e.code, Code::ContextLengthExceeded);
        assert!(e.message.contains("129"), "{}", e.message);
        check_context_budget(usize::MAX, 1, 1, 10).unwrap_err();
    }
}
