//! The core's one error type: a stable code, a message a developer can act on, and
//! where in the request it happened (`param`, a path such as `input[3].call_id`).
//! The protocol layer maps it to the wire once; nothing below it formats wire errors.

use std::fmt;

/// Stable error codes. `as_str` is what goes on the wire as `error.code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidJson,
    UnknownEventType,
    InvalidType,
    MissingRequiredParameter,
    InvalidValue,
    StringAboveMaxLength,
    ArrayAboveMaxLength,
    ArrayAboveMaxBytes,
    UnknownCallId,
    InvalidToolSchema,
    ContextLengthExceeded,
    ContentPolicyViolation,
    UnsupportedContent,
    UnknownTokenizer,
    InvalidVocabulary,
    InvalidTemplate,
    TemplateError,
    SpecialTokenInContent,
    /// A request field this server cannot honour (Chat Completions' `n` above 1, `stop`, ...).
    UnsupportedParameter,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidJson => "invalid_json",
            Code::UnknownEventType => "unknown_event_type",
            Code::InvalidType => "invalid_type",
            Code::MissingRequiredParameter => "missing_required_parameter",
            Code::InvalidValue => "invalid_value",
            Code::StringAboveMaxLength => "string_above_max_length",
            Code::ArrayAboveMaxLength => "array_above_max_length",
            Code::ArrayAboveMaxBytes => "array_above_max_bytes",
            Code::UnknownCallId => "unknown_call_id",
            Code::InvalidToolSchema => "invalid_tool_schema",
            Code::ContextLengthExceeded => "context_length_exceeded",
            Code::ContentPolicyViolation => "content_policy_violation",
            Code::UnsupportedContent => "unsupported_content",
            Code::UnknownTokenizer => "unknown_tokenizer",
            Code::InvalidVocabulary => "invalid_vocabulary",
            Code::InvalidTemplate => "invalid_template",
            Code::TemplateError => "template_error",
            Code::SpecialTokenInContent => "special_token_in_content",
            Code::UnsupportedParameter => "unsupported_parameter",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// Where in the request: `input[3].content[0].text`, `tools[1].parameters`, ...
    pub param: Option<String>,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            param: None,
        }
    }

    pub fn at(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} ({}): {}", self.code.as_str(), p, self.message),
            None => write!(f, "{}: {}", self.code.as_str(), self.message),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
