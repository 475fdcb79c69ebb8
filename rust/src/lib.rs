//! hotloop's compiled core: everything whose cost is per token or per byte.
//!
//! - [`tokenizer`]: BPE tokenizers (OpenAI encodings, byte-level BPE for open models),
//!   incremental re-tokenization of growing text, streaming detokenization.
//! - [`item`]: the conversation items and tool definitions the chat formats render.
//! - [`render`]: the token builder chat formats write into.
//! - [`format`]: chat formats (harmony, ChatML) and their streaming output parsers.
//! - [`conversation`]: the append-only rendered-token cache with checkpoints and forks.
//! - [`validate`]: request parsing and delta validation on the raw bytes of new items.
//! - [`upstream`]: the upstream engine's server-sent-event decoder (bytes in, token ids out).
//!
//! No pyo3 type appears below `bindings` (compiled only with the `python` feature).

pub mod conversation;
pub mod error;
pub mod format;
pub mod item;
pub mod render;
pub mod tokenizer;
pub mod upstream;
pub mod validate;

#[cfg(feature = "python")]
mod bindings;

pub use error::{Code, Error, Result};
