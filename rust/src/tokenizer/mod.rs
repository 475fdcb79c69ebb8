//! Tokenizers: the BPE encodings the chat formats and the cache are built on.
//!
//! - [`openai`]: the embedded OpenAI encodings (`o200k_base`, `o200k_harmony`, `cl100k_base`).
//! - [`bytelevel`]: byte-level BPE for open models, from GGUF metadata ([`gguf`]) or a
//!   `tokenizer.json`, split by the llama.cpp-exact [`pretokenizer`].
//! - [`detok`]: streaming detokenization (ids in, whole UTF-8 characters out).
//! - [`incremental`]: a growing text that keeps its ids as chunks are appended.
//!
//! Every tokenizer encodes user and tool text as *plain text*: a string such as
//! `<|end|>` inside a message is ordinary bytes, never a special token. Only chat
//! formats insert special tokens, by id.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;

pub mod bytelevel;
pub mod detok;
pub mod gguf;
pub mod incremental;
pub mod openai;
pub mod pretokenizer;

/// A BPE tokenizer with a pre-tokenizer (the regex split that makes encoding local).
pub trait Tokenizer: Send + Sync {
    /// Registry name, e.g. `o200k_base`, or the model name for vocabularies from GGUF.
    fn name(&self) -> &str;

    /// Encode plain text, appending ids to `out`. Special-token strings are plain text.
    fn encode(&self, text: &str, out: &mut Vec<u32>);

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
}

/// The OpenAI encodings embedded in the build, by name:
/// `o200k_base`, `o200k_harmony`, `cl100k_base`.
pub fn by_name(name: &str) -> Option<Arc<dyn Tokenizer>> {
    openai::by_name(name)
}

/// A byte-level BPE tokenizer from a GGUF file's tokenizer metadata.
pub fn from_gguf(path: &Path) -> Result<Arc<dyn Tokenizer>> {
    Ok(Arc::new(bytelevel::ByteLevelBpe::from_gguf(path)?))
}

/// A byte-level BPE tokenizer from the bytes of a Hugging Face `tokenizer.json`.
pub fn from_tokenizer_json(data: &[u8]) -> Result<Arc<dyn Tokenizer>> {
    Ok(Arc::new(bytelevel::ByteLevelBpe::from_tokenizer_json(data)?))
}
