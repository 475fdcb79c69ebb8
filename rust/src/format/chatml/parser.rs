//! The streaming ChatML parser: the assistant's text, cut into a message and
//! `<tool_call>` blocks.
//!
//! Tags are text here (SmolLM2 has no special tokens for them), so the parser works on
//! decoded characters: text is released as deltas except a tail that could still become
//! `\n<tool_call>`. A call is held until `</tool_call>` and then parsed as
//! `{"name": ..., "arguments": ...}`; its arguments arrive as one delta.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::format::output::{OpenKind, OutputItems, Utf8Tail};
use crate::format::{Outcome, OutputParser, ParseEvent};
use crate::item::Item;
use crate::tokenizer::Tokenizer;

const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";

#[derive(Debug)]
enum State {
    /// Free text; a message is open once some was released.
    Text,
    /// Inside `<tool_call>`, waiting for `</tool_call>`.
    Call,
    /// After a call: whitespace is skipped until the next call or text.
    AfterCall,
    Stopped,
    Failed(String),
}

#[derive(Deserialize)]
struct CallBody<'a> {
    name: Option<String>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

pub struct ChatMlParser {
    tokenizer: Arc<dyn Tokenizer>,
    stop: Vec<u32>,
    state: State,
    items: OutputItems,
    utf8: Utf8Tail,
    /// Decoded text not yet released.
    pending: String,
    output_tokens: usize,
}

/// Length of the longest suffix of `text` that could grow into `\n<tool_call>`.
fn tag_prefix_len(text: &str) -> usize {
    let with_newline = format!("\n{OPEN_TAG}");
    (1..with_newline.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && {
                let tail = &text[text.len() - n..];
                with_newline.starts_with(tail) || OPEN_TAG.starts_with(tail)
            }
        })
        .unwrap_or(0)
}

impl ChatMlParser {
    pub fn new(tokenizer: Arc<dyn Tokenizer>, stop: Vec<u32>) -> ChatMlParser {
        ChatMlParser {
            tokenizer,
            stop,
            state: State::Text,
            items: OutputItems::default(),
            utf8: Utf8Tail::default(),
            pending: String::new(),
            output_tokens: 0,
        }
    }

    fn release_text(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        if text.is_empty() {
            return;
        }
        if self.items.open_kind() != Some(OpenKind::Message) {
            self.items.start(OpenKind::Message, "", out);
        }
        self.items.push(text, out);
    }

    /// Move as much pending text as is decided into events.
    fn advance(&mut self, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        loop {
            match self.state {
                State::AfterCall => {
                    let rest = self.pending.trim_start();
                    if rest.is_empty() || (OPEN_TAG.starts_with(rest) && rest.len() < OPEN_TAG.len()) {
                        return Ok(());
                    }
                    self.pending = rest.to_owned();
                    self.state = State::Text;
                }
                State::Text => {
                    if let Some(at) = self.pending.find(OPEN_TAG) {
                        let text = &self.pending[..at];
                        // The template puts a newline between the text and the call.
                        let text = text.strip_suffix('\n').unwrap_or(text).to_owned();
                        self.release_text(&text, out);
                        self.items.close(out);
                        self.pending.drain(..at + OPEN_TAG.len());
                        self.state = State::Call;
                        continue;
                    }
                    let keep = tag_prefix_len(&self.pending);
                    let text: String = self.pending.drain(..self.pending.len() - keep).collect();
                    self.release_text(&text, out);
                    return Ok(());
                }
                State::Call => {
                    let Some(at) = self.pending.find(CLOSE_TAG) else {
                        return Ok(());
                    };
                    let body: String = self.pending.drain(..at + CLOSE_TAG.len()).collect();
                    self.call(&body[..at], out)?;
                    self.state = State::AfterCall;
                }
                State::Stopped | State::Failed(_) => return Ok(()),
            }
        }
    }

    fn call(&mut self, body: &str, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        let parsed: CallBody = serde_json::from_str(body.trim())
            .map_err(|e| format!("<tool_call> is not a JSON object: {e}"))?;
        let name = parsed
            .name
            .filter(|n| !n.is_empty())
            .ok_or("<tool_call> with no function name")?;
        let arguments = match parsed.arguments {
            // Some models write the arguments as a JSON string holding the object.
            Some(raw) => match serde_json::from_str::<String>(raw.get()) {
                Ok(inner) => inner,
                Err(_) => raw.get().to_owned(),
            },
            None => "{}".to_owned(),
        };
        self.items.start(OpenKind::Call, &name, out);
        self.items.push(&arguments, out);
        self.items.close(out);
        Ok(())
    }

    fn stop(&mut self, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if !self.utf8.is_empty() {
            return Err("output ended inside a UTF-8 character".to_owned());
        }
        match self.state {
            State::Call => return Err("unterminated <tool_call>".to_owned()),
            // What was held back as a possible tag is text after all.
            State::Text => {
                let text = std::mem::take(&mut self.pending);
                self.release_text(&text, out);
            }
            _ => {}
        }
        self.items.close(out);
        self.state = State::Stopped;
        Ok(())
    }

    fn step(&mut self, id: u32, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return Err(format!("token id {id} is outside the vocabulary"));
        }
        let name = || String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned();
        match self.state {
            State::Failed(_) => return Ok(()),
            State::Stopped => return Err(format!("token {:?} after the stop token", name())),
            _ => {}
        }
        if self.stop.contains(&id) {
            return self.stop(out);
        }
        if self.tokenizer.is_special(id) {
            return Err(format!("unexpected special token {} in the answer", name()));
        }
        self.utf8
            .push(self.tokenizer.token_bytes(id), &mut self.pending)?;
        self.advance(out)
    }
}

impl OutputParser for ChatMlParser {
    fn feed(&mut self, id: u32, out: &mut Vec<ParseEvent>) {
        self.output_tokens += 1;
        if let Err(message) = self.step(id, out) {
            self.state = State::Failed(message);
        }
    }

    fn finish(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        match &self.state {
            State::Failed(message) => Outcome::Malformed(message.clone()),
            State::Stopped => Outcome::Stopped,
            // Cut off: keep the text so far; an unfinished call is dropped.
            State::Text | State::Call | State::AfterCall => {
                if matches!(self.state, State::Text) {
                    let text = std::mem::take(&mut self.pending);
                    self.release_text(&text, out);
                }
                self.utf8.clear();
                self.items.close(out);
                self.state = State::AfterCall;
                self.pending.clear();
                Outcome::Truncated
            }
        }
    }

    fn items(&self) -> &[Item] {
        self.items.items()
    }

    fn stopped(&self) -> bool {
        matches!(self.state, State::Stopped)
    }

    fn output_tokens(&self) -> usize {
        self.output_tokens
    }

    fn reasoning_tokens(&self) -> usize {
        0
    }
}
