//! The output items a streaming parser is building: shared by every format's parser.
//!
//! A format's parser decides *what* the model is writing (a message, reasoning, a call)
//! from its own markup; this module owns the rest: item indices, minted call ids, the
//! start/delta/done events, the finished [`Item`]s, and UTF-8 safety of text deltas
//! (a delta never ends inside a multi-byte character; decoding is the tokenizer's),
//! and [`MarkupParser`], the [`OutputParser`] every format's [`Markup`] reader runs in.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Outcome, OutputParser, ParseEvent};
use crate::item::{Item, Role};
use crate::tokenizer::detok::StreamDecoder;
use crate::tokenizer::Tokenizer;

/// A fresh call id: `call_` + 24 random alphanumerics, as OpenAI mints them.
///
/// Randomness comes from std's per-process random SipHash keys mixed with a counter, so
/// ids never repeat within a process and differ across processes without a new
/// dependency. Ids only need to be unique, not secret.
pub fn mint_call_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let keys = RandomState::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    let mut word = 0u64;
    for i in 0..24u64 {
        if i % 8 == 0 {
            let mut h = keys.build_hasher();
            h.write_u64(n);
            h.write_u64(i);
            word = h.finish();
        }
        id.push(ALPHABET[(word % ALPHABET.len() as u64) as usize] as char);
        word /= ALPHABET.len() as u64;
    }
    id
}

/// The text of sampled tokens, released as whole characters by the tokenizer's
/// [`StreamDecoder`]. Unlike display decoding, bytes that are not UTF-8 are an error
/// here (the model wrote invalid output), so replacements are checked against the bytes.
#[derive(Debug, Default)]
pub struct SampledText {
    decoder: StreamDecoder,
}

impl SampledText {
    /// Decode one token; append the characters it completes to `text`.
    pub fn push(&mut self, tokenizer: &dyn Tokenizer, id: u32, text: &mut String) -> Result<(), String> {
        let held = self.decoder.pending().to_vec();
        let start = text.len();
        self.decoder.feed(tokenizer, &[id], text);
        let replaced = text[start..].matches(char::REPLACEMENT_CHARACTER).count();
        if replaced == 0 {
            return Ok(());
        }
        // U+FFFD the model actually wrote is the bytes EF BF BD; any other is a replacement.
        let mut consumed = held;
        consumed.extend_from_slice(tokenizer.token_bytes(id));
        consumed.truncate(consumed.len() - self.decoder.pending().len());
        let written = consumed
            .windows(3)
            .filter(|w| *w == "\u{FFFD}".as_bytes())
            .count();
        if replaced > written {
            return Err("invalid UTF-8 in model output".to_owned());
        }
        Ok(())
    }

    /// True when no bytes of an incomplete character are held back.
    pub fn is_complete(&self) -> bool {
        self.decoder.pending().is_empty()
    }

    /// Drop a held-back partial character (output cut off mid-character).
    pub fn clear(&mut self) {
        self.decoder = StreamDecoder::new();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenKind {
    Message,
    Reasoning,
    Call,
}

#[derive(Debug)]
struct Open {
    index: usize,
    kind: OpenKind,
    name: String,
    call_id: String,
    text: String,
}

/// The text of `event` when it is a delta of an item of `kind` at `index`.
fn delta_text(event: &mut ParseEvent, kind: OpenKind, index: usize) -> Option<&mut String> {
    match (event, kind) {
        (ParseEvent::TextDelta { index: at, text }, OpenKind::Message)
        | (ParseEvent::ReasoningDelta { index: at, text }, OpenKind::Reasoning)
        | (ParseEvent::ArgumentsDelta { index: at, text }, OpenKind::Call)
            if *at == index =>
        {
            Some(text)
        }
        _ => None,
    }
}

/// The items of one model turn, in output order, with at most one open item.
#[derive(Debug, Default)]
pub struct OutputItems {
    items: Vec<Item>,
    open: Option<Open>,
    next_index: usize,
}

impl OutputItems {
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    pub fn open_kind(&self) -> Option<OpenKind> {
        self.open.as_ref().map(|o| o.kind)
    }

    /// Start an item (closing any open one first). Calls get a freshly minted id.
    pub fn start(&mut self, kind: OpenKind, name: &str, out: &mut Vec<ParseEvent>) {
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        let call_id = if kind == OpenKind::Call {
            mint_call_id()
        } else {
            String::new()
        };
        out.push(match kind {
            OpenKind::Message => ParseEvent::MessageStart { index },
            OpenKind::Reasoning => ParseEvent::ReasoningStart { index },
            OpenKind::Call => ParseEvent::CallStart {
                index,
                name: name.to_owned(),
                call_id: call_id.clone(),
            },
        });
        self.open = Some(Open {
            index,
            kind,
            name: name.to_owned(),
            call_id,
            text: String::new(),
        });
    }

    /// Append text to the open item (a no-op when nothing is open or `text` is empty).
    /// Text that follows a delta of the same item in `out` extends that delta: the
    /// tokens an engine hands over together become one delta event, not one per token
    /// (clients concatenate deltas; their boundaries carry no meaning).
    pub fn push(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        let Some(open) = self.open.as_mut() else { return };
        if text.is_empty() {
            return;
        }
        open.text.push_str(text);
        let index = open.index;
        if let Some(delta) = out.last_mut().and_then(|last| delta_text(last, open.kind, index)) {
            delta.push_str(text);
            return;
        }
        let text = text.to_owned();
        out.push(match open.kind {
            OpenKind::Message => ParseEvent::TextDelta { index, text },
            OpenKind::Reasoning => ParseEvent::ReasoningDelta { index, text },
            OpenKind::Call => ParseEvent::ArgumentsDelta { index, text },
        });
    }

    /// Finish the open item, if any: its done event, and it joins `items`.
    pub fn close(&mut self, out: &mut Vec<ParseEvent>) {
        let Some(Open {
            index,
            kind,
            name,
            call_id,
            text,
        }) = self.open.take()
        else {
            return;
        };
        let (event, item) = match kind {
            OpenKind::Message => (
                ParseEvent::MessageDone {
                    index,
                    text: text.clone(),
                },
                Item::Message {
                    role: Role::Assistant,
                    text,
                },
            ),
            OpenKind::Reasoning => (
                ParseEvent::ReasoningDone {
                    index,
                    text: text.clone(),
                },
                Item::Reasoning { text },
            ),
            OpenKind::Call => (
                ParseEvent::CallDone {
                    index,
                    name: name.clone(),
                    call_id: call_id.clone(),
                    arguments: text.clone(),
                },
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments: text,
                },
            ),
        };
        out.push(event);
        self.items.push(item);
    }
}

/// A format's reader of its own markup in sampled tokens: the part of a streaming
/// parser that differs between formats. [`MarkupParser`] runs it.
pub trait Markup: Send {
    /// Read one sampled token. An error says why the output is malformed; no token is
    /// read after one.
    fn read(&mut self, id: u32, out: &mut Vec<ParseEvent>) -> Result<(), String>;
    /// The output ended and every token read well: [`Outcome::Stopped`] after a stop
    /// token, else close what is open, keeping the text so far, and [`Outcome::Truncated`].
    fn end(&mut self, out: &mut Vec<ParseEvent>) -> Outcome;
    fn items(&self) -> &[Item];
    /// A stop token was read.
    fn stopped(&self) -> bool;
    fn reasoning_tokens(&self) -> usize;
}

/// The [`OutputParser`] around a format's [`Markup`]: it counts the tokens fed and
/// holds the first error, after which further tokens are ignored, so no input sequence
/// makes a format's reader handle its own failure.
pub struct MarkupParser<M> {
    markup: M,
    failure: Option<String>,
    output_tokens: usize,
}

impl<M: Markup> MarkupParser<M> {
    pub fn new(markup: M) -> MarkupParser<M> {
        MarkupParser {
            markup,
            failure: None,
            output_tokens: 0,
        }
    }
}

impl<M: Markup> OutputParser for MarkupParser<M> {
    fn feed(&mut self, id: u32, out: &mut Vec<ParseEvent>) {
        self.output_tokens += 1;
        if self.failure.is_none() {
            self.failure = self.markup.read(id, out).err();
        }
    }

    fn finish(&mut self, out: &mut Vec<ParseEvent>) -> Outcome {
        match &self.failure {
            Some(message) => Outcome::Malformed(message.clone()),
            None => self.markup.end(out),
        }
    }

    fn items(&self) -> &[Item] {
        self.markup.items()
    }

    fn stopped(&self) -> bool {
        self.failure.is_none() && self.markup.stopped()
    }

    fn output_tokens(&self) -> usize {
        self.output_tokens
    }

    fn reasoning_tokens(&self) -> usize {
        self.markup.reasoning_tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_pushed_after_a_delta_of_the_same_item_extends_it() {
        let mut items = OutputItems::default();
        let mut out = Vec::new();
        items.start(OpenKind::Reasoning, "", &mut out);
        items.push("a", &mut out);
        items.push("b", &mut out);
        items.start(OpenKind::Message, "", &mut out);
        items.push("c", &mut out);
        items.push("d", &mut out);
        let mut next = Vec::new();
        items.push("e", &mut next);
        items.push("f", &mut next);
        let delta = |index, text: &str| ParseEvent::TextDelta {
            index,
            text: text.into(),
        };
        assert_eq!(
            out,
            vec![
                ParseEvent::ReasoningStart { index: 0 },
                ParseEvent::ReasoningDelta {
                    index: 0,
                    text: "ab".into()
                },
                ParseEvent::ReasoningDone {
                    index: 0,
                    text: "ab".into()
                },
                ParseEvent::MessageStart { index: 1 },
                delta(1, "cd"),
            ]
        );
        assert_eq!(next, vec![delta(1, "ef")]);
    }

    #[test]
    fn call_ids_are_openai_shaped_and_distinct() {
        let a = mint_call_id();
        let b = mint_call_id();
        assert_eq!(a.len(), 29);
        assert!(a.starts_with("call_"));
        assert!(a[5..].bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    #[test]
    fn sampled_text_holds_back_partial_characters_and_rejects_invalid_bytes() {
        let t = crate::tokenizer::by_name("o200k_base").unwrap();
        let byte_token = |b: u8| {
            (0..t.vocab_size() as u32)
                .find(|&id| !t.is_special(id) && t.token_bytes(id) == [b])
                .unwrap()
        };
        let mut sampled = SampledText::default();
        let mut text = String::new();
        let euro = "€".as_bytes();
        sampled.push(t.as_ref(), byte_token(euro[0]), &mut text).unwrap();
        assert_eq!(text, "");
        assert!(!sampled.is_complete());
        for &b in &euro[1..] {
            sampled.push(t.as_ref(), byte_token(b), &mut text).unwrap();
        }
        assert_eq!(text, "€");
        assert!(sampled.is_complete());
        // A replacement character the model wrote is text; a lone continuation byte is not.
        let mut ids = Vec::new();
        t.encode("\u{FFFD}", &mut ids);
        for id in ids {
            sampled.push(t.as_ref(), id, &mut text).unwrap();
        }
        assert_eq!(text, "€\u{FFFD}");
        assert!(sampled.push(t.as_ref(), byte_token(0x80), &mut text).is_err());
    }
}
