//! A `response.create` request (the WebSocket event's fields, or a `POST /v1/responses`
//! body) parsed into what the conversation and the server need, and the JSON of the
//! fields a Response echoes.

use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::field::{self, invalid_value};
use super::history::{parse_history, seen_skip, Digest, History, Seen, SeenItems};
use super::input::{input_json, Input};
use super::path::Path;
use super::policy::Policy;
use super::prompt_cache::PromptCache;
use super::tools::{parse_tool_choice, parse_tools, SkippedTool, ToolChoice, ToolForm};
use super::values::check_values_except;
use super::Limits;
use crate::error::{Code, Error, Result};
use crate::item::Prefix;

/// The fields of a request body this server reads, as raw slices of the frame. Unknown
/// fields (`include`, `client_metadata`, ...) are skipped.
#[derive(Deserialize, Default)]
pub(super) struct Body<'a> {
    #[serde(borrow, rename = "type")]
    pub kind: Option<&'a RawValue>,
    /// The nested form `{"type": "response.create", "response": {...}}`.
    #[serde(borrow)]
    pub response: Option<&'a RawValue>,
    #[serde(borrow)]
    pub response_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub stream_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) model: Option<&'a RawValue>,
    #[serde(borrow)]
    pub input: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) previous_response_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) conversation: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) store: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) generate: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) background: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) stream: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) tools: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) top_p: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) text: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) truncation: Option<&'a RawValue>,
    // Echoed only (Open Responses requires them in a Response with a value).
    #[serde(borrow)]
    pub(super) frequency_penalty: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) presence_penalty: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) top_logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) max_tool_calls: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) service_tier: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) safety_identifier: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) prompt_cache_retention: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) prompt_cache_options: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) context_management: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawReasoning<'a> {
    #[serde(borrow)]
    effort: Option<&'a RawValue>,
    #[serde(borrow)]
    summary: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawContextManagement<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    compact_threshold: Option<&'a RawValue>,
}

/// A parsed `response.create`. When `error` is set the request must be refused with it;
/// the fields before the failing one are filled (`stream_id` always is when it is a
/// string), the rest hold defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    pub error: Option<Error>,
    pub model: Option<String>,
    pub previous_response_id: Option<String>,
    /// The conversation's id (`conversation` as a string or `{"id": ...}`).
    pub conversation: Option<String>,
    /// As sent; the server checks its syntax (`invalid_stream_id`).
    pub stream_id: Option<String>,
    /// Default true.
    pub store: bool,
    /// Default true; false is a warm-up (validate, render, cache; no sampling).
    pub generate: bool,
    pub background: bool,
    /// Meaningful for HTTP only (SSE vs JSON); implicit on a WebSocket.
    pub stream: bool,
    /// Instructions, function tools and reasoning effort: what the format renders first.
    pub prefix: Prefix,
    /// The new items, one per `input` element.
    pub input: Input,
    /// The content addresses of the prefix and of each input item (`history`).
    pub history: History,
    /// Tools of types the server does not run, left out of `prefix.tools`.
    pub skipped_tools: Vec<SkippedTool>,
    pub tool_choice: ToolChoice,
    /// Default true.
    pub parallel_tool_calls: bool,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `context_management: [{"type": "compaction", "compact_threshold": N}]`: compact
    /// the conversation when a turn's prompt passes N tokens.
    pub compact_threshold: Option<u64>,
    /// `prompt_cache_key`, `prompt_cache_retention` and `prompt_cache_options`.
    pub prompt_cache: PromptCache,
    /// The input as a JSON array of items (a string input becomes one user message).
    pub input_json: InputJson,
    /// Bytes of the raw `input` field.
    pub input_bytes: usize,
    /// Bytes of the frame or HTTP body the request came in: what its parse and render
    /// cost grows with (input, tools, instructions), so what decides where they run.
    pub frame_bytes: usize,
    /// The fields a Response echoes, defaults and nulls filled in (`{}` when `error`
    /// is set), compact, in a fixed order. `model` is null when the request named none,
    /// spelled `"model":null` before any field that could contain that text (only
    /// `frequency_penalty`, `instructions`, `max_output_tokens`, `max_tool_calls` and
    /// `metadata` precede it), so the server can substitute its own model name with one
    /// string replacement.
    pub response_fields_json: String,
}

impl Default for CreateRequest {
    fn default() -> Self {
        CreateRequest {
            error: None,
            model: None,
            previous_response_id: None,
            conversation: None,
            stream_id: None,
            store: true,
            generate: true,
            background: false,
            stream: false,
            prefix: Prefix::default(),
            input: Input::default(),
            history: History::default(),
            skipped_tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            max_output_tokens: None,
            temperature: None,
            top_p: None,
            compact_threshold: None,
            prompt_cache: PromptCache::default(),
            input_json: InputJson::Built("[]".to_string()),
            input_bytes: 0,
            frame_bytes: 0,
            response_fields_json: "{}".to_string(),
        }
    }
}

/// What a Chat Completions request spells apart from a Responses body, parsed by
/// `chat.rs`: the instructions (its leading system or developer message) and the items
/// its other messages become.
pub(super) struct ChatParts {
    pub instructions: Option<String>,
    pub input: Input,
    /// The items as a Responses `input` array (those after the `seen` ones).
    pub input_json: String,
    /// Bytes of the raw `messages` field.
    pub input_bytes: usize,
    /// The leading messages recognized by their bytes (`chat::parse_messages_seen`):
    /// what they stand for, parsed; `input` holds the items after them.
    pub seen: Option<Seen>,
    /// Where the `seen` messages lie in the text of `messages` (`History::seen_bytes`).
    pub seen_bytes: Range<usize>,
    /// The raw address of the whole `messages` and its count of messages (`History::raw`).
    pub raw: Option<(Digest, usize)>,
}

pub(super) const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// A request's input as a JSON array of items.
#[derive(Clone, Debug, PartialEq)]
pub enum InputJson {
    /// Written here: a string input's one message, a chat request's items, none.
    Built(String),
    /// The array as sent, by its place in the frame the request was parsed from, which
    /// the request's holder keeps: a history resent every turn is not copied (a
    /// megabyte of input is a megabyte of fresh pages for every request that copies it).
    InFrame(Range<usize>),
}

impl InputJson {
    /// `raw`, the `input` field of a body parsed from `frame`.
    fn of(raw: Option<&RawValue>, frame: &str) -> InputJson {
        let within =
            |raw: &RawValue| field::offset_in(frame, raw.get()).map(|start| start..start + raw.get().len());
        match raw {
            Some(array) if !field::is_string(array) => match within(array) {
                Some(span) => InputJson::InFrame(span),
                None => InputJson::Built(input_json(raw)),
            },
            _ => InputJson::Built(input_json(raw)),
        }
    }

    /// The JSON; `frame` is the text the request was parsed from.
    pub fn text<'a>(&'a self, frame: &'a str) -> &'a str {
        match self {
            InputJson::Built(json) => json,
            InputJson::InFrame(span) => &frame[span.clone()],
        }
    }
}

impl CreateRequest {
    /// Parse the fields of `body`, read from `frame`; `outer_stream_id` is the envelope's, for the nested
    /// form. `chat`: the parts a Chat Completions request spells its own way, parsed
    /// (`chat.rs`); its `tools` and `tool_choice` are in the body, in the chat form.
    /// `seen`: the key's raw addresses, which a request that continues no response or
    /// conversation is recognized by (`history::parse_history`).
    pub(super) fn from_body(
        body: &Body,
        frame: &str,
        outer_stream_id: Option<&RawValue>,
        limits: &Limits,
        chat: Option<ChatParts>,
        seen: Option<&SeenItems>,
    ) -> Self {
        let mut request = CreateRequest::default();
        if let Err(e) = request.fill(body, frame, outer_stream_id, limits, chat, seen) {
            request.error = Some(e);
            request.response_fields_json = "{}".to_string();
        }
        request
    }

    /// A request refused before its fields could be read (the nested `response` is not
    /// an object).
    pub(super) fn refused(error: Error, stream_id: Option<String>) -> Self {
        CreateRequest {
            error: Some(error),
            stream_id,
            ..CreateRequest::default()
        }
    }

    fn fill(
        &mut self,
        body: &Body,
        frame: &str,
        outer_stream_id: Option<&RawValue>,
        limits: &Limits,
        chat: Option<ChatParts>,
        seen: Option<&SeenItems>,
    ) -> Result<()> {
        let max = limits.max_text_bytes;
        // The lane first, so that an error about anything else can still name it.
        self.stream_id =
            field::opt_string(body.stream_id.or(outer_stream_id), &Path::root("stream_id"), max)?;
        self.model = field::opt_string(body.model, &Path::root("model"), max)?;
        self.previous_response_id = field::opt_string(
            body.previous_response_id,
            &Path::root("previous_response_id"),
            max,
        )?;
        self.conversation = conversation_id(body.conversation, max)?;
        self.store = field::opt_bool(body.store, &Path::root("store"), true)?;
        self.generate = field::opt_bool(body.generate, &Path::root("generate"), true)?;
        self.background = field::opt_bool(body.background, &Path::root("background"), false)?;
        self.stream = field::opt_bool(body.stream, &Path::root("stream"), false)?;
        self.parallel_tool_calls =
            field::opt_bool(body.parallel_tool_calls, &Path::root("parallel_tool_calls"), true)?;
        self.max_output_tokens = body
            .max_output_tokens
            .map(|r| field::positive_int(r, &Path::root("max_output_tokens")))
            .transpose()?;
        self.temperature = body
            .temperature
            .map(|r| field::number_in(r, &Path::root("temperature"), 0.0, 2.0))
            .transpose()?;
        self.top_p = body
            .top_p
            .map(|r| field::number_in(r, &Path::root("top_p"), 0.0, 1.0))
            .transpose()?;
        check_metadata(body.metadata)?;
        self.compact_threshold = compact_threshold(body.context_management)?;
        let echoed = echoed_settings(body, max)?;
        self.prompt_cache = PromptCache::parse(
            body.prompt_cache_key,
            body.prompt_cache_retention,
            body.prompt_cache_options,
            max,
        )?;
        // The SDK documents `prewarm: true` as overriding `generate` to false: one
        // engine prefill path serves both.
        if self.prompt_cache.options.as_ref().is_some_and(|o| o.prewarm) {
            self.generate = false;
        }
        let text = text_config(body.text)?;
        let truncation = truncation(body.truncation)?;
        self.prefix.reasoning_effort = reasoning_effort(body.reasoning)?;
        let reasoning = reasoning_echo(body.reasoning)?;
        let form = if chat.is_some() {
            ToolForm::Chat
        } else {
            ToolForm::Responses
        };
        let tools = parse_tools(body.tools, limits, form)?;
        self.tool_choice = parse_tool_choice(body.tool_choice, &tools.functions, form)?;
        let tool_choice_echo = match (&self.tool_choice, form) {
            (ToolChoice::Function(name), ToolForm::Chat) => {
                serde_json::json!({"type": "function", "name": name}).to_string()
            }
            _ => body.tool_choice.map_or(r#""auto""#, RawValue::get).to_string(),
        };
        self.prefix.tools = tools.functions;
        self.prefix.namespaces = tools.namespaces;
        self.skipped_tools = tools.skipped;
        match chat {
            Some(chat) => {
                self.prefix.instructions = chat.instructions;
                self.input_bytes = chat.input_bytes;
                self.input = chat.input;
                self.input_json = InputJson::Built(chat.input_json);
                self.history = History::of(&self.prefix, &self.input.items);
                self.history.raw = chat.raw;
                if let Some(seen) = chat.seen {
                    self.history.seen = seen;
                    self.history.seen_bytes = chat.seen_bytes;
                }
            }
            None => {
                self.prefix.instructions =
                    field::opt_string(body.instructions, &Path::root("instructions"), max)?;
                self.input_bytes = body.input.map_or(0, |r| r.get().len());
                let seen =
                    seen.filter(|_| self.previous_response_id.is_none() && self.conversation.is_none());
                (self.input, self.history) = parse_history(body.input, &self.prefix, limits, seen)?;
                self.input_json = InputJson::of(body.input, frame);
            }
        }
        let tools_echo = body
            .tools
            .map_or_else(|| "[]".to_string(), |_| tools.echo_json.clone());
        self.response_fields_json = self.response_fields(
            body,
            &Echo {
                text,
                truncation,
                reasoning,
                tools: tools_echo,
                tool_choice: tool_choice_echo,
                settings: echoed,
            },
        );
        Ok(())
    }

    fn response_fields(&self, body: &Body, echo: &Echo) -> String {
        let raw_or = |raw: Option<&RawValue>, default: &str| raw.map_or(default, RawValue::get).to_string();
        let json = |v: &Option<String>| serde_json::to_string(v).unwrap_or_else(|_| "null".into());
        let settings = &echo.settings;
        // Open Responses requires every sampling setting with a number: a request that
        // sets none was served with the API's documented defaults.
        let fields: [(&str, String); 20] = [
            ("frequency_penalty", number(settings.frequency_penalty)),
            ("instructions", json(&self.prefix.instructions)),
            ("max_output_tokens", raw_or(body.max_output_tokens, "null")),
            ("max_tool_calls", raw_or(body.max_tool_calls, "null")),
            ("metadata", raw_or(body.metadata, "{}")),
            ("model", json(&self.model)),
            ("parallel_tool_calls", self.parallel_tool_calls.to_string()),
            ("presence_penalty", number(settings.presence_penalty)),
            ("previous_response_id", json(&self.previous_response_id)),
            ("reasoning", echo.reasoning.clone()),
            ("safety_identifier", json(&settings.safety_identifier)),
            ("service_tier", format!("\"{}\"", settings.service_tier)),
            ("store", self.store.to_string()),
            ("temperature", number(self.temperature.unwrap_or(1.0))),
            ("text", echo.text.clone()),
            ("tool_choice", echo.tool_choice.clone()),
            ("tools", echo.tools.clone()),
            ("top_logprobs", settings.top_logprobs.to_string()),
            ("top_p", number(self.top_p.unwrap_or(1.0))),
            ("truncation", format!("\"{}\"", echo.truncation)),
        ];
        // `prompt_cache_key` in its alphabetical place, the other prompt-cache fields
        // (echoed when sent) with it.
        let (before, after) = fields.split_at(9);
        let prompt_cache = self.prompt_cache.echo();
        let fields: Vec<&(&str, String)> = before.iter().chain(&prompt_cache).chain(after).collect();
        let mut out = String::with_capacity(256 + fields.iter().map(|(_, v)| v.len()).sum::<usize>());
        out.push('{');
        for (i, (key, value)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(key);
            out.push_str("\":");
            out.push_str(value);
        }
        out.push('}');
        out
    }

    /// The request as a continuation from its `first` input item on (the items before it
    /// are already in the state it continues, found by their `history` digests): what
    /// rendering reads, the JSON the server echoes or stores left out. An item's errors
    /// still name its place in the whole `input`.
    pub fn tail(&self, first: usize) -> CreateRequest {
        CreateRequest {
            error: self.error.clone(),
            prefix: self.prefix.clone(),
            input: self.input.tail(first),
            max_output_tokens: self.max_output_tokens,
            ..CreateRequest::default()
        }
    }

    /// Scan the new text of this request (instructions and input items) with `policy`.
    pub fn check_policy(&self, policy: &Policy) -> Result<()> {
        if let Some(instructions) = &self.prefix.instructions {
            policy.check_text(instructions, "instructions")?;
        }
        policy.check_input(&self.input)
    }
}

/// What a Response echoes beside the request's own fields, each resolved once.
struct Echo {
    text: String,
    truncation: &'static str,
    reasoning: String,
    tools: String,
    tool_choice: String,
    settings: EchoedSettings,
}

/// Settings this server accepts and echoes but does not act on (one service tier, no
/// logprobs, no penalties in the engines).
struct EchoedSettings {
    frequency_penalty: f64,
    presence_penalty: f64,
    top_logprobs: u64,
    service_tier: &'static str,
    safety_identifier: Option<String>,
}

const SERVICE_TIERS: [&str; 5] = ["auto", "default", "flex", "scale", "priority"];

fn echoed_settings(body: &Body, max: usize) -> Result<EchoedSettings> {
    let penalty = |raw: Option<&RawValue>, name: &str| {
        raw.map_or(Ok(0.0), |r| field::number_in(r, &Path::root(name), -2.0, 2.0))
    };
    let top_logprobs = match body.top_logprobs {
        None => 0,
        Some(raw) => field::number_in(raw, &Path::root("top_logprobs"), 0.0, 20.0).and_then(|n| {
            if n.fract() == 0.0 {
                Ok(n as u64)
            } else {
                Err(field::type_error(
                    &Path::root("top_logprobs"),
                    "an integer",
                    "a number",
                ))
            }
        })?,
    };
    if let Some(raw) = body.max_tool_calls {
        field::positive_int(raw, &Path::root("max_tool_calls"))?;
    }
    let tier_path = Path::root("service_tier");
    let service_tier = match field::opt_string(body.service_tier, &tier_path, 64)? {
        // `auto` resolves to the tier that served the request: this server has one.
        None => "default",
        Some(tier) => match SERVICE_TIERS.iter().find(|t| **t == tier) {
            Some(&"auto") => "default",
            Some(known) => known,
            None => {
                return Err(invalid_value(
                    &tier_path,
                    format!(
                        "Invalid value for 'service_tier': '{tier}'. Supported values are {}.",
                        SERVICE_TIERS.map(|t| format!("'{t}'")).join(", ")
                    ),
                ))
            }
        },
    };
    Ok(EchoedSettings {
        frequency_penalty: penalty(body.frequency_penalty, "frequency_penalty")?,
        presence_penalty: penalty(body.presence_penalty, "presence_penalty")?,
        top_logprobs,
        service_tier,
        safety_identifier: field::opt_string(body.safety_identifier, &Path::root("safety_identifier"), max)?,
    })
}

/// A JSON number that stays a float on the wire (`1.0`, not `1`).
fn number(x: f64) -> String {
    serde_json::to_string(&x).unwrap_or_else(|_| "null".into())
}

/// `reasoning` as echoed: always `{"effort", "summary"}`, each null when not set.
fn reasoning_echo(raw: Option<&RawValue>) -> Result<String> {
    let path = Path::root("reasoning");
    let Some(raw) = raw else {
        return Ok(r#"{"effort":null,"summary":null}"#.to_string());
    };
    let reasoning: RawReasoning = field::object(raw, &path)?;
    let summary = field::opt_string(reasoning.summary, &path.key("summary"), 64)?;
    let effort = field::opt_string(reasoning.effort, &path.key("effort"), 64)?;
    Ok(serde_json::json!({"effort": effort, "summary": summary}).to_string())
}

/// The smallest `compact_threshold` accepted: below it a summary would not be shorter
/// than what it replaces.
const MIN_COMPACT_THRESHOLD: u64 = 1000;

/// `context_management`: a list of at most one `{"type": "compaction", "compact_threshold": N}`.
fn compact_threshold(raw: Option<&RawValue>) -> Result<Option<u64>> {
    let path = Path::root("context_management");
    let Some(raw) = raw else { return Ok(None) };
    if raw.get().trim() == "null" {
        return Ok(None);
    }
    let mut threshold = None;
    for (i, element) in field::bounded_array(raw, &path, 1)?.into_iter().enumerate() {
        let entry_path = path.index(i);
        let entry: RawContextManagement = field::object(element, &entry_path)?;
        let type_path = entry_path.key("type");
        let kind = field::string(field::required(entry.kind, &type_path)?, &type_path)?;
        if kind != "compaction" {
            return Err(invalid_value(
                &type_path,
                format!("Invalid value for '{type_path}': '{kind}'. Supported values are 'compaction'."),
            ));
        }
        let n_path = entry_path.key("compact_threshold");
        let n = field::positive_int(field::required(entry.compact_threshold, &n_path)?, &n_path)?;
        if n < MIN_COMPACT_THRESHOLD {
            return Err(invalid_value(
                &n_path,
                format!("Invalid '{n_path}': {n}; it must be at least {MIN_COMPACT_THRESHOLD} tokens."),
            ));
        }
        threshold = Some(n);
    }
    Ok(threshold)
}

/// Parse an HTTP `POST /v1/responses` body. Malformed JSON or a body that is not an
/// object is an `invalid_json` error; anything else lands in `CreateRequest::error`.
pub fn parse_request(body: &[u8], limits: &Limits) -> Result<CreateRequest> {
    parse_request_seen(body, limits, None)
}

/// [`parse_request`] with the key's raw addresses (`history::SeenItems`): the leading
/// input elements a request of the key had, byte for byte, are not parsed again.
pub fn parse_request_seen(body: &[u8], limits: &Limits, seen: Option<&SeenItems>) -> Result<CreateRequest> {
    let text = std::str::from_utf8(body).map_err(|_| not_utf8())?;
    let fields: Body = parse_object(text, "The request body")?;
    let mut request = CreateRequest::from_body(&fields, text, None, limits, None, seen);
    // Checked once the leading elements recognized by their bytes are known: they are
    // not read again. Any value refused wins over what the fields said.
    if let Err(e) = check_values_except(
        text,
        seen_skip(
            text,
            fields.input,
            &request.history.seen,
            &request.history.seen_bytes,
        ),
    ) {
        request = CreateRequest::refused(e, None);
    }
    request.frame_bytes = body.len();
    Ok(request)
}

pub(super) fn not_utf8() -> Error {
    Error::new(Code::InvalidJson, "The message is not valid UTF-8 text.")
}

/// Deserialize a JSON object into `T`; `what` names it in the error.
pub(super) fn parse_object<'a, T: Deserialize<'a>>(text: &'a str, what: &str) -> Result<T> {
    let first = text.trim_start().as_bytes().first().copied();
    let result = serde_json::from_str(text);
    match (result, first) {
        (Ok(value), Some(b'{')) => Ok(value),
        (Err(e), Some(b'{')) => Err(Error::new(
            Code::InvalidJson,
            format!("{what} is not valid JSON: {e}."),
        )),
        _ => match serde_json::from_str::<&RawValue>(text) {
            Ok(_) => Err(Error::new(
                Code::InvalidJson,
                format!("{what} must be a JSON object."),
            )),
            Err(e) => Err(Error::new(
                Code::InvalidJson,
                format!("{what} is not valid JSON: {e}."),
            )),
        },
    }
}

/// `conversation`: an id, or an object `{"id": ...}`.
fn conversation_id(raw: Option<&RawValue>, max: usize) -> Result<Option<String>> {
    #[derive(Deserialize)]
    struct Reference<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    let path = Path::root("conversation");
    let Some(raw) = raw else { return Ok(None) };
    if field::is_object(raw) {
        let reference: Reference = field::object(raw, &path)?;
        let id = field::required(reference.id, &path.key("id"))?;
        return field::bounded_string(id, &path.key("id"), max).map(Some);
    }
    if raw.get().trim() == "null" {
        return Ok(None);
    }
    field::bounded_string(raw, &path, max).map(Some)
}

fn check_metadata(raw: Option<&RawValue>) -> Result<()> {
    let path = Path::root("metadata");
    let Some(raw) = raw else { return Ok(()) };
    if !field::is_object(raw) {
        return Err(field::type_error(&path, "an object of strings", field::kind(raw)));
    }
    let map: serde_json::Map<String, Value> =
        serde_json::from_str(raw.get()).map_err(|e| invalid_value(&path, e.to_string()))?;
    if map.len() > 16 {
        return Err(Error::new(
            Code::InvalidValue,
            format!("'metadata' has {} keys, above the limit of 16.", map.len()),
        )
        .at("metadata"));
    }
    for (key, value) in &map {
        let p = path.key(key);
        if key.chars().count() > 64 {
            return Err(Error::new(
                Code::StringAboveMaxLength,
                format!("Metadata key '{key}' is longer than 64 characters."),
            )
            .at(p.to_string()));
        }
        match value {
            Value::String(s) if s.chars().count() <= 512 => {}
            Value::String(_) => {
                return Err(Error::new(
                    Code::StringAboveMaxLength,
                    format!("'{p}' is longer than 512 characters."),
                )
                .at(p.to_string()))
            }
            _ => {
                return Err(Error::new(
                    Code::InvalidType,
                    format!("Invalid type for '{p}': metadata values must be strings."),
                )
                .at(p.to_string()))
            }
        }
    }
    Ok(())
}

/// `reasoning.effort`, checked against the API's values.
fn reasoning_effort(raw: Option<&RawValue>) -> Result<Option<String>> {
    let path = Path::root("reasoning");
    let Some(raw) = raw else { return Ok(None) };
    let reasoning: RawReasoning = field::object(raw, &path)?;
    let effort_path = path.key("effort");
    let Some(effort) = field::opt_string(reasoning.effort, &effort_path, 64)? else {
        return Ok(None);
    };
    if !EFFORTS.contains(&effort.as_str()) {
        return Err(invalid_value(
            &effort_path,
            format!(
                "Invalid value for 'reasoning.effort': '{effort}'. Supported values are {}.",
                EFFORTS.map(|e| format!("'{e}'")).join(", ")
            ),
        ));
    }
    Ok(Some(effort))
}

/// `text` as echoed: as sent, with the default `format` filled in when missing.
fn text_config(raw: Option<&RawValue>) -> Result<String> {
    const DEFAULT: &str = r#"{"format":{"type":"text"}}"#;
    let path = Path::root("text");
    let Some(raw) = raw else {
        return Ok(DEFAULT.to_string());
    };
    if !field::is_object(raw) {
        return Err(field::type_error(&path, "an object", field::kind(raw)));
    }
    let mut config: serde_json::Map<String, Value> =
        serde_json::from_str(raw.get()).map_err(|e| invalid_value(&path, e.to_string()))?;
    let format_path = path.key("format");
    match config.get("format") {
        None | Some(Value::Null) => {
            config.insert("format".into(), serde_json::json!({"type": "text"}));
        }
        Some(Value::Object(format)) => match format.get("type") {
            Some(Value::String(t)) if ["text", "json_object", "json_schema"].contains(&t.as_str()) => {}
            _ => return Err(invalid_value(
                &format_path.key("type"),
                "Invalid 'text.format.type': supported values are 'text', 'json_object' and 'json_schema'.",
            )),
        },
        Some(_) => {
            return Err(Error::new(
                Code::InvalidType,
                "Invalid type for 'text.format': expected an object.",
            )
            .at(format_path.to_string()))
        }
    }
    Ok(Value::Object(config).to_string())
}

fn truncation(raw: Option<&RawValue>) -> Result<&'static str> {
    let path = Path::root("truncation");
    let Some(raw) = raw else { return Ok("disabled") };
    match field::string(raw, &path)?.as_str() {
        "auto" => Ok("auto"),
        "disabled" => Ok("disabled"),
        other => Err(invalid_value(
            &path,
            format!("Invalid value for 'truncation': '{other}'. Supported values are 'auto' and 'disabled'."),
        )),
    }
}
