//! hotloop's compiled core: everything whose cost is per token or per byte.
//!
//! - [`tokenizer`]: BPE tokenizers (OpenAI encodings, byte-level BPE for open models),
//!   incremental re-tokenization of growing text, streaming detokenization.
//! - [`item`]: the conversation items and tool definitions the chat formats render.
//! - [`render`]: the token builder chat formats write into.
//! - `chunks`: the persistent vectors that let checkpoints, forks and prompts share a
//!   history instead of copying it.
//! - [`format`]: chat formats (harmony, ChatML, a model's own chat template) and their
//!   streaming output parsers.
//! - [`prompt_chain`]: the rendered prompt of one response chain (`Conversation`), an
//!   append-only token cache with checkpoints and forks, over a prompt builder: segments
//!   for harmony and ChatML, template difference for a chat template. (The
//!   `/v1/conversations` resource is the server's, in Python's `store/` and `transport/`.)
//! - [`validate`]: request parsing and delta validation on the raw bytes of new items.
//! - [`upstream`]: the upstream engine's server-sent-event decoder (bytes in, token ids out).
//!
//! No pyo3 type appears below `bindings` (compiled only with the `python` feature).

pub(crate) mod chunks;
pub mod error;
pub mod format;
pub mod item;
pub mod prompt_chain;
pub mod render;
pub mod tokenizer;
pub mod upstream;
pub mod validate;

#[cfg(feature = "python")]
mod bindings;

pub use error::{Code, Error, Result};
