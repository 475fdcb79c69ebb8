//! Tokenizers: the BPE encodings the chat formats and the cache are built on.
//!
//! - [`openai`]: the embedded OpenAI encodings (`o200k_base`, `o200k_harmony`, `cl100k_base`).
//! - [`bpe_model`]: BPE for open models (byte-level and SentencePiece-style), loaded from
//!   a `tokenizer.json` ([`tokenizer_json`]), GGUF metadata ([`gguf`]) or a Mistral
//!   `tekken.json` ([`tekken`]) or a SentencePiece `.model` ([`sentencepiece`]), split by
//!   a [`pretokenizer`].
//! - [`detok`]: streaming detokenization (ids in, whole UTF-8 characters out).
//! - [`incremental`]: a growing text that keeps its ids as chunks are appended.
//!
//! Every tokenizer encodes user and tool text as *plain text*: a string such as
//! `<|end|>` inside a message is ordinary bytes, never a special token. Only chat
//! formats insert special tokens, by id.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use crate::error::Result;

mod agenda;
pub mod bpe_model;
pub mod detok;
pub mod gguf;
pub mod incremental;
pub mod openai;
mod piece_map;
pub mod pretokenizer;
pub mod scanner;
pub mod sentencepiece;
pub mod tekken;
pub mod tokenizer_json;

/// A BPE tokenizer with a pre-tokenizer (the regex split that makes encoding local).
pub trait Tokenizer: Send + Sync {
    /// Registry name, e.g. `o200k_base`, or the model name for vocabularies from GGUF.
    fn name(&self) -> &str;

    /// Encode plain text, appending ids to `out`. Special-token strings are plain text.
    fn encode(&self, text: &str, out: &mut Vec<u32>);

    /// Encode text that continues a text already encoded from one of its piece
    /// boundaries (incremental re-encoding): no SentencePiece dummy prefix.
    fn encode_continuation(&self, text: &str, out: &mut Vec<u32>) {
        self.encode(text, out)
    }

    /// Bytes that encoding adds before the first piece of a text (SentencePiece's dummy
    /// space prefix): the first piece's tokens cover that many bytes more than it.
    fn prefix_len(&self) -> usize {
        0
    }

    /// Decoding a text drops its first space (the dummy prefix encoding added).
    fn strips_leading_space(&self) -> bool {
        false
    }

    /// True when a text cut at a line start ([`pretokenizer::line_cut`]) encodes, part by
    /// part (each after the first with [`Tokenizer::encode_continuation`]), to the ids of
    /// the whole: what [`encode_parallel`] needs.
    fn cuts_at_lines(&self) -> bool {
        false
    }

    /// The pre-tokenizer pieces of `text`, in order; they concatenate to `text`.
    /// BPE never merges across a piece boundary, which is what makes incremental
    /// re-tokenization (re-encode from two pieces before a join) exact.
    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a>;

    /// Bytes of a token; for a special token, the bytes of its literal text.
    fn token_bytes(&self, id: u32) -> &[u8];

    /// Id of a special token by its literal text (`<|im_start|>`, `<|start|>`, ...).
    fn special(&self, name: &str) -> Option<u32>;

    fn is_special(&self, id: u32) -> bool;

    /// Number of ids (ordinary + special + reserved).
    fn vocab_size(&self) -> usize;

    /// Decode ids to bytes (lossless; may end inside a UTF-8 character).
    fn decode_bytes(&self, ids: &[u32], out: &mut Vec<u8>) {
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id));
        }
    }

    /// Decode the ids of a whole text: their bytes, less the dummy space prefix of a
    /// vocabulary that adds one (what Hugging Face's decoder returns).
    fn decode_text(&self, ids: &[u32], out: &mut Vec<u8>) {
        let start = out.len();
        self.decode_bytes(ids, out);
        if self.strips_leading_space() && out.get(start) == Some(&b' ') {
            out.remove(start);
        }
    }
}

/// Texts of this many bytes or more are worth encoding on several threads.
pub const PARALLEL_BYTES: usize = 256 * 1024;

/// The threads [`encode_parallel`] uses: one per CPU the process may run on.
pub fn threads() -> usize {
    static THREADS: LazyLock<usize> =
        LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    *THREADS
}

/// Encode `text` as [`Tokenizer::encode`] does, in up to `parts` parts cut at line
/// starts, each on a thread of its own, when the tokenizer allows the cut and the text
/// is long enough for each part to hold at least half of [`PARALLEL_BYTES`]; the parts'
/// ids concatenated are the whole text's.
pub fn encode_parallel(tokenizer: &dyn Tokenizer, text: &str, parts: usize, out: &mut Vec<u32>) {
    let parts = parts.min(text.len() / (PARALLEL_BYTES / 2));
    if parts < 2 || !tokenizer.cuts_at_lines() {
        return tokenizer.encode(text, out);
    }
    let mut cuts = vec![0];
    for i in 1..parts {
        let from = (text.len() * i / parts).max(cuts[cuts.len() - 1] + 1);
        match pretokenizer::line_cut(text.as_bytes(), from) {
            Some(cut) => cuts.push(cut),
            None => break,
        }
    }
    cuts.push(text.len());
    std::thread::scope(|scope| {
        let rest: Vec<_> = cuts[1..]
            .windows(2)
            .map(|w| {
                let part = &text[w[0]..w[1]];
                scope.spawn(move || {
                    let mut ids = Vec::new();
                    tokenizer.encode_continuation(part, &mut ids);
                    ids
                })
            })
            .collect();
        tokenizer.encode(&text[..cuts[1]], out);
        for part in rest {
            out.extend(part.join().expect("an encoding thread does not panic"));
        }
    });
}

/// Assert that `text` cut at each of its line starts ([`pretokenizer::line_cut`]) encodes,
/// part by part, to the ids of the whole, when `tokenizer` claims it
/// ([`Tokenizer::cuts_at_lines`]): what [`encode_parallel`] relies on, checked by tests
/// and the `line_cuts` fuzz target.
pub fn assert_line_cut_ids_exact(tokenizer: &dyn Tokenizer, text: &str) {
    if !tokenizer.cuts_at_lines() {
        return;
    }
    let mut whole = Vec::new();
    tokenizer.encode(text, &mut whole);
    let mut at = 0;
    while let Some(cut) = pretokenizer::line_cut(text.as_bytes(), at + 1) {
        let mut parts = Vec::new();
        tokenizer.encode(&text[..cut], &mut parts);
        tokenizer.encode_continuation(&text[cut..], &mut parts);
        assert_eq!(parts, whole, "cut at {cut} of {text:?}");
        at = cut;
    }
}

/// The OpenAI encodings embedded in the build, by name:
/// `o200k_base`, `o200k_harmony`, `cl100k_base`.
pub fn by_name(name: &str) -> Option<Arc<dyn Tokenizer>> {
    openai::by_name(name)
}

/// A BPE tokenizer from a GGUF file's tokenizer metadata (the header only).
pub fn from_gguf(path: &Path) -> Result<Arc<dyn Tokenizer>> {
    let meta = gguf::read_metadata_file(path)?;
    Ok(Arc::new(bpe_model::BpeModel::new(gguf::vocabulary(&meta)?)?))
}

/// A BPE tokenizer from the bytes of a Hugging Face `tokenizer.json`.
pub fn from_tokenizer_json(data: &[u8]) -> Result<Arc<dyn Tokenizer>> {
    Ok(Arc::new(bpe_model::BpeModel::new(tokenizer_json::vocabulary(
        data,
    )?)?))
}

/// A BPE tokenizer from the bytes of a Mistral `tekken.json`.
pub fn from_tekken(data: &[u8]) -> Result<Arc<dyn Tokenizer>> {
    Ok(Arc::new(bpe_model::BpeModel::new(tekken::vocabulary(data)?)?))
}

/// A BPE tokenizer from the bytes of a SentencePiece `.model` (a `ModelProto`), with the
/// ids the `sentencepiece` library gives.
pub fn from_sentencepiece_model(data: &[u8]) -> Result<Arc<dyn Tokenizer>> {
    Ok(Arc::new(bpe_model::BpeModel::new(sentencepiece::vocabulary(
        data,
    )?)?))
}
