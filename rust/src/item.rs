//! Conversation items and tool definitions, already validated: what chat formats render.
//! Parsing and validating raw request JSON into these lives in `validate`.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One item of a conversation (protocol.md section 4). Message content parts are
/// joined into one text; only text parts are accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Message {
        role: Role,
        text: String,
    },
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
    Reasoning {
        text: String,
    },
}

/// The kind of an item, which is all some formats need to know about a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Message(Role),
    FunctionCall,
    FunctionCallOutput,
    Reasoning,
}

impl Item {
    pub fn kind(&self) -> ItemKind {
        match self {
            Item::Message { role, .. } => ItemKind::Message(*role),
            Item::FunctionCall { .. } => ItemKind::FunctionCall,
            Item::FunctionCallOutput { .. } => ItemKind::FunctionCallOutput,
            Item::Reasoning { .. } => ItemKind::Reasoning,
        }
    }
}

/// A function tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name, qualified as `NAMESPACE.NAME` when it belongs to a `namespace` tool: the
    /// name chat templates render and a call carries (a function name has no dots).
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments (already checked to be a JSON object), or Null when
    /// the request gave none: formats render "no parameters" unlike an empty schema.
    pub parameters: Value,
    pub strict: bool,
}

/// The separator of a qualified function name (`multi_agent_v1.spawn_agent`).
pub const NAMESPACE_SEPARATOR: char = '.';

impl Tool {
    /// The namespace a qualified name belongs to and its function name.
    pub fn split_name(name: &str) -> Option<(&str, &str)> {
        name.split_once(NAMESPACE_SEPARATOR)
    }
}

/// A `namespace` tool: its functions are in [`Prefix::tools`] under qualified names.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    pub name: String,
    pub description: Option<String>,
}

/// The fixed part of a prompt that comes before the items: instructions and tools.
/// A change to it is a history-rewriting event (the conversation re-renders).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prefix {
    pub instructions: Option<String>,
    pub tools: Vec<Tool>,
    /// The request's `namespace` tools, in request order (formats that know namespaces
    /// render their functions apart).
    pub namespaces: Vec<Namespace>,
    /// `reasoning.effort` of the request (`low`/`medium`/`high`), for formats that render it.
    pub reasoning_effort: Option<String>,
}
