//! A `response.create` request (the WebSocket event's fields, or a `POST /v1/responses`
//! body) parsed into what the conversation and the server need, and the JSON of the
//! fields a Response echoes.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::field::{self, invalid_value};
use super::input::{input_json, parse_input, Input};
use super::path::Path;
use super::policy::Policy;
use super::tools::{parse_tool_choice, parse_tools, SkippedTool, ToolChoice};
use super::values::check_values;
use super::Limits;
use crate::error::{Code, Error, Result};
use crate::item::Prefix;

/// The fields of a request body this server reads, as raw slices of the frame. Unknown
/// fields (`include`, `prompt_cache_key`, `client_metadata`, ...) are skipped.
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
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    pub input: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow)]
    store: Option<&'a RawValue>,
    #[serde(borrow)]
    generate: Option<&'a RawValue>,
    #[serde(borrow)]
    background: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    truncation: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawReasoning<'a> {
    #[serde(borrow)]
    effort: Option<&'a RawValue>,
}

/// A parsed `response.create`. When `error` is set the request must be refused with it;
/// the fields before the failing one are filled (`stream_id` always is when it is a
/// string), the rest hold defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    pub error: Option<Error>,
    pub model: Option<String>,
    pub previous_response_id: Option<String>,
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
    /// Tools of types the server does not run, left out of `prefix.tools`.
    pub skipped_tools: Vec<SkippedTool>,
    pub tool_choice: ToolChoice,
    /// Default true.
    pub parallel_tool_calls: bool,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// The input as a JSON array of items (a string input becomes one user message).
    pub input_json: String,
    /// Bytes of the raw `input` field.
    pub input_bytes: usize,
    /// Bytes of the frame or HTTP body the request came in: what its parse and render
    /// cost grows with (input, tools, instructions), so what decides where they run.
    pub frame_bytes: usize,
    /// The fields a Response echoes, defaults and nulls filled in (`{}` when `error`
    /// is set), compact, in a fixed order. `model` is null when the request named none,
    /// spelled `"model":null` before any field that could contain that text (only
    /// `instructions`, `max_output_tokens` and `metadata` precede it), so the server can
    /// substitute its own model name with one string replacement.
    pub response_fields_json: String,
}

impl Default for CreateRequest {
    fn default() -> Self {
        CreateRequest {
            error: None,
            model: None,
            previous_response_id: None,
            stream_id: None,
            store: true,
            generate: true,
            background: false,
            stream: false,
            prefix: Prefix::default(),
            input: Input::default(),
            skipped_tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            max_output_tokens: None,
            temperature: None,
            top_p: None,
            input_json: "[]".to_string(),
            input_bytes: 0,
            frame_bytes: 0,
            response_fields_json: "{}".to_string(),
        }
    }
}

const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

impl CreateRequest {
    /// Parse the fields of `body`; `outer_stream_id` is the envelope's, for the nested form.
    pub(super) fn from_body(body: &Body, outer_stream_id: Option<&RawValue>, limits: &Limits) -> Self {
        let mut request = CreateRequest::default();
        if let Err(e) = request.fill(body, outer_stream_id, limits) {
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

    fn fill(&mut self, body: &Body, outer_stream_id: Option<&RawValue>, limits: &Limits) -> Result<()> {
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
        let text = text_config(body.text)?;
        let truncation = truncation(body.truncation)?;
        self.prefix.instructions = field::opt_string(body.instructions, &Path::root("instructions"), max)?;
        self.prefix.reasoning_effort = reasoning_effort(body.reasoning)?;
        let tools = parse_tools(body.tools, limits)?;
        self.tool_choice = parse_tool_choice(body.tool_choice, &tools.functions)?;
        self.prefix.tools = tools.functions;
        self.skipped_tools = tools.skipped;
        self.input_bytes = body.input.map_or(0, |r| r.get().len());
        self.input = parse_input(body.input, limits)?;
        self.input_json = input_json(body.input);
        self.response_fields_json = self.response_fields(body, &text, truncation);
        Ok(())
    }

    fn response_fields(&self, body: &Body, text: &str, truncation: &str) -> String {
        let raw_or = |raw: Option<&RawValue>, default: &str| raw.map_or(default, RawValue::get).to_string();
        let json = |v: &Option<String>| serde_json::to_string(v).unwrap_or_else(|_| "null".into());
        let fields: [(&str, String); 14] = [
            ("instructions", json(&self.prefix.instructions)),
            ("max_output_tokens", raw_or(body.max_output_tokens, "null")),
            ("metadata", raw_or(body.metadata, "{}")),
            ("model", json(&self.model)),
            ("parallel_tool_calls", self.parallel_tool_calls.to_string()),
            ("previous_response_id", json(&self.previous_response_id)),
            ("reasoning", raw_or(body.reasoning, "null")),
            ("store", self.store.to_string()),
            ("temperature", raw_or(body.temperature, "null")),
            ("text", text.to_string()),
            ("tool_choice", raw_or(body.tool_choice, r#""auto""#)),
            ("tools", raw_or(body.tools, "[]")),
            ("top_p", raw_or(body.top_p, "null")),
            ("truncation", format!("\"{truncation}\"")),
        ];
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

    /// Scan the new text of this request (instructions and input items) with `policy`.
    pub fn check_policy(&self, policy: &Policy) -> Result<()> {
        if let Some(instructions) = &self.prefix.instructions {
            policy.check_text(instructions, "instructions")?;
        }
        policy.check_input(&self.input)
    }
}

/// Parse an HTTP `POST /v1/responses` body. Malformed JSON or a body that is not an
/// object is an `invalid_json` error; anything else lands in `CreateRequest::error`.
pub fn parse_request(body: &[u8], limits: &Limits) -> Result<CreateRequest> {
    let text = std::str::from_utf8(body).map_err(|_| not_utf8())?;
    let fields: Body = parse_object(text, "The request body")?;
    let mut request = match check_values(text) {
        Ok(()) => CreateRequest::from_body(&fields, None, limits),
        Err(e) => CreateRequest::refused(e, None),
    };
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
