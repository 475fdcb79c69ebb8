//! Request parsing and delta validation, on the raw bytes of a frame.
//!
//! A client frame goes in once ([`parse_event`], or [`parse_request`] for an HTTP body)
//! and comes out as a [`ClientEvent`]; a `response.create` becomes a [`CreateRequest`]
//! holding the parsed [`Item`](crate::item::Item)s, the [`Prefix`](crate::item::Prefix)
//! (instructions, function tools, reasoning effort), the sampling settings and the JSON
//! the server echoes. Schema problems do not fail the parse: they are kept in
//! `CreateRequest::error` so the server can still answer on the request's lane.
//!
//! What depends on the conversation chain is checked by the conversation, over the new
//! items only: its own open calls (every `function_call_output` answers an open call),
//! and, with the types here, [`check_context_budget`] and the content [`Policy`].
//!
//! This module owns no state of a connection or a conversation and renders nothing.

mod body;
mod budget;
mod chat;
mod elements;
mod event;
mod field;
pub mod history;
mod input;
mod path;
mod policy;
mod prompt_cache;
mod request;
mod schema;
mod shape;
mod tools;
mod values;

pub use body::{
    pooled as pooled_bodies, release_pooled as release_pooled_bodies, Body, POOLED_BYTES as POOLED_BODY_BYTES,
};
pub use budget::check_context_budget;
pub use chat::{parse_chat_request, parse_chat_request_seen, ChatOptions, ChatRequest};
pub use event::{parse_event, AppendEvent, ClientEvent};
pub use history::{output_digests, Digest, History, Seen, SeenItems};
pub use input::{parse_input, Input, TextSource};
pub use policy::Policy;
pub use prompt_cache::{PromptCache, PromptCacheOptions};
pub use request::{parse_request, parse_request_seen, CreateRequest, InputJson};
pub use tools::{SkippedTool, ToolChoice, ToolForm, Tools};
pub use values::check_values;

/// Per-request bounds checked while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Items in `input`.
    pub max_items: usize,
    /// Bytes of any one text (a message, a part, a tool output, instructions).
    pub max_text_bytes: usize,
    /// Entries in `tools`.
    pub max_tools: usize,
    /// Bytes of the raw `tools` field, checked before any of it is parsed: checking
    /// and rendering tools costs CPU in proportion to their bytes (about 0.2 us a byte
    /// for schema-heavy lists), so this bounds a request's CPU for them.
    pub max_tools_bytes: usize,
    /// The model takes images: `input_image` parts of user messages are accepted (and
    /// render as a placeholder); otherwise they are refused as `unsupported_content`.
    pub images: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_items: 10_000,
            max_text_bytes: 10 * 1024 * 1024,
            max_tools: 512,
            max_tools_bytes: 2 * 1024 * 1024,
            images: false,
        }
    }
}
