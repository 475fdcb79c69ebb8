//! The token builder chat formats write into.
//!
//! A chat format describes a prompt as special tokens and text. Text passed to
//! [`Renderer::text`] continues the current *run*: consecutive runs are encoded as one
//! string, exactly as a template engine's output would be tokenized (ChatML). Text passed
//! to [`Renderer::fragment`] is encoded on its own (harmony encodes every fragment
//! separately). A special token always ends the run. A run or fragment of
//! [`PARALLEL_BYTES`](crate::tokenizer::PARALLEL_BYTES) or more (a large first message, a pasted file) is encoded in parts
//! on every CPU ([`encode_parallel`]), with the ids of one encode.

use crate::tokenizer::{encode_parallel, threads, Tokenizer};

pub struct Renderer<'t> {
    tokenizer: &'t dyn Tokenizer,
    tokens: Vec<u32>,
    run: String,
}

impl<'t> Renderer<'t> {
    pub fn new(tokenizer: &'t dyn Tokenizer) -> Self {
        Renderer {
            tokenizer,
            tokens: Vec::new(),
            run: String::new(),
        }
    }

    pub fn tokenizer(&self) -> &'t dyn Tokenizer {
        self.tokenizer
    }

    /// Append a special token (ends the open text run).
    pub fn special(&mut self, id: u32) {
        self.flush();
        self.tokens.push(id);
    }

    /// Append the special token with this name, e.g. `<|im_start|>`.
    /// Panics if the tokenizer lacks it: formats are only built for tokenizers that have it.
    pub fn special_named(&mut self, name: &str) {
        let id = self
            .tokenizer
            .special(name)
            .unwrap_or_else(|| panic!("tokenizer {} has no special token {name}", self.tokenizer.name()));
        self.special(id);
    }

    /// Continue the open text run.
    pub fn text(&mut self, text: &str) {
        self.run.push_str(text);
    }

    /// Append text encoded on its own, not merged with neighbouring text.
    pub fn fragment(&mut self, text: &str) {
        self.flush();
        self.encode(text);
    }

    fn encode(&mut self, text: &str) {
        encode_parallel(self.tokenizer, text, threads(), &mut self.tokens);
    }

    /// Append ids verbatim (sampled model output).
    pub fn ids(&mut self, ids: &[u32]) {
        self.flush();
        self.tokens.extend_from_slice(ids);
    }

    /// Encode the open run, if any.
    pub fn flush(&mut self) {
        if !self.run.is_empty() {
            let run = std::mem::take(&mut self.run);
            self.encode(&run);
            self.run = run;
            self.run.clear();
        }
    }

    /// The open (not yet encoded) text run.
    pub fn open_run(&self) -> &str {
        &self.run
    }

    /// Number of tokens encoded so far (the open run not included).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.run.is_empty()
    }

    /// The tokens encoded so far and the open run, not encoded: the rendered-token cache
    /// keeps the run as text so that the next append can continue it exactly.
    pub fn into_parts(self) -> (Vec<u32>, String) {
        (self.tokens, self.run)
    }

    /// All tokens, with the open run encoded.
    pub fn finish(mut self) -> Vec<u32> {
        self.flush();
        self.tokens
    }
}
