//! Rendered template text to ids as `tokenizers.encode(text, add_special_tokens=False)`
//! computes them: every special (added) token of the vocabulary is matched in the text,
//! leftmost and longest first, and the text between matches is encoded as plain text.
//!
//! This differs on purpose from the hand-written formats, which insert specials by id
//! and never read them from text: a template's output *is* text, so a message that
//! contains `<|im_end|>` renders to a real `<|im_end|>` token in vLLM and here alike.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::tokenizer::Tokenizer;

/// The special tokens of one vocabulary, ready to be found in text.
pub struct Specials {
    tokenizer: Arc<dyn Tokenizer>,
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
}

impl Specials {
    pub fn new(tokenizer: Arc<dyn Tokenizer>) -> Specials {
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
        }
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
        if !text.is_empty() {
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
