//! A Chat Completions request (`POST /v1/chat/completions`) parsed into the same
//! [`CreateRequest`] a Responses body becomes, so that one protocol serves both and a
//! chat conversation renders, caches and is found by its content exactly as the same
//! conversation sent as Responses items (docs/protocol.md, "Chat Completions").
//!
//! The messages become items in one place, here:
//!
//! - a leading `system` or `developer` message is the `instructions` (what a chat
//!   template renders first, with the tools); later ones are system/developer messages;
//! - `user` messages keep their text (`text` parts joined; `image_url` parts where the
//!   model takes images, as Responses' `input_image`);
//! - an `assistant` message becomes, in order, a `reasoning` item (its `reasoning` or
//!   `reasoning_content`, as vLLM and SGLang return them), a message (its content, when
//!   it has some or nothing else) and one `function_call` per entry of `tool_calls`;
//! - a `tool` message is the `function_call_output` of its `tool_call_id`.
//!
//! Tools and `tool_choice` are read in their chat form ([`ToolForm::Chat`]); the fields
//! the two APIs share (model, sampling, metadata, prompt cache, service tier) are read as
//! a Responses body reads them. What this server cannot honour is refused with
//! `unsupported_parameter` naming the field, never ignored: `n` other than 1, `stop`,
//! `seed`, `logprobs`, `logit_bias`, structured `response_format`, audio, predicted
//! outputs, the deprecated `functions`, and `store: true` (chat completions are not kept).

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::elements::{array_elements, span_of};
use super::field::{self, invalid_value};
use super::history::{raw_chain, raw_fields_digest, seen_skip, Seen, SeenItems};
use super::input::{required_name, required_text, text_or_parts, Input, RawPart, TextSource, NO_LIMIT};
use super::path::Path;
use super::request::{not_utf8, parse_object, Body, ChatParts, EFFORTS};
use super::shape::{self, Shape};
use super::values::check_values_except;
use super::{CreateRequest, Limits};
use crate::error::{Code, Error, Result};
use crate::item::{Item, Role};

/// The fields of a Chat Completions body this server reads, as raw slices. Unknown fields
/// (engine extensions such as `top_k`, `user`, `verbosity`) are skipped.
#[derive(Deserialize, Default)]
struct ChatBody<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(borrow)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    n: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow)]
    response_format: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning_effort: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    store: Option<&'a RawValue>,
    #[serde(borrow)]
    frequency_penalty: Option<&'a RawValue>,
    #[serde(borrow)]
    presence_penalty: Option<&'a RawValue>,
    #[serde(borrow)]
    service_tier: Option<&'a RawValue>,
    #[serde(borrow)]
    safety_identifier: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_retention: Option<&'a RawValue>,
    // Refused unless absent or null (or their one harmless value): see `refuse_unsupported`.
    #[serde(borrow)]
    stop: Option<&'a RawValue>,
    #[serde(borrow)]
    seed: Option<&'a RawValue>,
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    top_logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    logit_bias: Option<&'a RawValue>,
    #[serde(borrow)]
    modalities: Option<&'a RawValue>,
    #[serde(borrow)]
    audio: Option<&'a RawValue>,
    #[serde(borrow)]
    prediction: Option<&'a RawValue>,
    #[serde(borrow)]
    web_search_options: Option<&'a RawValue>,
    #[serde(borrow)]
    functions: Option<&'a RawValue>,
    #[serde(borrow)]
    function_call: Option<&'a RawValue>,
}

/// What the reply of a chat completion needs beside the [`CreateRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChatOptions {
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
}

/// A parsed Chat Completions request. When `request.error` is set it must be refused.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub request: CreateRequest,
    pub options: ChatOptions,
}

/// Parse a `POST /v1/chat/completions` body. Malformed JSON or a body that is not an
/// object is an `invalid_json` error; anything else lands in `request.error`.
pub fn parse_chat_request(body: &[u8], limits: &Limits) -> Result<ChatRequest> {
    parse_chat_request_seen(body, limits, None)
}

/// [`parse_chat_request`] with the key's raw addresses (`history::SeenItems`): the leading
/// messages a request of the key had, byte for byte, are not parsed again.
pub fn parse_chat_request_seen(
    body: &[u8],
    limits: &Limits,
    seen: Option<&SeenItems>,
) -> Result<ChatRequest> {
    let text = std::str::from_utf8(body).map_err(|_| not_utf8())?;
    let chat: ChatBody = parse_object(text, "The request body")?;
    let mut options = ChatOptions::default();
    let parts = chat_parts(&chat, limits, &mut options, seen);
    // Checked once the leading messages recognized by their bytes are known, as a
    // Responses body is (`request::parse_request_seen`); a value refused wins.
    let skip = parts.as_ref().ok().and_then(|parts| {
        let seen = parts.seen?;
        seen_skip(text, chat.messages, &seen, &parts.seen_bytes)
    });
    let parts = check_values_except(text, skip).and(parts);
    let mut request = match parts {
        Ok(parts) => {
            let reasoning = chat.reasoning_effort.map(reasoning_of);
            let body = Body {
                model: chat.model,
                store: Some(not_stored()),
                stream: chat.stream,
                tools: chat.tools,
                tool_choice: chat.tool_choice,
                parallel_tool_calls: chat.parallel_tool_calls,
                max_output_tokens: chat.max_completion_tokens.or(chat.max_tokens),
                temperature: chat.temperature,
                top_p: chat.top_p,
                reasoning: reasoning.as_deref(),
                metadata: chat.metadata,
                frequency_penalty: chat.frequency_penalty,
                presence_penalty: chat.presence_penalty,
                service_tier: chat.service_tier,
                safety_identifier: chat.safety_identifier,
                prompt_cache_key: chat.prompt_cache_key,
                prompt_cache_retention: chat.prompt_cache_retention,
                ..Body::default()
            };
            CreateRequest::from_body(&body, text, None, limits, Some(parts), None)
        }
        Err(e) => CreateRequest::refused(e, None),
    };
    request.frame_bytes = body.len();
    Ok(ChatRequest { request, options })
}

/// `store: false`, as a Responses body would say it: a chat completion is not kept.
fn not_stored() -> &'static RawValue {
    static FALSE: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    FALSE.get_or_init(|| RawValue::from_string("false".to_owned()).expect("valid JSON"))
}

/// `reasoning_effort` as the Responses body's `reasoning` (checked already).
fn reasoning_of(effort: &RawValue) -> Box<RawValue> {
    RawValue::from_string(format!(r#"{{"effort":{}}}"#, effort.get()))
        .expect("a JSON string inside an object")
}

/// The chat-only fields checked, and the messages parsed: what the Responses body reader
/// does not read.
fn chat_parts(
    chat: &ChatBody,
    limits: &Limits,
    options: &mut ChatOptions,
    seen: Option<&SeenItems>,
) -> Result<ChatParts> {
    let stream = field::opt_bool(chat.stream, &Path::root("stream"), false)?;
    options.include_usage = include_usage(chat.stream_options, stream)?;
    refuse_unsupported(chat)?;
    for (raw, name) in [
        (chat.max_tokens, "max_tokens"),
        (chat.max_completion_tokens, "max_completion_tokens"),
    ] {
        if let Some(raw) = raw.filter(|r| !is_null(r)) {
            field::positive_int(raw, &Path::root(name))?;
        }
    }
    if let Some(raw) = chat.reasoning_effort.filter(|r| !is_null(r)) {
        let path = Path::root("reasoning_effort");
        let effort = field::string(raw, &path)?;
        if !EFFORTS.contains(&effort.as_str()) {
            return Err(invalid_value(
                &path,
                format!(
                    "Invalid value for 'reasoning_effort': '{effort}'. Supported values are {}.",
                    EFFORTS.map(|e| format!("'{e}'")).join(", ")
                ),
            ));
        }
    }
    let messages = field::required(chat.messages, &Path::root("messages"))?;
    match seen {
        Some(seen) => parse_messages_seen(chat, messages, limits, seen),
        None => parse_messages(messages, limits),
    }
}

fn is_null(raw: &RawValue) -> bool {
    raw.get().trim() == "null"
}

/// A field that was sent with a value other than null.
fn set(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| !is_null(r))
}

/// `stream_options.include_usage`; the options are for streamed requests only.
fn include_usage(raw: Option<&RawValue>, stream: bool) -> Result<bool> {
    #[derive(Deserialize)]
    struct StreamOptions<'a> {
        #[serde(borrow)]
        include_usage: Option<&'a RawValue>,
    }
    let path = Path::root("stream_options");
    let Some(raw) = raw.filter(|r| !is_null(r)) else {
        return Ok(false);
    };
    if !stream {
        return Err(invalid_value(
            &path,
            "'stream_options' is only allowed when 'stream' is true.",
        ));
    }
    let options: StreamOptions = field::object(raw, &path)?;
    field::opt_bool(options.include_usage, &path.key("include_usage"), false)
}

fn unsupported(name: &str, why: &str) -> Error {
    Error::new(
        Code::UnsupportedParameter,
        format!("Unsupported parameter: '{name}' {why}"),
    )
    .at(name)
}

/// Refuse what this server cannot honour (module docstring), each by its name. A field
/// that is absent, null, or has the value that asks for nothing (`n: 1`, `stop: []`,
/// `logprobs: false`, `response_format: {"type": "text"}`, ...) is accepted.
fn refuse_unsupported(chat: &ChatBody) -> Result<()> {
    if let Some(raw) = set(chat.n) {
        let n = field::positive_int(raw, &Path::root("n"))?;
        if n != 1 {
            return Err(unsupported(
                "n",
                "must be 1: this server returns one choice per request (send n requests for n samples).",
            ));
        }
    }
    if let Some(raw) = set(chat.stop) {
        if !matches!(raw.get().trim(), "[]" | "\"\"") {
            return Err(unsupported(
                "stop",
                "is not supported: this server ends a completion at the model's own stop tokens \
                 or 'max_completion_tokens' only.",
            ));
        }
    }
    if set(chat.seed).is_some() {
        return Err(unsupported(
            "seed",
            "is not supported: the engines sample without a per-request seed.",
        ));
    }
    if let Some(raw) = set(chat.logprobs) {
        if field::boolean(raw, &Path::root("logprobs"))? {
            return Err(unsupported(
                "logprobs",
                "is not supported: no log probabilities are returned.",
            ));
        }
    }
    if let Some(raw) = set(chat.top_logprobs) {
        if raw.get().trim() != "0" {
            return Err(unsupported(
                "top_logprobs",
                "is not supported: no log probabilities are returned.",
            ));
        }
    }
    if let Some(raw) = set(chat.logit_bias) {
        if raw.get().trim().trim_start_matches('{').trim_start() != "}" {
            return Err(unsupported("logit_bias", "is not supported."));
        }
    }
    if let Some(raw) = set(chat.modalities) {
        if field::array(raw, &Path::root("modalities"))?
            .iter()
            .any(|m| m.get().trim() != r#""text""#)
        {
            return Err(unsupported(
                "modalities",
                "other than [\"text\"] are not supported.",
            ));
        }
    }
    for (raw, name, why) in [
        (
            chat.audio,
            "audio",
            "is not supported: this server answers in text.",
        ),
        (chat.prediction, "prediction", "is not supported."),
        (chat.web_search_options, "web_search_options", "is not supported."),
        (
            chat.functions,
            "functions",
            "is deprecated and not supported: use 'tools'.",
        ),
        (
            chat.function_call,
            "function_call",
            "is deprecated and not supported: use 'tool_choice'.",
        ),
    ] {
        if set(raw).is_some() {
            return Err(unsupported(name, why));
        }
    }
    if let Some(raw) = set(chat.store) {
        if field::boolean(raw, &Path::root("store"))? {
            return Err(unsupported(
                "store",
                "is not supported: chat completions are not kept (use /v1/responses to store \
                 responses).",
            ));
        }
    }
    if let Some(raw) = set(chat.response_format) {
        response_format(raw)?;
    }
    Ok(())
}

/// `response_format`: plain text only; the structured formats would need decoding
/// constrained to a schema, which no engine here does.
fn response_format(raw: &RawValue) -> Result<()> {
    #[derive(Deserialize)]
    struct Format<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<&'a RawValue>,
    }
    let path = Path::root("response_format");
    let format: Format = field::object(raw, &path)?;
    let type_path = path.key("type");
    match field::string(field::required(format.kind, &type_path)?, &type_path)?.as_str() {
        "text" => Ok(()),
        "json_object" | "json_schema" => Err(unsupported(
            "response_format",
            "of type 'json_object' or 'json_schema' is not supported: this server does not \
             constrain decoding to a schema.",
        )),
        other => Err(invalid_value(
            &type_path,
            format!(
                "Invalid value for 'response_format.type': '{other}'. Supported values are \
                 'text', 'json_object' and 'json_schema'."
            ),
        )),
    }
}

/// The fields of a message that parsing reads, decoded in the one pass over `messages`.
#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    content: Option<Shape<'a, RawPart<'a>>>,
    #[serde(borrow)]
    tool_calls: Option<Shape<'a, RawToolCall<'a>>>,
    #[serde(borrow)]
    tool_call_id: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    reasoning: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    reasoning_content: Option<Shape<'a, IgnoredAny>>,
}

#[derive(Deserialize)]
struct RawToolCall<'a> {
    #[serde(borrow)]
    id: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow, rename = "type")]
    kind: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    function: Option<Shape<'a, RawFunction<'a>>>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(borrow)]
    name: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    arguments: Option<Shape<'a, IgnoredAny>>,
}

/// The messages as the instructions and the items (module docstring), each item's text
/// located at its message's field.
fn parse_messages(raw: &RawValue, limits: &Limits) -> Result<ChatParts> {
    let path = Path::root("messages");
    let elements = match shape::read::<RawMessage>(raw.get(), &path)? {
        Shape::Array(elements) => elements,
        other => return Err(field::type_error(&path, "an array of messages", other.kind())),
    };
    let count = message_count(elements.len(), limits)?;
    let mut parts = ChatParts {
        instructions: None,
        input: Input {
            items: Vec::with_capacity(count),
            sources: Vec::with_capacity(count),
            ..Input::default()
        },
        input_json: String::new(),
        input_bytes: raw.get().len(),
        seen: None,
        seen_bytes: 0..0,
        raw: None,
    };
    for (i, element) in elements.into_iter().enumerate() {
        add_message(element.object(&path.index(i))?, i, limits, &mut parts)?;
    }
    finish(parts, 0, limits)
}

fn message_count(count: usize, limits: &Limits) -> Result<usize> {
    let path = Path::root("messages");
    if count == 0 {
        return Err(invalid_value(&path, "'messages' must hold at least one message."));
    }
    if count > limits.max_items {
        return Err(field::array_above_max_length(&path, count, limits.max_items));
    }
    Ok(count)
}

/// The parts complete: the items' bound (`seen` items before them) and their JSON.
fn finish(mut parts: ChatParts, seen: usize, limits: &Limits) -> Result<ChatParts> {
    let count = seen + parts.input.items.len();
    if count > limits.max_items {
        return Err(field::array_above_max_length(
            &Path::root("messages"),
            count,
            limits.max_items,
        ));
    }
    parts.input_json = items_json(&parts.input.items);
    Ok(parts)
}

/// [`raw_chain`]'s kind of a chat `messages` array.
const MESSAGES: u8 = 2;

/// The messages parsed with the key's raw addresses (`history::parse_history` for a chat
/// request): the leading messages a request of the key had, byte for byte, after the
/// same `tools` and `reasoning_effort` bytes, are recognized, not parsed (a leading
/// system or developer message is read again for the instructions); anything else is
/// parsed whole. The raw chain starts from those fields' bytes (the instructions are the
/// first message's), so the same bytes stand for the same prefix.
fn parse_messages_seen(
    chat: &ChatBody,
    raw: &RawValue,
    limits: &Limits,
    seen: &SeenItems,
) -> Result<ChatParts> {
    let Some(elements) = array_elements(raw.get()) else {
        return parse_messages(raw, limits);
    };
    let fields: [Option<&RawValue>; 2] = [chat.tools, chat.reasoning_effort];
    let start = raw_fields_digest(&fields.map(|f| f.map(RawValue::get)));
    let chain = raw_chain(MESSAGES, start, &elements);
    let raw_end = chain.last().map(|digest| (*digest, elements.len()));
    let recognized = seen
        .longest(&chain)
        .and_then(|found| Some((found, parse_after(&elements, found, raw, limits).ok()?)));
    let mut parts = match recognized {
        Some((found, parts)) => ChatParts {
            seen: Some(found),
            seen_bytes: span_of(raw.get(), &elements[..found.elements]),
            ..parts
        },
        None => parse_messages(raw, limits)?,
    };
    parts.raw = raw_end;
    Ok(parts)
}

/// The messages after the `found` ones, each read from its bytes (and the first, for the
/// instructions it may be).
fn parse_after(elements: &[&str], found: Seen, raw: &RawValue, limits: &Limits) -> Result<ChatParts> {
    let path = Path::root("messages");
    message_count(elements.len(), limits)?;
    let mut parts = ChatParts {
        instructions: None,
        input: Input {
            offset: found.items,
            ..Input::default()
        },
        input_json: String::new(),
        input_bytes: raw.get().len(),
        seen: None,
        seen_bytes: 0..0,
        raw: None,
    };
    let read = |i: usize| -> Result<RawMessage> {
        let message_path = path.index(i);
        shape::read::<RawMessage>(elements[i], &message_path)?.object(&message_path)
    };
    if found.elements > 0 {
        let mut first = read(0)?;
        let role = required_text(first.role.take(), &path.index(0).key("role"), NO_LIMIT)?;
        if matches!(role.as_str(), "system" | "developer") {
            let (text, _) = content(first.content, &path.index(0), &["text"], limits.max_text_bytes)?;
            parts.instructions = Some(text);
        }
    }
    for i in found.elements..elements.len() {
        add_message(read(i)?, i, limits, &mut parts)?;
    }
    finish(parts, found.items, limits)
}

/// Message `i`'s items (or the instructions, a leading system or developer message).
fn add_message(mut message: RawMessage, i: usize, limits: &Limits, parts: &mut ChatParts) -> Result<()> {
    let input = &mut parts.input;
    let instructions = &mut parts.instructions;
    let messages = Path::root("messages");
    let message_path = messages.index(i);
    let role_path = message_path.key("role");
    let role = required_text(message.role.take(), &role_path, NO_LIMIT)?;
    let max = limits.max_text_bytes;
    match role.as_str() {
        "system" | "developer" => {
            let role = if role == "system" {
                Role::System
            } else {
                Role::Developer
            };
            let (text, source) = content(message.content, &message_path, &["text"], max)?;
            if i == 0 {
                *instructions = Some(text);
            } else {
                push(input, Item::Message { role, text }, source);
            }
        }
        "user" => {
            let allowed: &[&str] = if limits.images {
                &["text", "image_url"]
            } else {
                &["text"]
            };
            let (text, source) = content(message.content, &message_path, allowed, max)?;
            push(
                input,
                Item::Message {
                    role: Role::User,
                    text,
                },
                source,
            );
        }
        "assistant" => assistant(message, &message_path, max, input)?,
        "tool" => {
            let call_id = required_name(message.tool_call_id, &message_path.key("tool_call_id"), max)?;
            let (output, source) = content(message.content, &message_path, &["text"], max)?;
            push(input, Item::FunctionCallOutput { call_id, output }, source);
        }
        "function" => {
            return Err(invalid_value(
                &role_path,
                format!(
                    "Invalid value for '{role_path}': 'function' messages are deprecated and \
                     not supported; answer a tool call with a 'tool' message."
                ),
            ))
        }
        other => {
            return Err(invalid_value(
                &role_path,
                format!(
                    "Invalid value for '{role_path}': '{other}'. Supported values are 'system', \
                     'developer', 'user', 'assistant' and 'tool'."
                ),
            ))
        }
    }
    Ok(())
}

fn push(input: &mut Input, item: Item, source: TextSource) {
    input.items.push(item);
    input.sources.push(source);
}

/// A message's required `content`: a string or a list of the `allowed` part types.
fn content(
    content: Option<Shape<RawPart>>,
    message_path: &Path,
    allowed: &[&str],
    max: usize,
) -> Result<(String, TextSource)> {
    let path = message_path.key("content");
    let content = content.ok_or_else(|| field::missing(&path))?;
    let (text, source) = text_or_parts(content, &path, "content", allowed, "", max)?;
    Ok((text, source.at(&path)))
}

/// An assistant message: its reasoning, its text and its tool calls, in that order.
fn assistant(message: RawMessage, path: &Path, max: usize, input: &mut Input) -> Result<()> {
    // vLLM's name first, as vLLM reads it; SGLang's and DeepSeek's otherwise.
    let (reasoning, reasoning_field) = match (message.reasoning, message.reasoning_content) {
        (Some(r), _) if !r.is_null() => (Some(r), "reasoning"),
        (_, Some(r)) if !r.is_null() => (Some(r), "reasoning_content"),
        _ => (None, "reasoning"),
    };
    let mut reasoned = false;
    if let Some(reasoning) = reasoning {
        let reasoning_path = path.key(reasoning_field);
        let text = reasoning.text(&reasoning_path, max)?.into_owned();
        if !text.is_empty() {
            reasoned = true;
            push(
                input,
                Item::Reasoning { text },
                TextSource::plain("reasoning").at(&reasoning_path),
            );
        }
    }
    let calls = match message.tool_calls {
        None => Vec::new(),
        Some(shape) if shape.is_null() => Vec::new(),
        Some(Shape::Array(calls)) => calls,
        Some(other) => {
            return Err(field::type_error(
                &path.key("tool_calls"),
                "an array of tool calls",
                other.kind(),
            ))
        }
    };
    let content = message.content.filter(|c| !c.is_null());
    let content_path = path.key("content");
    match content {
        Some(content) => {
            let (text, source) =
                text_or_parts(content, &content_path, "content", &["text", "refusal"], "", max)?;
            // An empty text beside tool calls is no message: the calls are the turn.
            if !text.is_empty() || calls.is_empty() {
                push(
                    input,
                    Item::Message {
                        role: Role::Assistant,
                        text,
                    },
                    source.at(&content_path),
                );
            }
        }
        None if calls.is_empty() && !reasoned => return Err(field::missing(&content_path)),
        None => {}
    }
    let calls_path = path.key("tool_calls");
    for (j, call) in calls.into_iter().enumerate() {
        let call_path = calls_path.index(j);
        let call = call.object(&call_path)?;
        let type_path = call_path.key("type");
        if let Some(kind) = call.kind {
            let kind = kind.text(&type_path, NO_LIMIT)?;
            if kind != "function" {
                return Err(Error::new(
                    Code::UnsupportedContent,
                    format!("Tool call '{call_path}' of type '{kind}' is not supported; only 'function' calls are."),
                )
                .at(type_path.to_string()));
            }
        }
        let call_id = required_name(call.id, &call_path.key("id"), max)?;
        let function_path = call_path.key("function");
        let function = call.function.ok_or_else(|| field::missing(&function_path))?;
        let function = function.object(&function_path)?;
        let name = required_name(function.name, &function_path.key("name"), max)?;
        let arguments_path = function_path.key("arguments");
        let arguments = required_text(function.arguments, &arguments_path, max)?;
        let item = Item::FunctionCall {
            call_id,
            name,
            arguments,
        };
        push(input, item, TextSource::plain("arguments").at(&arguments_path));
    }
    Ok(())
}

/// The items as a Responses `input` array (what the server keeps as a request's input).
fn items_json(items: &[Item]) -> String {
    let values: Vec<Value> = items
        .iter()
        .map(|item| match item {
            Item::Message { role, text } => {
                json!({"type": "message", "role": role.as_str(), "content": text})
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => json!({"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}),
            Item::FunctionCallOutput { call_id, output } => {
                json!({"type": "function_call_output", "call_id": call_id, "output": output})
            }
            Item::Reasoning { text } => json!({
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
            }),
        })
        .collect();
    Value::Array(values).to_string()
}
