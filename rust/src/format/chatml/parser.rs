//! The streaming ChatML parser: the assistant's text, cut into a message and
//! `<tool_call>` blocks.
//!
//! Tags are text here (SmolLM2 has no special tokens for them), so the parser works on
//! decoded characters: text is released as deltas except a tail that could still become
//! `\n<tool_call>`. A call in the template's shape, `{"name": "...", "arguments": {...}}`,
//! starts once its name is read and streams its arguments as they arrive (a small JSON
//! scanner finds where the arguments object ends); any other shape is parsed whole at
//! `</tool_call>`. Either way the whole call is checked as JSON before it is done.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::format::call_json::{call_head, End, Head, ObjectScan, MAX_CALL_HEAD};
use crate::format::output::{Markup, OpenKind, OutputItems, SampledText};
use crate::format::{Outcome, ParseEvent};
use crate::item::Item;
use crate::tokenizer::Tokenizer;

const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";

#[derive(Debug)]
enum State {
    /// Free text; a message is open once some was released.
    Text,
    /// Inside `<tool_call>`; `body` is what was consumed of it so far, `searched` how
    /// much of the pending text is known not to hold `</tool_call>`.
    Call {
        body: String,
        part: CallPart,
        searched: usize,
    },
    /// After a call: whitespace is skipped until the next call or text.
    AfterCall,
    Stopped,
}

#[derive(Debug)]
enum CallPart {
    /// Before `"arguments": `: the name is not known yet.
    Head,
    /// Streaming the arguments object.
    Arguments(ObjectScan),
    /// After the arguments: the rest of the call up to `</tool_call>`.
    Tail,
    /// Not in the template's shape: parsed whole at `</tool_call>`.
    Whole,
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
    im_start: u32,
    state: State,
    items: OutputItems,
    text: SampledText,
    /// Decoded text not yet released.
    pending: String,
}

/// Length of the longest suffix of `text` that could grow into `\n<tool_call>`.
fn tag_prefix_len(text: &str) -> usize {
    const OPEN_LINE: &str = "\n<tool_call>";
    (1..OPEN_LINE.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && {
                let tail = &text[text.len() - n..];
                OPEN_LINE.starts_with(tail) || OPEN_TAG.starts_with(tail)
            }
        })
        .unwrap_or(0)
}

impl ChatMlParser {
    pub fn new(tokenizer: Arc<dyn Tokenizer>, stop: Vec<u32>, im_start: u32) -> ChatMlParser {
        ChatMlParser {
            tokenizer,
            stop,
            im_start,
            state: State::Text,
            items: OutputItems::default(),
            text: SampledText::default(),
            pending: String::new(),
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
                    let in_message = self.items.open_kind() == Some(OpenKind::Message);
                    if let Some(at) = self.pending.find(OPEN_TAG) {
                        let text = &self.pending[..at];
                        // The template puts a newline between the text and the call.
                        let text = text.strip_suffix('\n').unwrap_or(text).to_owned();
                        if in_message || !text.trim().is_empty() {
                            self.release_text(&text, out);
                        }
                        self.items.close(out);
                        self.pending.drain(..at + OPEN_TAG.len());
                        self.state = State::Call {
                            body: String::new(),
                            part: CallPart::Head,
                            searched: 0,
                        };
                        continue;
                    }
                    let ready = self.pending.len() - tag_prefix_len(&self.pending);
                    // Whitespace before anything else may still precede a call: no message yet.
                    if !in_message && self.pending[..ready].trim().is_empty() {
                        return Ok(());
                    }
                    let text: String = self.pending.drain(..ready).collect();
                    self.release_text(&text, out);
                    return Ok(());
                }
                State::Call { .. } => {
                    if !self.call_step(out)? {
                        return Ok(());
                    }
                }
                State::Stopped => return Ok(()),
            }
        }
    }

    /// Consume pending call text; true when the call is done and parsing moves on.
    fn call_step(&mut self, out: &mut Vec<ParseEvent>) -> Result<bool, String> {
        let State::Call { body, part, searched } = &mut self.state else {
            return Ok(true);
        };
        loop {
            match part {
                CallPart::Head => match call_head(&self.pending) {
                    Head::Matched(name, len) => {
                        if name.is_empty() {
                            return Err("<tool_call> with no function name".to_owned());
                        }
                        self.items.start(OpenKind::Call, &name, out);
                        body.extend(self.pending.drain(..len));
                        *part = CallPart::Arguments(ObjectScan::default());
                    }
                    Head::Mismatch => *part = CallPart::Whole,
                    Head::Incomplete
                        if self.pending.len() > MAX_CALL_HEAD || self.pending.contains(CLOSE_TAG) =>
                    {
                        *part = CallPart::Whole
                    }
                    Head::Incomplete => return Ok(false),
                },
                CallPart::Arguments(scan) => {
                    let (delta, taken, end) = scan.scan(&self.pending);
                    self.items.push(&delta, out);
                    body.extend(self.pending.drain(..taken));
                    match end {
                        Some(End::Object) => *part = CallPart::Tail,
                        // A value that is not an object is left for the whole-call parse.
                        Some(End::NotObject) => *part = CallPart::Whole,
                        None => return Ok(false),
                    }
                }
                CallPart::Tail | CallPart::Whole => {
                    // Search only what arrived since the last token (plus a tag's overlap), so
                    // a long call costs linear time.
                    let mut from = searched.saturating_sub(CLOSE_TAG.len() - 1);
                    while !self.pending.is_char_boundary(from) {
                        from -= 1;
                    }
                    let Some(at) = self.pending[from..].find(CLOSE_TAG).map(|at| at + from) else {
                        *searched = self.pending.len();
                        return Ok(false);
                    };
                    body.extend(self.pending.drain(..at));
                    self.pending.drain(..CLOSE_TAG.len());
                    let whole = matches!(part, CallPart::Whole);
                    let body = std::mem::take(body);
                    self.finish_call(&body, whole, out)?;
                    self.state = State::AfterCall;
                    return Ok(true);
                }
            }
        }
    }

    /// Check the whole call as JSON; a call not streamed so far is emitted now.
    fn finish_call(&mut self, body: &str, whole: bool, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        let parsed: CallBody = serde_json::from_str(body.trim())
            .map_err(|e| format!("<tool_call> is not a JSON object: {e}"))?;
        let name = parsed
            .name
            .filter(|n| !n.is_empty())
            .ok_or("<tool_call> with no function name")?;
        if whole {
            let arguments = match parsed.arguments {
                // Some models write the arguments as a JSON string holding the object.
                Some(raw) => match serde_json::from_str::<String>(raw.get()) {
                    Ok(inner) => inner,
                    Err(_) => raw.get().to_owned(),
                },
                None => "{}".to_owned(),
            };
            if self.items.open_kind() != Some(OpenKind::Call) {
                self.items.start(OpenKind::Call, &name, out);
            }
            self.items.push(&arguments, out);
        }
        self.items.close(out);
        Ok(())
    }

    fn stop(&mut self, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if !self.text.is_complete() {
            return Err("output ended inside a UTF-8 character".to_owned());
        }
        match self.state {
            State::Call { .. } => return Err("unterminated <tool_call>".to_owned()),
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
}

impl Markup for ChatMlParser {
    fn read(&mut self, id: u32, out: &mut Vec<ParseEvent>) -> Result<(), String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return Err(format!("token id {id} is outside the vocabulary"));
        }
        let name = || String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned();
        if let State::Stopped = self.state {
            return Err(format!("token {:?} after the stop token", name()));
        }
        if self.stop.contains(&id) {
            return self.stop(out);
        }
        if id == self.im_start {
            return Err("<|im_start|> in the answer: the model began another turn".to_owned());
        }
        // Any other special token is text: vocabularies give tags such as Qwen's
        // `<tool_call>` a token of their own, which the model samples as one.
        self.text.push(self.tokenizer.as_ref(), id, &mut self.pending)?;
        self.advance(out)
    }

    fn end(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        match self.state {
            State::Stopped => Outcome::Stopped,
            // Cut off: keep the text so far; a call cut off after its name is closed with the
            // arguments streamed so far (the response is incomplete either way).
            State::Text | State::Call { .. } | State::AfterCall => {
                if matches!(self.state, State::Text) {
                    let text = std::mem::take(&mut self.pending);
                    self.release_text(&text, out);
                }
                self.text.clear();
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

    fn reasoning_tokens(&self) -> usize {
        0
    }
}
