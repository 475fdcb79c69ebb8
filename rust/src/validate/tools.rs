//! Tool definitions and `tool_choice`.
//!
//! `function` tools become [`Tool`]s for the chat format, with their `parameters` checked
//! as a JSON Schema. Every other tool type (Codex sends `custom`, `namespace`,
//! `tool_search`, `web_search`, ...) is accepted and left out of rendering: the server
//! cannot run it, and refusing the request would break the client. They are reported
//! in [`Tools::skipped`] so the server can log them.

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
use crate::item::Tool;

/// The tools of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tools {
    /// `function` tools, in request order: what the chat format renders.
    pub functions: Vec<Tool>,
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
    /// Its `name`, for the types that have one (`custom`, `namespace`, ...).
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
}

#[derive(Deserialize)]
struct RawToolChoice<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
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
pub fn parse_tools(raw: Option<&RawValue>, limits: &Limits) -> Result<Tools> {
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
    if let Some(tools) = TOOL_CACHE.get(raw.get(), limits) {
        return Ok(tools);
    }
    let tools = parse_uncached(raw, limits)?;
    TOOL_CACHE.insert(raw.get(), limits, &tools);
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
    fn get(&self, raw: &str, limits: &Limits) -> Option<Tools> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let at = entries
            .iter()
            .position(|e| e.raw.len() == raw.len() && e.limits == *limits && *e.raw == *raw)?;
        let entry = entries.remove(at)?;
        entries.push_front(Arc::clone(&entry));
        // Clone outside the lock: other threads may parse meanwhile.
        drop(entries);
        Some(entry.tools.clone())
    }

    fn insert(&self, raw: &str, limits: &Limits, tools: &Tools) {
        if raw.len() > TOOL_CACHE_MAX_BYTES || tools.functions.is_empty() {
            return;
        }
        let entry = Arc::new(CachedTools {
            raw: raw.into(),
            limits: *limits,
            tools: tools.clone(),
        });
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.push_front(entry);
        entries.truncate(TOOL_CACHE_ENTRIES);
    }
}

fn parse_uncached(raw: &RawValue, limits: &Limits) -> Result<Tools> {
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
        echo_tool(&mut tools.echo_json, element, &tool, kind == "function");
        if kind != "function" {
            // A name is informative only here; a malformed one is not worth a refusal.
            let name = tool.name.and_then(|n| field::string(n, &tool_path).ok());
            tools.skipped.push(SkippedTool { index: i, kind, name });
            continue;
        }
        let function = parse_function(&tool, &tool_path, limits)?;
        if tools.functions.iter().any(|t| t.name == function.name) {
            let p = tool_path.key("name");
            return Err(invalid_value(
                &p,
                format!(
                    "Duplicate function name '{}' in '{p}': function names must be unique.",
                    function.name
                ),
            ));
        }
        tools.functions.push(function);
    }
    tools.echo_json.push(']');
    Ok(tools)
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

fn parse_function(tool: &RawTool, path: &Path, limits: &Limits) -> Result<Tool> {
    let name_path = path.key("name");
    let name = field::string(field::required(tool.name, &name_path)?, &name_path)?;
    if !valid_function_name(&name) {
        return Err(invalid_value(
            &name_path,
            format!(
                "Invalid '{name_path}': '{name}' must be 1 to 64 characters of letters, digits, \
                 underscores and dashes."
            ),
        ));
    }
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
    let strict = field::opt_bool(tool.strict, &path.key("strict"), true)?;
    Ok(Tool {
        name,
        description,
        parameters,
        strict,
    })
}

/// `tool_choice`: `none`/`auto`/`required`, or an object naming a tool; a named
/// function must be one of the request's function tools.
pub fn parse_tool_choice(raw: Option<&RawValue>, functions: &[Tool]) -> Result<ToolChoice> {
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
    let name_path = path.key("name");
    let name = field::string(field::required(choice.name, &name_path)?, &name_path)?;
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
        parse_tools(Some(raw(json)), &Limits::default())
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
            vec![
                (1, "custom", Some("apply_patch")),
                (2, "web_search", None),
                (3, "namespace", Some("mcp"))
            ]
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
            let e = tools(json).unwrap_err();
            assert_eq!(
                (e.code, e.param.as_deref()),
                (*code, Some(*param)),
                "{json}: {}",
                e.message
            );
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
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::ArrayAboveMaxBytes, Some("tools"))
        );
        // Refused before it is parsed: not even its syntax as a tool list is looked at.
        assert_eq!(
            parse_tools(Some(raw(&format!("[{}]", "1,".repeat(30) + "1"))), &small)
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
        assert!(TOOL_CACHE.get(json, &Limits::default()).is_some());
        // Checked with other limits, the same bytes are parsed again.
        let one = Limits {
            max_tools: 1,
            ..Limits::default()
        };
        assert_eq!(
            parse_tools(Some(raw(json)), &one).unwrap_err().code,
            Code::ArrayAboveMaxLength
        );
        // Failures are not remembered.
        let bad = r#"[{"type":"function","name":"cached bad"}]"#;
        assert!(tools(bad).is_err());
        assert!(TOOL_CACHE.get(bad, &Limits::default()).is_none());
    }

    #[test]
    fn tool_choice() {
        let fns = tools(r#"[{"type":"function","name":"f"}]"#).unwrap().functions;
        let choice = |s: &str| parse_tool_choice(Some(raw(s)), &fns);
        assert_eq!(parse_tool_choice(None, &fns).unwrap(), ToolChoice::Auto);
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
