//! Tool definitions and `tool_choice`.
//!
//! `function` tools become [`Tool`]s for the chat format, with their `parameters` checked
//! as a JSON Schema. A `namespace` tool (Codex sends its multi-agent, MCP and app tools
//! so) contributes its function tools under qualified names (`NAMESPACE.NAME`) and a
//! [`Namespace`] for the formats that render namespaces apart. Every other tool type
//! (`custom`, `tool_search`, `web_search`, ...) is accepted and left out of rendering:
//! the server cannot run it, and refusing the request would break the client. They are
//! reported in [`Tools::skipped`] so the server can log them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::field::{self, invalid_value};
use super::path::Path;
use super::schema::check_schema;
use super::Limits;
use crate::error::{Code, Error, Result};
use crate::item::{Namespace, Tool, NAMESPACE_SEPARATOR};

/// The tools of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tools {
    /// `function` tools, in request order: what the chat format renders.
    pub functions: Vec<Tool>,
    /// `namespace` tools, in request order; their functions are in `functions`.
    pub namespaces: Vec<Namespace>,
    /// Tools of other types, accepted but not rendered.
    pub skipped: Vec<SkippedTool>,
    /// The list as a Response echoes it: as sent, with the fields a function tool must
    /// carry there (`description`, `parameters`, `strict`) filled in when missing.
    pub echo_json: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedTool {
    /// Position in the request's `tools`.
    pub index: usize,
    /// The tool's `type`, e.g. `web_search`.
    pub kind: String,
    /// Its `name`, for the types that have one (`custom`, ...); qualified inside a namespace.
    pub name: Option<String>,
}

/// How the model may pick tools (`tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
    /// Call this function tool.
    Function(String),
    /// A choice about a tool type this server does not run (`allowed_tools`,
    /// `web_search_preview`, `custom`, ...), by its `type`.
    Other(String),
}

#[derive(Deserialize)]
struct RawTool<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    description: Option<&'a RawValue>,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(borrow)]
    strict: Option<&'a RawValue>,
    /// A `namespace` tool's tools.
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    /// A Chat Completions function tool's function ([`ToolForm::Chat`]).
    #[serde(borrow)]
    function: Option<&'a RawValue>,
}

/// How a request spells its function tools and `tool_choice`: the Responses API's flat
/// `{"type": "function", "name", ...}`, or Chat Completions' `{"type": "function",
/// "function": {"name", ...}}` (whose `strict` defaults to false, and which has no
/// namespaces). Either parses to the same [`Tool`]s; the echo is in the Responses form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolForm {
    Responses,
    Chat,
}

/// The namespace harmony renders the request's plain function tools in: a `namespace`
/// tool of that name would merge with them.
const RESERVED_NAMESPACE: &str = "functions";

#[derive(Deserialize)]
struct RawToolChoice<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    function: Option<&'a RawValue>,
}

/// Function names as the API accepts them: `^[a-zA-Z0-9_-]{1,64}$`.
fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Parse and check `tools`. Agents send the same tool list with every turn, and checking
/// it costs far more than the rest of a small delta (a 46 KB list: ~190 us, against ~6 us
/// for a 2 KB tool result), so successful parses are remembered by their exact bytes.
pub fn parse_tools(raw: Option<&RawValue>, limits: &Limits, form: ToolForm) -> Result<Tools> {
    let Some(raw) = raw else {
        return Ok(Tools::default());
    };
    let bytes = raw.get().len();
    if bytes > limits.max_tools_bytes {
        return Err(Error::new(
            Code::ArrayAboveMaxBytes,
            format!(
                "'tools' is {bytes} bytes long, above the limit of {} bytes: send fewer or \
                 smaller tool definitions.",
                limits.max_tools_bytes
            ),
        )
        .at("tools"));
    }
    if let Some(tools) = TOOL_CACHE.get(raw.get(), limits, form) {
        return Ok(tools);
    }
    let tools = parse_uncached(raw, limits, form)?;
    TOOL_CACHE.insert(raw.get(), limits, form, &tools);
    Ok(tools)
}

/// Recently parsed tool lists, by their raw JSON and the limits they were checked with,
/// most recent first. Bounded in entries and in the size of a list it keeps.
struct ToolCache {
    entries: Mutex<VecDeque<Arc<CachedTools>>>,
}

struct CachedTools {
    raw: Box<str>,
    limits: Limits,
    form: ToolForm,
    tools: Tools,
}

// A process serves a handful of distinct tool lists (one per agent kind and version);
// a parsed list holds about 5x its JSON, so the cache stays under ~12 MB.
const TOOL_CACHE_ENTRIES: usize = 16;
const TOOL_CACHE_MAX_BYTES: usize = 128 * 1024;

static TOOL_CACHE: ToolCache = ToolCache {
    entries: Mutex::new(VecDeque::new()),
};

impl ToolCache {
    fn get(&self, raw: &str, limits: &Limits, form: ToolForm) -> Option<Tools> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let at = entries.iter().position(|e| {
            e.raw.len() == raw.len() && e.limits == *limits && e.form == form && *e.raw == *raw
        })?;
        let entry = entries.remove(at)?;
        entries.push_front(Arc::clone(&entry));
        // Clone outside the lock: other threads may parse meanwhile.
        drop(entries);
        Some(entry.tools.clone())
    }

    fn insert(&self, raw: &str, limits: &Limits, form: ToolForm, tools: &Tools) {
        if raw.len() > TOOL_CACHE_MAX_BYTES || tools.functions.is_empty() {
            return;
        }
        let entry = Arc::new(CachedTools {
            raw: raw.into(),
            limits: *limits,
            form,
            tools: tools.clone(),
        });
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.push_front(entry);
        entries.truncate(TOOL_CACHE_ENTRIES);
    }
}

fn parse_uncached(raw: &RawValue, limits: &Limits, form: ToolForm) -> Result<Tools> {
    let path = Path::root("tools");
    let mut tools = Tools::default();
    let elements = field::bounded_array(raw, &path, limits.max_tools)?;
    tools.echo_json = String::with_capacity(raw.get().len() + 2 + 48 * elements.len());
    tools.echo_json.push('[');
    for (i, element) in elements.into_iter().enumerate() {
        let tool_path = path.index(i);
        let tool: RawTool = field::object(element, &tool_path)?;
        let type_path = tool_path.key("type");
        let kind = field::string(field::required(tool.kind, &type_path)?, &type_path)?;
        if i > 0 {
            tools.echo_json.push(',');
        }
        if form == ToolForm::Chat {
            parse_chat_tool(&tool, &tool_path, i, kind, limits, &mut tools)?;
            continue;
        }
        echo_tool(&mut tools.echo_json, element, &tool, kind == "function");
        if kind == "namespace" {
            parse_namespace(&tool, &tool_path, i, limits, &mut tools)?;
            continue;
        }
        if kind != "function" {
            // A name is informative only here; a malformed one is not worth a refusal.
            let name = tool.name.and_then(|n| field::string(n, &tool_path).ok());
            tools.skipped.push(SkippedTool { index: i, kind, name });
            continue;
        }
        let function = parse_function(&tool, &tool_path, limits, true)?;
        add_function(&mut tools, function, &tool_path, limits)?;
    }
    tools.echo_json.push(']');
    Ok(tools)
}

/// A Chat Completions tool: a `function` tool's definition is its `function` object
/// (located there in errors), echoed in the Responses form; other types are skipped.
fn parse_chat_tool(
    tool: &RawTool,
    path: &Path,
    index: usize,
    kind: String,
    limits: &Limits,
    tools: &mut Tools,
) -> Result<()> {
    if kind != "function" {
        let name = tool.name.and_then(|n| field::string(n, path).ok());
        tools.echo_json.push_str(r#"{"type":"#);
        tools
            .echo_json
            .push_str(&serde_json::to_string(&kind).unwrap_or_default());
        tools.echo_json.push('}');
        tools.skipped.push(SkippedTool { index, kind, name });
        return Ok(());
    }
    let function_path = path.key("function");
    let raw = field::required(tool.function, &function_path)?;
    let inner: RawTool = field::object(raw, &function_path)?;
    let function = parse_function(&inner, &function_path, limits, false)?;
    let echo = serde_json::json!({
        "type": "function",
        "name": function.name,
        "description": function.description,
        "parameters": function.parameters,
        "strict": function.strict,
    });
    tools.echo_json.push_str(&echo.to_string());
    add_function(tools, function, &function_path, limits)
}

/// Add a function tool, unique by its (qualified) name; namespaces count towards the
/// same bound as the list itself.
fn add_function(tools: &mut Tools, function: Tool, path: &Path, limits: &Limits) -> Result<()> {
    if tools.functions.iter().any(|t| t.name == function.name) {
        let p = path.key("name");
        return Err(invalid_value(
            &p,
            format!(
                "Duplicate function name '{}' in '{p}': function names must be unique.",
                function.name
            ),
        ));
    }
    if tools.functions.len() >= limits.max_tools {
        return Err(Error::new(
            Code::ArrayAboveMaxLength,
            format!(
                "'{path}' is a function tool above the limit of {} in all of 'tools', \
                 namespaces included.",
                limits.max_tools
            ),
        )
        .at(path.to_string()));
    }
    tools.functions.push(function);
    Ok(())
}

/// A `namespace` tool: a name like a function's, an optional description and its
/// `function` (rendered) and `custom` (skipped) tools.
fn parse_namespace(
    tool: &RawTool,
    path: &Path,
    index: usize,
    limits: &Limits,
    tools: &mut Tools,
) -> Result<()> {
    let name_path = path.key("name");
    let name = checked_name(tool.name, &name_path)?;
    let taken = if name == RESERVED_NAMESPACE {
        Some("reserved")
    } else if tools.namespaces.iter().any(|n| n.name == name) {
        Some("already used by another namespace")
    } else {
        None
    };
    if let Some(why) = taken {
        return Err(invalid_value(
            &name_path,
            format!("Invalid '{name_path}': the namespace name '{name}' is {why}."),
        ));
    }
    let description = field::opt_string(tool.description, &path.key("description"), limits.max_text_bytes)?;
    let list_path = path.key("tools");
    let elements = field::bounded_array(
        field::required(tool.tools, &list_path)?,
        &list_path,
        limits.max_tools,
    )?;
    for (j, element) in elements.into_iter().enumerate() {
        let inner_path = list_path.index(j);
        let inner: RawTool = field::object(element, &inner_path)?;
        let type_path = inner_path.key("type");
        let kind = field::string(field::required(inner.kind, &type_path)?, &type_path)?;
        match kind.as_str() {
            "function" => {
                let mut function = parse_function(&inner, &inner_path, limits, true)?;
                function.name = format!("{name}{NAMESPACE_SEPARATOR}{}", function.name);
                add_function(tools, function, &inner_path, limits)?;
            }
            "custom" => {
                let inner_name = inner.name.and_then(|n| field::string(n, &inner_path).ok());
                tools.skipped.push(SkippedTool {
                    index,
                    kind,
                    name: inner_name.map(|n| format!("{name}{NAMESPACE_SEPARATOR}{n}")),
                });
            }
            other => {
                return Err(invalid_value(
                    &type_path,
                    format!(
                        "Invalid '{type_path}': '{other}'. A namespace holds 'function' and \
                         'custom' tools."
                    ),
                ))
            }
        }
    }
    tools.namespaces.push(Namespace { name, description });
    Ok(())
}

/// Append `element` as sent; a function tool gets the members it lacks appended before
/// its closing brace (defaults as parsed: no description, no parameters, strict).
fn echo_tool(out: &mut String, element: &RawValue, tool: &RawTool, function: bool) {
    let text = element.get().trim_end();
    if !function {
        out.push_str(text);
        return;
    }
    out.push_str(&text[..text.len() - 1]);
    for (present, member) in [
        (tool.description.is_some(), r#","description":null"#),
        (tool.parameters.is_some(), r#","parameters":null"#),
        (tool.strict.is_some(), r#","strict":true"#),
    ] {
        if !present {
            out.push_str(member);
        }
    }
    out.push('}');
}

/// A function's or namespace's `name`: required, in the API's charset.
fn checked_name(raw: Option<&RawValue>, name_path: &Path) -> Result<String> {
    let name = field::string(field::required(raw, name_path)?, name_path)?;
    if !valid_function_name(&name) {
        return Err(invalid_value(
            name_path,
            format!(
                "Invalid '{name_path}': '{name}' must be 1 to 64 characters of letters, digits, \
                 underscores and dashes."
            ),
        ));
    }
    Ok(name)
}

/// A function tool's definition; `strict` unless it says (`strict_default`: the API's
/// default, true in the Responses API and false in Chat Completions).
fn parse_function(tool: &RawTool, path: &Path, limits: &Limits, strict_default: bool) -> Result<Tool> {
    let name = checked_name(tool.name, &path.key("name"))?;
    let description = field::opt_string(tool.description, &path.key("description"), limits.max_text_bytes)?;
    let params_path = path.key("parameters");
    let parameters = match tool.parameters {
        // Kept apart from an empty object schema: templates render the two differently
        // (openai-harmony: `() => any` against `(_: {\n}) => any`).
        None => Value::Null,
        Some(raw) => {
            let schema: Value = serde_json::from_str(raw.get())
                .map_err(|e| invalid_value(&params_path, format!("Invalid '{params_path}': {e}.")))?;
            check_schema(&schema, &params_path)?;
            schema
        }
    };
    let strict = field::opt_bool(tool.strict, &path.key("strict"), strict_default)?;
    Ok(Tool {
        name,
        description,
        parameters,
        strict,
    })
}

/// `tool_choice`: `none`/`auto`/`required`, or an object naming a tool (a function's
/// name in its `function` object in the Chat form); a named function must be one of the
/// request's function tools.
pub fn parse_tool_choice(raw: Option<&RawValue>, functions: &[Tool], form: ToolForm) -> Result<ToolChoice> {
    let path = Path::root("tool_choice");
    let Some(raw) = raw else {
        return Ok(ToolChoice::Auto);
    };
    if field::is_string(raw) {
        return match field::string(raw, &path)?.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(invalid_value(
                &path,
                format!(
                    "Invalid value for 'tool_choice': '{other}'. Supported values are 'none', \
                     'auto', 'required' or an object naming a tool."
                ),
            )),
        };
    }
    if !field::is_object(raw) {
        return Err(field::type_error(
            &path,
            "a string or an object",
            field::kind(raw),
        ));
    }
    let choice: RawToolChoice = field::object(raw, &path)?;
    let type_path = path.key("type");
    let kind = field::string(field::required(choice.kind, &type_path)?, &type_path)?;
    if kind != "function" {
        return Ok(ToolChoice::Other(kind));
    }
    let function_path = path.key("function");
    let (raw_name, name_path) = match form {
        ToolForm::Responses => (choice.name, path.key("name")),
        ToolForm::Chat => {
            let function: RawToolChoice =
                field::object(field::required(choice.function, &function_path)?, &function_path)?;
            (function.name, function_path.key("name"))
        }
    };
    let name = field::string(field::required(raw_name, &name_path)?, &name_path)?;
    if !functions.iter().any(|t| t.name == name) {
        return Err(invalid_value(
            &name_path,
            format!("Invalid '{name_path}': no function tool named '{name}' in 'tools'."),
        ));
    }
    Ok(ToolChoice::Function(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).unwrap()
    }

    fn tools(json: &str) -> Result<Tools> {
        parse_tools(Some(raw(json)), &Limits::default(), ToolForm::Responses)
    }

    fn assert_refused(json: &str, code: Code, param: &str) {
        let e = tools(json).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (code, Some(param)),
            "{json}: {}",
            e.message
        );
    }

    #[test]
    fn functions_render_and_other_types_are_skipped() {
        let t = tools(
            r#"[
            {"type":"function","name":"exec_command","description":"run","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]},"strict":false},
            {"type":"custom","name":"apply_patch","format":{"type":"grammar"}},
            {"type":"web_search"},
            {"type":"namespace","name":"mcp","tools":[]},
            {"type":"function","name":"noargs"}
        ]"#,
        )
        .unwrap();
        assert_eq!(t.functions.len(), 2);
        assert_eq!(t.functions[0].name, "exec_command");
        assert!(!t.functions[0].strict);
        assert!(t.functions[1].strict);
        assert_eq!(t.functions[1].parameters, Value::Null);
        let skipped: Vec<_> = t
            .skipped
            .iter()
            .map(|s| (s.index, s.kind.as_str(), s.name.as_deref()))
            .collect();
        assert_eq!(
            skipped,
            vec![(1, "custom", Some("apply_patch")), (2, "web_search", None),]
        );
        assert_eq!(
            t.namespaces,
            vec![Namespace {
                name: "mcp".into(),
                description: None
            }]
        );
    }

    #[test]
    fn namespace_functions_render_under_qualified_names() {
        let t = tools(
            r#"[
            {"type":"function","name":"spawn_agent"},
            {"type":"namespace","name":"multi_agent_v1","description":"Sub-agents.","tools":[
                {"type":"function","name":"spawn_agent","description":"Start one.","parameters":{"type":"object","properties":{"task":{"type":"string"}}},"strict":false},
                {"type":"custom","name":"patch","format":{"type":"grammar"}},
                {"type":"function","name":"wait"}
            ]}
        ]"#,
        )
        .unwrap();
        let names: Vec<_> = t.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["spawn_agent", "multi_agent_v1.spawn_agent", "multi_agent_v1.wait"]
        );
        assert_eq!(t.functions[1].description.as_deref(), Some("Start one."));
        assert!(!t.functions[1].strict && t.functions[2].strict);
        assert_eq!(
            t.namespaces,
            vec![Namespace {
                name: "multi_agent_v1".into(),
                description: Some("Sub-agents.".into())
            }]
        );
        assert_eq!(t.skipped.len(), 1);
        assert_eq!(
            (t.skipped[0].index, t.skipped[0].name.as_deref()),
            (1, Some("multi_agent_v1.patch"))
        );
        // A namespaced function may be the tool choice by its qualified name.
        assert_eq!(
            parse_tool_choice(
                Some(raw(r#"{"type":"function","name":"multi_agent_v1.wait"}"#)),
                &t.functions,
                ToolForm::Responses
            )
            .unwrap(),
            ToolChoice::Function("multi_agent_v1.wait".into())
        );
    }

    #[test]
    fn malformed_namespaces_are_refused_with_their_param() {
        let ns = |inner: &str| format!(r#"[{{"type":"namespace","name":"ns","tools":[{inner}]}}]"#);
        let cases: Vec<(String, Code, &str)> = vec![
            (
                r#"[{"type":"namespace","tools":[]}]"#.into(),
                Code::MissingRequiredParameter,
                "tools[0].name",
            ),
            (
                r#"[{"type":"namespace","name":"a.b","tools":[]}]"#.into(),
                Code::InvalidValue,
                "tools[0].name",
            ),
            (
                r#"[{"type":"namespace","name":"functions","tools":[]}]"#.into(),
                Code::InvalidValue,
                "tools[0].name",
            ),
            (
                r#"[{"type":"namespace","name":"n","tools":[]},{"type":"namespace","name":"n","tools":[]}]"#
                    .into(),
                Code::InvalidValue,
                "tools[1].name",
            ),
            (
                r#"[{"type":"namespace","name":"ns"}]"#.into(),
                Code::MissingRequiredParameter,
                "tools[0].tools",
            ),
            (
                r#"[{"type":"namespace","name":"ns","tools":{}}]"#.into(),
                Code::InvalidType,
                "tools[0].tools",
            ),
            (
                r#"[{"type":"namespace","name":"ns","description":2,"tools":[]}]"#.into(),
                Code::InvalidType,
                "tools[0].description",
            ),
            (ns("3"), Code::InvalidType, "tools[0].tools[0]"),
            (
                ns(r#"{"name":"f"}"#),
                Code::MissingRequiredParameter,
                "tools[0].tools[0].type",
            ),
            (
                ns(r#"{"type":"web_search"}"#),
                Code::InvalidValue,
                "tools[0].tools[0].type",
            ),
            (
                ns(r#"{"type":"function","name":"a.b"}"#),
                Code::InvalidValue,
                "tools[0].tools[0].name",
            ),
            (
                ns(r#"{"type":"function","name":"f"},{"type":"function","name":"f"}"#),
                Code::InvalidValue,
                "tools[0].tools[1].name",
            ),
            (
                ns(r#"{"type":"function","name":"f","parameters":{"type":"objekt"}}"#),
                Code::InvalidToolSchema,
                "tools[0].tools[0].parameters.type",
            ),
        ];
        for (json, code, param) in &cases {
            assert_refused(json, *code, param);
        }
        // Functions count towards one bound, namespaces included.
        let two = Limits {
            max_tools: 2,
            ..Limits::default()
        };
        let json = ns(r#"{"type":"function","name":"f"},{"type":"function","name":"g"}"#);
        assert!(parse_tools(Some(raw(&json)), &two, ToolForm::Responses).is_ok());
        let json = format!(
            r#"[{{"type":"function","name":"h"}},{}"#,
            &ns(r#"{"type":"function","name":"f"},{"type":"function","name":"g"}"#)[1..]
        );
        let e = parse_tools(Some(raw(&json)), &two, ToolForm::Responses).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::ArrayAboveMaxLength, Some("tools[1].tools[1]"))
        );
    }

    #[test]
    fn tool_errors() {
        let cases: &[(&str, Code, &str)] = &[
            (r#"{}"#, Code::InvalidType, "tools"),
            (
                r#"[{"name":"f"}]"#,
                Code::MissingRequiredParameter,
                "tools[0].type",
            ),
            (
                r#"[{"type":"function"}]"#,
                Code::MissingRequiredParameter,
                "tools[0].name",
            ),
            (
                r#"[{"type":"function","name":"a b"}]"#,
                Code::InvalidValue,
                "tools[0].name",
            ),
            (
                r#"[{"type":"function","name":"f"},{"type":"function","name":"f"}]"#,
                Code::InvalidValue,
                "tools[1].name",
            ),
            (
                r#"[{"type":"function","name":"f","parameters":{"type":"objekt"}}]"#,
                Code::InvalidToolSchema,
                "tools[0].parameters.type",
            ),
            (
                r#"[{"type":"function","name":"f","parameters":"{}"}]"#,
                Code::InvalidToolSchema,
                "tools[0].parameters",
            ),
            (
                r#"[{"type":"function","name":"f","strict":"yes"}]"#,
                Code::InvalidType,
                "tools[0].strict",
            ),
            (
                r#"[{"type":"function","name":"f","description":1}]"#,
                Code::InvalidType,
                "tools[0].description",
            ),
        ];
        for (json, code, param) in cases {
            assert_refused(json, *code, param);
        }
        let many = format!("[{}]", vec![r#"{"type":"web_search"}"#; 513].join(","));
        assert_eq!(tools(&many).unwrap_err().code, Code::ArrayAboveMaxLength);
        let small = Limits {
            max_tools_bytes: 40,
            ..Limits::default()
        };
        let e = parse_tools(
            Some(raw(r#"[{"type":"web_search"},{"type":"web_search"}]"#)),
            &small,
            ToolForm::Responses,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::ArrayAboveMaxBytes, Some("tools"))
        );
        // Refused before it is parsed: not even its syntax as a tool list is looked at.
        assert_eq!(
            parse_tools(
                Some(raw(&format!("[{}]", "1,".repeat(30) + "1"))),
                &small,
                ToolForm::Responses
            )
            .unwrap_err()
            .code,
            Code::ArrayAboveMaxBytes
        );
    }

    #[test]
    fn repeated_lists_come_from_the_cache_with_the_same_result() {
        let json = r#"[{"type":"function","name":"cached_tool","parameters":{"type":"object"}},{"type":"web_search"}]"#;
        let first = tools(json).unwrap();
        let again = tools(json).unwrap();
        assert_eq!(first, again);
        assert!(TOOL_CACHE
            .get(json, &Limits::default(), ToolForm::Responses)
            .is_some());
        // Checked with other limits, the same bytes are parsed again.
        let one = Limits {
            max_tools: 1,
            ..Limits::default()
        };
        assert_eq!(
            parse_tools(Some(raw(json)), &one, ToolForm::Responses)
                .unwrap_err()
                .code,
            Code::ArrayAboveMaxLength
        );
        // Failures are not remembered.
        let bad = r#"[{"type":"function","name":"cached bad"}]"#;
        assert!(tools(bad).is_err());
        assert!(TOOL_CACHE
            .get(bad, &Limits::default(), ToolForm::Responses)
            .is_none());
    }

    #[test]
    fn tool_choice() {
        let fns = tools(r#"[{"type":"function","name":"f"}]"#).unwrap().functions;
        let choice = |s: &str| parse_tool_choice(Some(raw(s)), &fns, ToolForm::Responses);
        assert_eq!(
            parse_tool_choice(None, &fns, ToolForm::Responses).unwrap(),
            ToolChoice::Auto
        );
        assert_eq!(choice(r#""none""#).unwrap(), ToolChoice::None);
        assert_eq!(choice(r#""required""#).unwrap(), ToolChoice::Required);
        assert_eq!(
            choice(r#"{"type":"function","name":"f"}"#).unwrap(),
            ToolChoice::Function("f".into())
        );
        assert_eq!(
            choice(r#"{"type":"allowed_tools","mode":"auto","tools":[]}"#).unwrap(),
            ToolChoice::Other("allowed_tools".into())
        );
        let e = choice(r#"{"type":"function","name":"g"}"#).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::InvalidValue, Some("tool_choice.name"))
        );
        assert_eq!(choice(r#""sometimes""#).unwrap_err().code, Code::InvalidValue);
        assert_eq!(choice("3").unwrap_err().code, Code::InvalidType);
    }
}
