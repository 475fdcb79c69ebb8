//! Responses-API items as chat messages, the way vLLM's Responses front end builds them
//! (`construct_input_messages`, then chat_utils' parsing) before `apply_chat_template`:
//!
//! - `instructions` become a leading `system` message;
//! - user/system/developer messages keep their role, their text parts joined;
//! - an assistant message, a reasoning item and function calls that follow one another
//!   merge into one `assistant` message: `content` (empty when there is only reasoning
//!   or calls), `tool_calls` (`{"id", "type": "function", "function": {"name",
//!   "arguments"}}` with the arguments parsed from JSON as vLLM does for templates, or as
//!   their JSON text for a template that uses them as text: [`Arguments`]),
//!   and the reasoning as both `reasoning` and `reasoning_content`;
//! - a function call output becomes a `tool` message with its `tool_call_id`.
//!
//! Tools become `{"type": "function", "function": {"name", "description", "parameters"}}`.
//!
//! Merging means a new item may change the last message; [`ChatMessages`] records the
//! first message changed since it was last taken, which is where re-rendering starts.
//! Messages are shared (`Arc`): a checkpoint of a conversation copies pointers, and
//! editing the last message copies only that one.

use std::sync::Arc;

use serde_json::{json, Map, Value as Json};

use crate::item::{Item, Role, Tool};

/// How a template is given a function call's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arguments {
    /// Parsed from JSON, as vLLM gives them (templates write `arguments | tojson`).
    #[default]
    Parsed,
    /// The JSON text the call carries, as OpenAI-form messages hold it (DeepSeek V3's
    /// template concatenates it to a string).
    Text,
}

impl Arguments {
    /// The `arguments` value of a call whose arguments are the JSON text `arguments`
    /// (text that is not JSON stays text).
    pub fn value(self, arguments: &str) -> Json {
        match self {
            Arguments::Parsed => {
                serde_json::from_str(arguments).unwrap_or_else(|_| Json::String(arguments.to_owned()))
            }
            Arguments::Text => Json::String(arguments.to_owned()),
        }
    }
}

/// The chat messages of a conversation, built item by item.
#[derive(Debug, Clone, Default)]
pub struct ChatMessages {
    messages: Vec<Arc<Json>>,
    arguments: Arguments,
    /// Index of the first message changed since [`ChatMessages::take_changed`].
    changed_from: usize,
    /// The first message is the `system` message made from `instructions`.
    instructions: bool,
}

impl ChatMessages {
    pub fn new(instructions: Option<&str>, arguments: Arguments) -> ChatMessages {
        let mut m = ChatMessages {
            arguments,
            ..ChatMessages::default()
        };
        m.set_instructions(instructions);
        m
    }

    /// Make, replace or drop the leading `system` message that `instructions` become
    /// (a request whose instructions changed).
    pub fn set_instructions(&mut self, instructions: Option<&str>) {
        let message = instructions.map(|text| Arc::new(json!({"role": "system", "content": text})));
        match (self.instructions, message) {
            (true, Some(m)) => self.messages[0] = m,
            (true, None) => {
                self.messages.remove(0);
            }
            (false, Some(m)) => self.messages.insert(0, m),
            (false, None) => return,
        }
        self.instructions = instructions.is_some();
        self.changed_from = 0;
    }

    /// Append `chunk` to the last message's text content (a message or tool output
    /// growing in chunks); false when the last message has no text content.
    pub fn grow_last(&mut self, chunk: &str) -> bool {
        let Some(last) = self.messages.len().checked_sub(1) else {
            return false;
        };
        if !self.messages[last].get("content").is_some_and(Json::is_string) {
            return false;
        }
        if let Some(Json::String(text)) = Arc::make_mut(&mut self.messages[last]).get_mut("content") {
            text.push_str(chunk);
        }
        self.changed_from = self.changed_from.min(last);
        true
    }

    pub fn messages(&self) -> &[Arc<Json>] {
        &self.messages
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The first message changed since the last call (`len()` when none), and reset.
    pub fn take_changed(&mut self) -> usize {
        std::mem::replace(&mut self.changed_from, self.messages.len())
    }

    pub fn push_items<'a>(&mut self, items: impl IntoIterator<Item = &'a Item>) {
        for item in items {
            self.push(item);
        }
    }

    pub fn push(&mut self, item: &Item) {
        match item {
            Item::Message { role, text } => match role {
                Role::Assistant => {
                    if let Some(open) = self.open_assistant(|m| m.get("content").is_some_and(is_empty_text)) {
                        open.insert("content".into(), Json::String(text.clone()));
                    } else {
                        self.append(json!({"role": "assistant", "content": text}));
                    }
                }
                role => self.append(json!({"role": role.as_str(), "content": text})),
            },
            Item::Reasoning { text } => {
                if let Some(open) = self.open_assistant(|m| !m.contains_key("reasoning")) {
                    set_reasoning(open, text);
                } else {
                    let mut message = assistant();
                    set_reasoning(&mut message, text);
                    self.append(Json::Object(message));
                }
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                let arguments = self.arguments.value(arguments);
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                if let Some(open) = self.open_assistant(|_| true) {
                    match open.get_mut("tool_calls") {
                        Some(Json::Array(calls)) => calls.push(call),
                        _ => {
                            open.insert("tool_calls".into(), Json::Array(vec![call]));
                        }
                    }
                } else {
                    let mut message = assistant();
                    message.insert("tool_calls".into(), Json::Array(vec![call]));
                    self.append(Json::Object(message));
                }
            }
            Item::FunctionCallOutput { call_id, output } => {
                self.append(json!({"role": "tool", "content": output, "tool_call_id": call_id}));
            }
        }
    }

    /// Append a chat message as given (callers that hold messages, not items).
    pub fn push_raw(&mut self, message: Json) {
        self.append(message);
    }

    fn append(&mut self, message: Json) {
        self.changed_from = self.changed_from.min(self.messages.len());
        self.messages.push(Arc::new(message));
    }

    /// The last message when it is an assistant message that `accepts` the item
    /// (marked changed, since the caller edits it).
    fn open_assistant(
        &mut self,
        accepts: impl Fn(&Map<String, Json>) -> bool,
    ) -> Option<&mut Map<String, Json>> {
        let last = self.messages.len().checked_sub(1)?;
        let open = self.messages[last].as_object()?;
        if open.get("role").and_then(Json::as_str) != Some("assistant") || !accepts(open) {
            return None;
        }
        self.changed_from = self.changed_from.min(last);
        Arc::make_mut(&mut self.messages[last]).as_object_mut()
    }
}

fn assistant() -> Map<String, Json> {
    let mut m = Map::new();
    m.insert("role".into(), Json::String("assistant".into()));
    m.insert("content".into(), Json::String(String::new()));
    m
}

fn set_reasoning(message: &mut Map<String, Json>, text: &str) {
    message.insert("reasoning".into(), Json::String(text.to_owned()));
    message.insert("reasoning_content".into(), Json::String(text.to_owned()));
}

fn is_empty_text(v: &Json) -> bool {
    v.as_str().is_some_and(str::is_empty)
}

/// Tool definitions in the chat-completions shape: Responses-API function tools
/// (`{"type": "function", "name", "description", "parameters"}`) are wrapped as vLLM
/// wraps them; definitions already in the chat shape pass as they are.
pub fn chat_tools(tools: Vec<Json>) -> Vec<Json> {
    tools
        .into_iter()
        .map(|tool| {
            if tool.get("function").is_some() {
                return tool;
            }
            let mut function = Map::new();
            for key in ["name", "description", "parameters"] {
                if let Some(v) = tool.get(key) {
                    function.insert(key.into(), v.clone());
                }
            }
            json!({"type": "function", "function": Json::Object(function)})
        })
        .collect()
}

/// The tools as chat-completions tool definitions.
pub fn tool_definitions(tools: &[Tool]) -> Vec<Json> {
    tools
        .iter()
        .map(|tool| {
            let mut function = Map::new();
            function.insert("name".into(), Json::String(tool.name.clone()));
            if let Some(description) = &tool.description {
                function.insert("description".into(), Json::String(description.clone()));
            }
            if !tool.parameters.is_null() {
                function.insert("parameters".into(), tool.parameters.clone());
            }
            json!({"type": "function", "function": Json::Object(function)})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_text_and_calls_merge_into_one_assistant_message() {
        let mut m = ChatMessages::new(Some("Be brief."), Arguments::Parsed);
        m.push(&Item::Message {
            role: Role::User,
            text: "hi".into(),
        });
        assert_eq!(m.take_changed(), 0);
        m.push(&Item::Reasoning { text: "think".into() });
        m.push(&Item::Message {
            role: Role::Assistant,
            text: "ok".into(),
        });
        m.push(&Item::FunctionCall {
            call_id: "c1".into(),
            name: "ls".into(),
            arguments: r#"{"path": "/"}"#.into(),
        });
        m.push(&Item::FunctionCallOutput {
            call_id: "c1".into(),
            output: "a b".into(),
        });
        assert_eq!(m.take_changed(), 2);
        assert_eq!(
            *m.messages()[2],
            json!({"role": "assistant", "content": "ok", "reasoning": "think", "reasoning_content": "think",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {"path": "/"}}}]})
        );
        assert_eq!(
            *m.messages()[3],
            json!({"role": "tool", "content": "a b", "tool_call_id": "c1"})
        );
        // A call after a tool output starts a new assistant message.
        m.push(&Item::FunctionCall {
            call_id: "c2".into(),
            name: "ls".into(),
            arguments: "{}".into(),
        });
        assert_eq!(m.take_changed(), 4);
        assert_eq!(m.messages()[4]["content"], json!(""));
    }
}
