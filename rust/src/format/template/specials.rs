//! Rendered template text to ids as `tokenizers.encode(text, add_special_tokens=False)`
//! computes them: every special (added) token of the vocabulary is matched in the text,
//! leftmost and longest first, and the text between matches is encoded as plain text.
//!
//! A template's output *is* text, so a message that contains `<|im_end|>` would render
//! to a real `<|im_end|>` token (vLLM does that) and could forge a turn. What
//! special-token text inside content becomes is the operator's choice
//! ([`ContentSpecials`]): plain text by default, as the hand-written formats (which
//! insert specials by id and never read them from text) tokenize it. Content is marked
//! before rendering ([`Specials::content`]) so its special-token text no longer matches,
//! and the marks are taken out again before the text between specials is encoded.

use std::borrow::Cow;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use serde_json::Value as Json;

use super::messages::tool_definitions;
use crate::error::{Code, Error, Result};
use crate::item::{Item, Prefix};
use crate::tokenizer::Tokenizer;

/// What special-token text inside content (message text, instructions, tool outputs,
/// call arguments, tool definitions) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentSpecials {
    /// Plain text, as the hand-written formats tokenize it.
    #[default]
    Plain,
    /// A request whose input holds any is refused (`special_token_in_content`); the
    /// model's own output is rendered back as under `Plain` (a model writing about
    /// `<|im_end|>` must not break its conversation).
    Refuse,
    /// A real special token, as `tokenizers.encode` of the render gives it (vLLM).
    Allow,
}

impl ContentSpecials {
    pub fn by_name(name: &str) -> Result<ContentSpecials> {
        match name {
            "plain" => Ok(ContentSpecials::Plain),
            "refuse" => Ok(ContentSpecials::Refuse),
            "allow" => Ok(ContentSpecials::Allow),
            other => Err(Error::new(
                Code::InvalidValue,
                format!("special tokens in content: expected plain, refuse or allow, got {other:?}"),
            )),
        }
    }
}

/// Put between the characters of special-token text in content so that it no longer
/// matches, and doubled where content holds it itself; taken out before encoding. A
/// private-use character: no vocabulary's special token contains it.
const MARK: char = '\u{10FFFD}';

/// The special tokens of one vocabulary, ready to be found in text.
pub struct Specials {
    tokenizer: Arc<dyn Tokenizer>,
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
    content: ContentSpecials,
}

impl Specials {
    pub fn new(tokenizer: Arc<dyn Tokenizer>, content: ContentSpecials) -> Specials {
        let mut texts = Vec::new();
        let mut ids = Vec::new();
        for id in 0..tokenizer.vocab_size() as u32 {
            if !tokenizer.is_special(id) {
                continue;
            }
            let bytes = tokenizer.token_bytes(id);
            if !bytes.is_empty() && std::str::from_utf8(bytes).is_ok() {
                texts.push(bytes.to_vec());
                ids.push(id);
            }
        }
        let matcher = (!texts.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&texts)
                .expect("special tokens form a valid automaton")
        });
        Specials {
            tokenizer,
            matcher,
            ids,
            content,
        }
    }

    /// Content (a message, a tool definition) as the template is to be given it: with
    /// its special-token text marked as plain text, unless they are allowed.
    pub fn content<'a>(&self, value: &'a Json) -> Cow<'a, Json> {
        if self.content != ContentSpecials::Allow && self.needs_marks(value) {
            Cow::Owned(self.marked(value))
        } else {
            Cow::Borrowed(value)
        }
    }

    /// Under `Refuse`: an error when the client's input (its items, instructions and
    /// tool definitions) holds special-token text.
    pub fn check_input(&self, prefix: Option<&Prefix>, items: &[Item]) -> Result<()> {
        if self.content != ContentSpecials::Refuse {
            return Ok(());
        }
        let item_texts = items.iter().flat_map(|item| match item {
            Item::Message { text, .. } | Item::Reasoning { text } => vec![text.as_str()],
            Item::FunctionCall { name, arguments, .. } => vec![name.as_str(), arguments.as_str()],
            Item::FunctionCallOutput { output, .. } => vec![output.as_str()],
        });
        let tools = prefix.map(|p| tool_definitions(&p.tools)).unwrap_or_default();
        let instructions = prefix.and_then(|p| p.instructions.as_deref());
        let found = item_texts
            .chain(instructions)
            .find_map(|text| self.first_special_in(text))
            .or_else(|| tools.iter().find_map(|tool| self.first_special(tool)));
        match found {
            Some(text) => Err(Error::new(
                Code::SpecialTokenInContent,
                format!(
                    "the input holds the special token {text:?} as text; this server refuses \
                     special-token text in content (--special-tokens-in-content refuse)"
                ),
            )),
            None => Ok(()),
        }
    }

    fn first_special_in(&self, text: &str) -> Option<String> {
        let m = self.matcher.as_ref()?.find(text)?;
        Some(text[m.range()].to_owned())
    }

    /// The first special token's text found in a string (or key) of `value`.
    fn first_special(&self, value: &Json) -> Option<String> {
        match value {
            Json::String(s) => self.first_special_in(s),
            Json::Array(a) => a.iter().find_map(|v| self.first_special(v)),
            Json::Object(o) => o
                .iter()
                .find_map(|(k, v)| self.first_special_in(k).or_else(|| self.first_special(v))),
            _ => None,
        }
    }

    fn needs_marks(&self, value: &Json) -> bool {
        let needs = |s: &str| s.contains(MARK) || self.matcher.as_ref().is_some_and(|m| m.is_match(s));
        match value {
            Json::String(s) => needs(s),
            Json::Array(a) => a.iter().any(|v| self.needs_marks(v)),
            Json::Object(o) => o.iter().any(|(k, v)| needs(k) || self.needs_marks(v)),
            _ => false,
        }
    }

    fn marked(&self, value: &Json) -> Json {
        match value {
            Json::String(s) => Json::String(self.mark(s)),
            Json::Array(a) => Json::Array(a.iter().map(|v| self.marked(v)).collect()),
            Json::Object(o) => Json::Object(o.iter().map(|(k, v)| (self.mark(k), self.marked(v))).collect()),
            other => other.clone(),
        }
    }

    /// `text` with [`MARK`] doubled and put between the characters of every special
    /// token's text.
    fn mark(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let plain = |out: &mut String, s: &str| {
            for c in s.chars() {
                out.push(c);
                if c == MARK {
                    out.push(MARK);
                }
            }
        };
        let mut at = 0;
        if let Some(matcher) = &self.matcher {
            for m in matcher.find_iter(text) {
                plain(&mut out, &text[at..m.start()]);
                for (i, c) in text[m.range()].chars().enumerate() {
                    if i > 0 {
                        out.push(MARK);
                    }
                    out.push(c);
                }
                at = m.end();
            }
        }
        plain(&mut out, &text[at..]);
        out
    }

    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    /// Encode `text`, appending its ids to `ids`. For each special token, push
    /// `(byte offset just after it + base, ids.len() after it)` to `after_special`:
    /// encoding restarts exactly there, since text is never merged across a special.
    pub fn encode(
        &self,
        text: &str,
        base: usize,
        ids: &mut Vec<u32>,
        after_special: &mut Vec<(usize, usize)>,
    ) {
        let mut at = 0;
        if let Some(matcher) = &self.matcher {
            for m in matcher.find_iter(text) {
                self.encode_plain(&text[at..m.start()], ids);
                ids.push(self.ids[m.pattern().as_usize()]);
                after_special.push((base + m.end(), ids.len()));
                at = m.end();
            }
        }
        self.encode_plain(&text[at..], ids);
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        if self.content != ContentSpecials::Allow && text.contains(MARK) {
            self.tokenizer.encode(&unmark(text), ids);
        } else {
            self.tokenizer.encode(text, ids);
        }
    }

    /// All ids of `text`, from scratch (the reference the incremental prompt must equal).
    pub fn encode_all(&self, text: &str) -> Vec<u32> {
        let (mut ids, mut after) = (Vec::new(), Vec::new());
        self.encode(text, 0, &mut ids, &mut after);
        ids
    }
}

/// Text with the marks [`Specials::mark`] put in taken out: a doubled mark is one mark
/// of the content's own, a single one is dropped.
fn unmark(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != MARK {
            out.push(c);
        } else if let Some(next) = chars.next() {
            out.push(next);
        }
    }
    out
}
