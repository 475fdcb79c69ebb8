//! The `input` of a request: a string (one user message) or a list of items
//! (protocol.md section 4), parsed into [`Item`]s with one item per input element, so
//! `items[i]` is `input[i]` in every error and policy location.
//!
//! This module checks shape only (types, roles, parts, required fields, sizes). Whether a
//! `function_call_output` answers an open call depends on the chain: see `calls`.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::field::{self, invalid_value};
use super::path::Path;
use super::Limits;
use crate::error::{Code, Error, Result};
use crate::item::{Item, Role};

/// The parsed input of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Input {
    pub items: Vec<Item>,
    /// Where each item's text came from, parallel to `items`.
    pub sources: Vec<TextSource>,
    /// The input was a plain string (its one message is located at `input`).
    pub from_string: bool,
}

/// Where an item's text came from: the field and, when it was a list of parts, where
/// each part ends in the joined text. Lets a policy hit name the offending part.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSource {
    field: &'static str,
    /// End offset of each part in the joined text; empty when the field was a plain string.
    part_ends: Vec<usize>,
}

impl TextSource {
    fn plain(field: &'static str) -> Self {
        TextSource {
            field,
            part_ends: Vec::new(),
        }
    }

    /// The param of the text at byte `offset` of item `index`'s text.
    pub fn param(&self, input: &Input, index: usize, offset: usize) -> String {
        if input.from_string {
            return "input".to_string();
        }
        let field = self.field;
        if self.part_ends.is_empty() {
            return format!("input[{index}].{field}");
        }
        let part = self
            .part_ends
            .iter()
            .position(|&end| offset < end)
            .unwrap_or(self.part_ends.len() - 1);
        format!("input[{index}].{field}[{part}].text")
    }
}

/// The fields of an input item that validation reads; everything else is skipped.
#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    call_id: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(borrow)]
    summary: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawPart<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
}

const ITEM_TYPES: &str = "'message', 'function_call', 'function_call_output', 'reasoning'";

/// Parse the raw `input` field (absent = no items).
pub fn parse_input(raw: Option<&RawValue>, limits: &Limits) -> Result<Input> {
    let path = Path::root("input");
    let Some(raw) = raw else {
        return Ok(Input::default());
    };
    if field::is_string(raw) {
        let text = field::bounded_string(raw, &path, limits.max_text_bytes)?;
        return Ok(Input {
            items: vec![Item::Message {
                role: Role::User,
                text,
            }],
            sources: vec![TextSource::plain("content")],
            from_string: true,
        });
    }
    if !raw.get().trim_start().starts_with('[') {
        return Err(field::type_error(&path, "a string or an array of items", raw));
    }
    let elements = field::bounded_array(raw, &path, limits.max_items)?;
    let mut input = Input {
        items: Vec::with_capacity(elements.len()),
        sources: Vec::with_capacity(elements.len()),
        from_string: false,
    };
    for (i, element) in elements.into_iter().enumerate() {
        let (item, source) = parse_item(element, &path.index(i), limits)?;
        input.items.push(item);
        input.sources.push(source);
    }
    Ok(input)
}

/// The JSON array of input items: the raw slice as sent, or the one message a string
/// input stands for.
pub fn input_json(raw: Option<&RawValue>) -> String {
    match raw {
        None => "[]".to_string(),
        Some(raw) if field::is_string(raw) => {
            format!(r#"[{{"type":"message","role":"user","content":{}}}]"#, raw.get())
        }
        Some(raw) => raw.get().to_string(),
    }
}

fn parse_item(raw: &RawValue, path: &Path, limits: &Limits) -> Result<(Item, TextSource)> {
    let item: RawItem = field::object(raw, path)?;
    let type_path = path.key("type");
    let kind = match item.kind {
        Some(k) => field::string(k, &type_path)?,
        None if item.role.is_some() => "message".to_string(),
        None => return Err(field::missing(&type_path)),
    };
    let max = limits.max_text_bytes;
    match kind.as_str() {
        "message" => parse_message(&item, path, max),
        "function_call" => {
            let call_id = call_id(&item, path, max)?;
            let name_path = path.key("name");
            let name = field::bounded_string(field::required(item.name, &name_path)?, &name_path, max)?;
            if name.is_empty() {
                return Err(invalid_value(
                    &name_path,
                    format!("'{name_path}' must not be empty."),
                ));
            }
            let args_path = path.key("arguments");
            let arguments =
                field::bounded_string(field::required(item.arguments, &args_path)?, &args_path, max)?;
            Ok((
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                },
                TextSource::plain("arguments"),
            ))
        }
        "function_call_output" => {
            let call_id = call_id(&item, path, max)?;
            let out_path = path.key("output");
            let out = field::required(item.output, &out_path)?;
            let (output, source) = if field::is_string(out) {
                (
                    field::bounded_string(out, &out_path, max)?,
                    TextSource::plain("output"),
                )
            } else {
                text_parts(out, &out_path, "output", &["input_text"], "", max)?
            };
            Ok((Item::FunctionCallOutput { call_id, output }, source))
        }
        "reasoning" => parse_reasoning(&item, path, max),
        other => Err(Error::new(
            Code::UnsupportedContent,
            format!("Input item type '{other}' is not supported here; supported types are {ITEM_TYPES}."),
        )
        .at(type_path.to_string())),
    }
}

fn call_id(item: &RawItem, path: &Path, max: usize) -> Result<String> {
    let p = path.key("call_id");
    let id = field::bounded_string(field::required(item.call_id, &p)?, &p, max)?;
    if id.is_empty() {
        return Err(invalid_value(&p, format!("'{p}' must not be empty.")));
    }
    Ok(id)
}

fn parse_message(item: &RawItem, path: &Path, max: usize) -> Result<(Item, TextSource)> {
    let role_path = path.key("role");
    let role = field::string(field::required(item.role, &role_path)?, &role_path)?;
    let role = match role.as_str() {
        "user" => Role::User,
        "system" => Role::System,
        "developer" => Role::Developer,
        "assistant" => Role::Assistant,
        other => {
            return Err(invalid_value(
                &role_path,
                format!(
                    "Invalid value for '{role_path}': '{other}'. Supported values are 'user', \
                     'system', 'developer' and 'assistant'."
                ),
            ))
        }
    };
    let content_path = path.key("content");
    let content = field::required(item.content, &content_path)?;
    let (text, source) = if field::is_string(content) {
        (
            field::bounded_string(content, &content_path, max)?,
            TextSource::plain("content"),
        )
    } else {
        // The text part type a role may carry, as the API defines it.
        let allowed: &[&str] = match role {
            Role::Assistant => &["output_text"],
            _ => &["input_text"],
        };
        text_parts(content, &content_path, "content", allowed, "", max)?
    };
    Ok((Item::Message { role, text }, source))
}

fn parse_reasoning(item: &RawItem, path: &Path, max: usize) -> Result<(Item, TextSource)> {
    // The raw reasoning text when the client replays it; otherwise the summaries, which
    // are separate paragraphs.
    if let Some(content) = item.content {
        let p = path.key("content");
        let (text, source) = text_parts(content, &p, "content", &["reasoning_text"], "", max)?;
        if !text.is_empty() {
            return Ok((Item::Reasoning { text }, source));
        }
    }
    match item.summary {
        Some(summary) => {
            let p = path.key("summary");
            let (text, source) = text_parts(summary, &p, "summary", &["summary_text"], "\n\n", max)?;
            Ok((Item::Reasoning { text }, source))
        }
        None => Ok((
            Item::Reasoning { text: String::new() },
            TextSource::plain("summary"),
        )),
    }
}

/// A list of text parts joined into one text (`separator` between parts).
fn text_parts(
    raw: &RawValue,
    path: &Path,
    field_name: &'static str,
    allowed: &[&str],
    separator: &str,
    max: usize,
) -> Result<(String, TextSource)> {
    let parts = field::array(raw, path)
        .map_err(|_| field::type_error(path, "a string or an array of content parts", raw))?;
    let mut text = String::new();
    let mut part_ends = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let part_path = path.index(j);
        let part: RawPart = field::object(part, &part_path)?;
        let type_path = part_path.key("type");
        let kind = field::string(field::required(part.kind, &type_path)?, &type_path)?;
        if !allowed.contains(&kind.as_str()) {
            return Err(part_type_error(&type_path, &kind, allowed));
        }
        let text_path = part_path.key("text");
        let piece = field::bounded_string(field::required(part.text, &text_path)?, &text_path, max)?;
        if j > 0 {
            text.push_str(separator);
        }
        text.push_str(&piece);
        if text.len() > max {
            return Err(Error::new(
                Code::StringAboveMaxLength,
                format!(
                    "The parts of '{path}' add up to {} bytes, above the limit of {max} bytes.",
                    text.len()
                ),
            )
            .at(path.to_string()));
        }
        part_ends.push(text.len());
    }
    Ok((
        text,
        TextSource {
            field: field_name,
            part_ends,
        },
    ))
}

/// Text part types of the API that belong to another role are invalid values; any other
/// part type (images, files, audio, ...) is content this server cannot render.
fn part_type_error(path: &Path, kind: &str, allowed: &[&str]) -> Error {
    let supported = allowed
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(", ");
    const TEXT_PARTS: [&str; 5] = [
        "input_text",
        "output_text",
        "summary_text",
        "reasoning_text",
        "refusal",
    ];
    if TEXT_PARTS.contains(&kind) {
        invalid_value(
            path,
            format!("Invalid value for '{path}': '{kind}'. Supported values here are {supported}."),
        )
    } else {
        Error::new(
            Code::UnsupportedContent,
            format!(
                "Content part type '{kind}' is not supported: this server renders text only \
                 ({supported} here)."
            ),
        )
        .at(path.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Input> {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        parse_input(Some(raw), &Limits::default())
    }

    fn err(json: &str) -> Error {
        parse(json).unwrap_err()
    }

    #[test]
    fn string_input_is_one_user_message() {
        let input = parse(r#""hello""#).unwrap();
        assert_eq!(
            input.items,
            vec![Item::Message {
                role: Role::User,
                text: "hello".into()
            }]
        );
        assert!(input.from_string);
        let raw: &RawValue = serde_json::from_str(r#""hi""#).unwrap();
        assert_eq!(
            input_json(Some(raw)),
            r#"[{"type":"message","role":"user","content":"hi"}]"#
        );
    }

    #[test]
    fn every_item_type() {
        let input = parse(
            r#"[
            {"role":"developer","content":"be brief"},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
            {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"s1"},{"type":"summary_text","text":"s2"}],"encrypted_content":"xyz"},
            {"type":"function_call","call_id":"call_1","name":"ls","arguments":"{}","status":"completed"},
            {"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"x"}]},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]}
        ]"#,
        )
        .unwrap();
        assert_eq!(
            input.items,
            vec![
                Item::Message {
                    role: Role::Developer,
                    text: "be brief".into()
                },
                Item::Message {
                    role: Role::User,
                    text: "ab".into()
                },
                Item::Reasoning {
                    text: "s1\n\ns2".into()
                },
                Item::FunctionCall {
                    call_id: "call_1".into(),
                    name: "ls".into(),
                    arguments: "{}".into()
                },
                Item::FunctionCallOutput {
                    call_id: "call_1".into(),
                    output: "x".into()
                },
                Item::Message {
                    role: Role::Assistant,
                    text: "done".into()
                },
            ]
        );
        assert_eq!(input.sources[1].param(&input, 1, 1), "input[1].content[1].text");
        assert_eq!(input.sources[0].param(&input, 0, 0), "input[0].content");
    }

    #[test]
    fn reasoning_prefers_raw_content() {
        let input = parse(
            r#"[{"type":"reasoning","summary":[{"type":"summary_text","text":"short"}],
                 "content":[{"type":"reasoning_text","text":"long"}]}]"#,
        )
        .unwrap();
        assert_eq!(input.items[0], Item::Reasoning { text: "long".into() });
        let input = parse(r#"[{"type":"reasoning","encrypted_content":"..."}]"#).unwrap();
        assert_eq!(input.items[0], Item::Reasoning { text: String::new() });
    }

    #[test]
    fn errors_carry_codes_and_paths() {
        let cases: &[(&str, Code, &str)] = &[
            (
                r#"[{"content":"x"}]"#,
                Code::MissingRequiredParameter,
                "input[0].type",
            ),
            (
                r#"[{"type":"message","content":"x"}]"#,
                Code::MissingRequiredParameter,
                "input[0].role",
            ),
            (
                r#"[{"role":"robot","content":"x"}]"#,
                Code::InvalidValue,
                "input[0].role",
            ),
            (
                r#"[{"role":"user"}]"#,
                Code::MissingRequiredParameter,
                "input[0].content",
            ),
            (
                r#"[{"role":"user","content":5}]"#,
                Code::InvalidType,
                "input[0].content",
            ),
            (
                r#"[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]"#,
                Code::UnsupportedContent,
                "input[0].content[0].type",
            ),
            (
                r#"[{"role":"user","content":[{"type":"output_text","text":"x"}]}]"#,
                Code::InvalidValue,
                "input[0].content[0].type",
            ),
            (
                r#"[{"role":"assistant","content":[{"type":"input_text","text":"x"}]}]"#,
                Code::InvalidValue,
                "input[0].content[0].type",
            ),
            (
                r#"["x", {"role":"user","content":[{"type":"input_text"}]}]"#,
                Code::InvalidType,
                "input[0]",
            ),
            (
                r#"[{"role":"user","content":[{"type":"input_text"}]}]"#,
                Code::MissingRequiredParameter,
                "input[0].content[0].text",
            ),
            (
                r#"[{"type":"function_call","name":"f","arguments":"{}"}]"#,
                Code::MissingRequiredParameter,
                "input[0].call_id",
            ),
            (
                r#"[{"type":"function_call","call_id":"c","arguments":"{}"}]"#,
                Code::MissingRequiredParameter,
                "input[0].name",
            ),
            (
                r#"[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]"#,
                Code::InvalidType,
                "input[0].arguments",
            ),
            (
                r#"[{"type":"function_call_output","call_id":"","output":"x"}]"#,
                Code::InvalidValue,
                "input[0].call_id",
            ),
            (
                r#"[{"type":"function_call_output","call_id":"c"}]"#,
                Code::MissingRequiredParameter,
                "input[0].output",
            ),
            (
                r#"[{"type":"function_call_output","call_id":"c","output":[{"type":"input_file","file_id":"f"}]}]"#,
                Code::UnsupportedContent,
                "input[0].output[0].type",
            ),
            (
                r#"[{"type":"computer_call"}]"#,
                Code::UnsupportedContent,
                "input[0].type",
            ),
            (r#"{"role":"user"}"#, Code::InvalidType, "input"),
        ];
        for (json, code, param) in cases {
            let e = err(json);
            assert_eq!(
                (e.code, e.param.as_deref()),
                (*code, Some(*param)),
                "{json}: {}",
                e.message
            );
        }
    }

    #[test]
    fn limits() {
        let tight = Limits {
            max_items: 2,
            max_text_bytes: 4,
            max_tools: 1,
        };
        let raw: &RawValue = serde_json::from_str(r#"["a","b","c"]"#).unwrap();
        assert_eq!(
            parse_input(Some(raw), &tight).unwrap_err().code,
            Code::ArrayAboveMaxLength
        );
        let raw: &RawValue = serde_json::from_str(r#"[{"role":"user","content":"12345"}]"#).unwrap();
        let e = parse_input(Some(raw), &tight).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::StringAboveMaxLength, Some("input[0].content"))
        );
        let raw: &RawValue = serde_json::from_str(
            r#"[{"role":"user","content":[{"type":"input_text","text":"123"},{"type":"input_text","text":"45"}]}]"#,
        )
        .unwrap();
        let e = parse_input(Some(raw), &tight).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::StringAboveMaxLength, Some("input[0].content"))
        );
    }
}
