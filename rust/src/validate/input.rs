//! The `input` of a request: a string (one user message) or a list of items
//! (protocol.md section 4), parsed into [`Item`]s with one item per input element, so
//! `items[i]` is `input[i]` in every error and policy location.
//!
//! This module checks shape only (types, roles, parts, required fields, sizes). Whether a
//! `function_call_output` answers an open call depends on the chain: see `calls`.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::field::{self, invalid_value};
use super::path::Path;
use super::shape::{self, Shape};
use super::Limits;
use crate::error::{Code, Error, Result};
use crate::item::{Item, Role, NAMESPACE_SEPARATOR};

/// The parsed input of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Input {
    pub items: Vec<Item>,
    /// Where each item's text came from, parallel to `items`.
    pub sources: Vec<TextSource>,
    /// The input was a plain string (its one message is located at `input`).
    pub from_string: bool,
    /// The input ended with `{"type": "compaction_trigger"}` (Codex's remote compaction):
    /// the response is the conversation compacted into one `compaction` item.
    pub compaction_trigger: bool,
    /// The place of `items[0]` in the request's `input`: not 0 in a request's `tail`.
    pub offset: usize,
}

impl Input {
    /// Bytes of text in the items from `first` on: what rendering them costs grows with.
    /// `first` counts from the request's first item (`offset` of them are not here).
    pub fn text_bytes(&self, first: usize) -> usize {
        let items = self.items.get(first.saturating_sub(self.offset)..).unwrap_or(&[]);
        items
            .iter()
            .map(|item| match item {
                Item::Message { text, .. } | Item::Reasoning { text } => text.len(),
                Item::FunctionCall { name, arguments, .. } => name.len() + arguments.len(),
                Item::FunctionCallOutput { output, .. } => output.len(),
            })
            .sum()
    }

    /// The items from the request's item `first` on, located where they were.
    pub fn tail(&self, first: usize) -> Input {
        let first = first.saturating_sub(self.offset).min(self.items.len());
        Input {
            items: self.items[first..].to_vec(),
            sources: self.sources[first..].to_vec(),
            from_string: self.from_string,
            compaction_trigger: self.compaction_trigger,
            offset: self.offset + first,
        }
    }
}

/// Where an item's text came from: the field and, when it was a list of parts, where
/// each part ends in the joined text. Lets a policy hit name the offending part.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSource {
    field: &'static str,
    /// End offset of each part in the joined text; empty when the field was a plain string.
    part_ends: Vec<usize>,
    /// The field's whole path, for an item that is not one element of `input` (a Chat
    /// Completions message becomes several items: `messages[3].tool_calls[0].function.arguments`).
    located: Option<String>,
}

impl TextSource {
    pub(super) fn plain(field: &'static str) -> Self {
        TextSource {
            field,
            part_ends: Vec::new(),
            located: None,
        }
    }

    /// The same source, located at `path` in the request whatever the item's index.
    pub(super) fn at(self, path: &Path) -> Self {
        TextSource {
            located: Some(path.to_string()),
            ..self
        }
    }

    /// The param of the text at byte `offset` of item `index`'s text.
    pub fn param(&self, input: &Input, index: usize, offset: usize) -> String {
        if input.from_string {
            return "input".to_string();
        }
        let field = self.field;
        let index = input.offset + index;
        let path = self
            .located
            .clone()
            .unwrap_or_else(|| format!("input[{index}].{field}"));
        if self.part_ends.is_empty() {
            return path;
        }
        let part = self
            .part_ends
            .iter()
            .position(|&end| offset < end)
            .unwrap_or(self.part_ends.len() - 1);
        format!("{path}[{part}].text")
    }
}

/// The fields of an input item that validation reads, decoded in the one pass over the
/// input; every other field is skipped.
#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    role: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    content: Option<Shape<'a, RawPart<'a>>>,
    #[serde(borrow)]
    call_id: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    name: Option<Shape<'a, IgnoredAny>>,
    /// A `function_call`'s namespace, for a function of a `namespace` tool.
    #[serde(borrow)]
    namespace: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    arguments: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    output: Option<Shape<'a, RawPart<'a>>>,
    #[serde(borrow)]
    summary: Option<Shape<'a, RawPart<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct RawPart<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Shape<'a, IgnoredAny>>,
    #[serde(borrow)]
    text: Option<Shape<'a, IgnoredAny>>,
}

/// Type and role names are checked against their few valid values, not sized.
pub(super) const NO_LIMIT: usize = usize::MAX;

const ITEM_TYPES: &str =
    "'message', 'function_call', 'function_call_output', 'reasoning', 'compaction_trigger' (last)";

/// Parse the raw `input` field (absent = no items).
pub fn parse_input(raw: Option<&RawValue>, limits: &Limits) -> Result<Input> {
    let path = Path::root("input");
    let Some(raw) = raw else {
        return Ok(Input::default());
    };
    let elements = match shape::read::<RawItem>(raw.get(), &path)? {
        Shape::Str(text) => {
            let text = Shape::<IgnoredAny>::Str(text).text(&path, limits.max_text_bytes)?;
            return Ok(Input {
                items: vec![Item::Message {
                    role: Role::User,
                    text: text.into_owned(),
                }],
                sources: vec![TextSource::plain("content")],
                from_string: true,
                compaction_trigger: false,
                offset: 0,
            });
        }
        Shape::Array(elements) => elements,
        other => {
            return Err(field::type_error(
                &path,
                "a string or an array of items",
                other.kind(),
            ))
        }
    };
    let count = count_checked(elements.len(), limits)?;
    items_of(elements.into_iter().map(Ok), 0, count, limits)
}

/// The items of an `input` array's elements from element `first` on, each read from its
/// own bytes (`elements` is the whole array): where the elements before it are the key's
/// seen ones (`history::SeenItems`). Errors name each item's place in the whole array;
/// an element that does not read as a JSON value of an item is refused with the path of
/// the element (the caller parses the whole input again for the error of a full parse).
pub(super) fn parse_elements(elements: &[&str], first: usize, limits: &Limits) -> Result<Input> {
    let count = count_checked(elements.len(), limits)?;
    let path = Path::root("input");
    let rest = elements.get(first..).unwrap_or(&[]).iter().enumerate();
    let read = rest.map(|(i, element)| shape::read::<RawItem>(element, &path.index(first + i)));
    items_of(read, first, count, limits)
}

fn count_checked(count: usize, limits: &Limits) -> Result<usize> {
    if count > limits.max_items {
        return Err(field::array_above_max_length(
            &Path::root("input"),
            count,
            limits.max_items,
        ));
    }
    Ok(count)
}

/// The items of `elements`, the array's from element `first` on (it has `count`).
fn items_of<'a>(
    elements: impl Iterator<Item = Result<Shape<'a, RawItem<'a>>>>,
    first: usize,
    count: usize,
    limits: &Limits,
) -> Result<Input> {
    let path = Path::root("input");
    let mut input = Input {
        items: Vec::with_capacity(count - first.min(count)),
        sources: Vec::with_capacity(count - first.min(count)),
        from_string: false,
        compaction_trigger: false,
        offset: first,
    };
    for (i, element) in elements.enumerate() {
        let i = first + i;
        let item_path = path.index(i);
        match parse_item(element?.object(&item_path)?, &item_path, limits)? {
            Some((item, source)) => {
                input.items.push(item);
                input.sources.push(source);
            }
            None if i + 1 == count => input.compaction_trigger = true,
            None => {
                return Err(invalid_value(
                    &item_path,
                    format!("'{item_path}': a compaction_trigger item must be the last input item."),
                ))
            }
        }
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

/// A required string field of at most `max` bytes.
pub(super) fn required_text(shape: Option<Shape<IgnoredAny>>, path: &Path, max: usize) -> Result<String> {
    let shape = shape.ok_or_else(|| field::missing(path))?;
    Ok(shape.text(path, max)?.into_owned())
}

/// A required string field that must not be empty (ids, names).
pub(super) fn required_name(shape: Option<Shape<IgnoredAny>>, path: &Path, max: usize) -> Result<String> {
    let name = required_text(shape, path, max)?;
    if name.is_empty() {
        return Err(invalid_value(path, format!("'{path}' must not be empty.")));
    }
    Ok(name)
}

/// A `function_call`'s name as the chat format knows it: qualified (`NAMESPACE.NAME`)
/// when the call names a namespace (null is none, as the SDK's models dump it).
fn call_name(
    name: Option<Shape<IgnoredAny>>,
    namespace: Option<Shape<IgnoredAny>>,
    path: &Path,
    max: usize,
) -> Result<String> {
    let name = required_name(name, &path.key("name"), max)?;
    let namespace = match namespace {
        None | Some(Shape::Other("null")) => return Ok(name),
        Some(shape) => shape,
    };
    let ns_path = path.key("namespace");
    let namespace = required_name(Some(namespace), &ns_path, max)?;
    if namespace.contains(NAMESPACE_SEPARATOR) {
        return Err(invalid_value(
            &ns_path,
            format!("Invalid '{ns_path}': '{namespace}' must not contain '{NAMESPACE_SEPARATOR}'."),
        ));
    }
    Ok(format!("{namespace}{NAMESPACE_SEPARATOR}{name}"))
}

/// An input item, or None for a `compaction_trigger` (no item: a request to compact).
fn parse_item(mut item: RawItem, path: &Path, limits: &Limits) -> Result<Option<(Item, TextSource)>> {
    let type_path = path.key("type");
    let kind = match item.kind.take() {
        Some(k) => k.text(&type_path, NO_LIMIT)?,
        None if item.role.is_some() => Cow::Borrowed("message"),
        None => return Err(field::missing(&type_path)),
    };
    let max = limits.max_text_bytes;
    let parsed = match kind.as_ref() {
        "compaction_trigger" => return Ok(None),
        "message" => parse_message(item, path, max, limits.images),
        "function_call" => {
            let call_id = required_name(item.call_id, &path.key("call_id"), max)?;
            let name = call_name(item.name, item.namespace, path, max)?;
            let arguments = required_text(item.arguments, &path.key("arguments"), max)?;
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
            let call_id = required_name(item.call_id, &path.key("call_id"), max)?;
            let out_path = path.key("output");
            let out = item.output.ok_or_else(|| field::missing(&out_path))?;
            let (output, source) = text_or_parts(out, &out_path, "output", &["input_text"], "", max)?;
            Ok((Item::FunctionCallOutput { call_id, output }, source))
        }
        "reasoning" => parse_reasoning(item, path, max),
        other => Err(Error::new(
            Code::UnsupportedContent,
            format!("Input item type '{other}' is not supported here; supported types are {ITEM_TYPES}."),
        )
        .at(type_path.to_string())),
    };
    parsed.map(Some)
}

fn parse_message(item: RawItem, path: &Path, max: usize, images: bool) -> Result<(Item, TextSource)> {
    let role_path = path.key("role");
    let role = required_text(item.role, &role_path, NO_LIMIT)?;
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
    let content = item.content.ok_or_else(|| field::missing(&content_path))?;
    // The text part type a role may carry, as the API defines it.
    let allowed: &[&str] = match role {
        Role::Assistant => &["output_text"],
        Role::User if images => &["input_text", IMAGE_PART],
        _ => &["input_text"],
    };
    let (text, source) = text_or_parts(content, &content_path, "content", allowed, "", max)?;
    Ok((Item::Message { role, text }, source))
}

fn parse_reasoning(item: RawItem, path: &Path, max: usize) -> Result<(Item, TextSource)> {
    // The raw reasoning text when the client replays it; otherwise the summaries, which
    // are separate paragraphs.
    if let Some(content) = item.content {
        let p = path.key("content");
        let (text, source) = parts(content, &p, "content", &["reasoning_text"], "", max)?;
        if !text.is_empty() {
            return Ok((Item::Reasoning { text }, source));
        }
    }
    match item.summary {
        Some(summary) => {
            let p = path.key("summary");
            let (text, source) = parts(summary, &p, "summary", &["summary_text"], "\n\n", max)?;
            Ok((Item::Reasoning { text }, source))
        }
        None => Ok((
            Item::Reasoning { text: String::new() },
            TextSource::plain("summary"),
        )),
    }
}

/// A field that is a string or a list of text parts.
pub(super) fn text_or_parts(
    shape: Shape<RawPart>,
    path: &Path,
    field_name: &'static str,
    allowed: &[&str],
    separator: &str,
    max: usize,
) -> Result<(String, TextSource)> {
    match shape {
        Shape::Str(_) => Ok((shape.text(path, max)?.into_owned(), TextSource::plain(field_name))),
        Shape::Array(_) => parts(shape, path, field_name, allowed, separator, max),
        other => Err(field::type_error(
            path,
            "a string or an array of content parts",
            other.kind(),
        )),
    }
}

/// A list of text parts joined into one text (`separator` between parts).
fn parts(
    shape: Shape<RawPart>,
    path: &Path,
    field_name: &'static str,
    allowed: &[&str],
    separator: &str,
    max: usize,
) -> Result<(String, TextSource)> {
    let Shape::Array(elements) = shape else {
        return Err(field::type_error(path, "an array of content parts", shape.kind()));
    };
    let mut text = String::new();
    let mut part_ends = Vec::with_capacity(elements.len());
    for (j, element) in elements.into_iter().enumerate() {
        let part_path = path.index(j);
        let part = element.object(&part_path)?;
        let type_path = part_path.key("type");
        let kind = required_text(part.kind, &type_path, NO_LIMIT)?;
        if !allowed.contains(&kind.as_str()) {
            return Err(part_type_error(&part_path, &kind, allowed));
        }
        if j > 0 {
            text.push_str(separator);
        }
        if IMAGE_PARTS.contains(&kind.as_str()) {
            text.push_str(IMAGE_PLACEHOLDER);
        } else {
            let text_path = part_path.key("text");
            let piece = part.text.ok_or_else(|| field::missing(&text_path))?;
            text.push_str(&piece.text(&text_path, max)?);
        }
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
            located: None,
        },
    ))
}

/// An image part of a user message, accepted when the model takes images
/// ([`Limits::images`]).
const IMAGE_PART: &str = "input_image";

/// Image parts in either API's spelling (Chat Completions: `image_url`), where a
/// message's `allowed` part types list one.
const IMAGE_PARTS: [&str; 2] = [IMAGE_PART, "image_url"];

/// What an accepted image renders as: the engine's vision input is out of the text, so
/// the prompt marks where it stood.
const IMAGE_PLACEHOLDER: &str = "[image]";

/// Text part types of the API that belong to another role are invalid values (at the
/// part's `type`); any other part type (images, files, audio, ...) is content this
/// model cannot take (at the part).
fn part_type_error(part_path: &Path, kind: &str, allowed: &[&str]) -> Error {
    let path = &part_path.key("type");
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
        let modalities = if allowed.iter().any(|a| IMAGE_PARTS.contains(a)) {
            "text and images"
        } else {
            "text only"
        };
        Error::new(
            Code::UnsupportedContent,
            format!(
                "Content part '{part_path}' of type '{kind}' is not supported: this model \
                 accepts {modalities} ({supported} here)."
            ),
        )
        .at(part_path.to_string())
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
    fn a_namespaced_call_carries_its_qualified_name() {
        let input = parse(
            r#"[
            {"type":"function_call","call_id":"c1","namespace":"multi_agent_v1","name":"wait","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"x"},
            {"type":"function_call","call_id":"c2","namespace":null,"name":"ls","arguments":"{}"},
            {"type":"function_call_output","call_id":"c2","output":"y"}
        ]"#,
        )
        .unwrap();
        let names: Vec<_> = input
            .items
            .iter()
            .filter_map(|i| match i {
                Item::FunctionCall { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["multi_agent_v1.wait", "ls"]);
        for (namespace, code) in [
            (r#""""#, Code::InvalidValue),
            (r#""a.b""#, Code::InvalidValue),
            ("3", Code::InvalidType),
        ] {
            let json = format!(
                r#"[{{"type":"function_call","call_id":"c","namespace":{namespace},"name":"f","arguments":"{{}}"}}]"#
            );
            let e = parse(&json).unwrap_err();
            assert_eq!(
                (e.code, e.param.as_deref()),
                (code, Some("input[0].namespace")),
                "{json}"
            );
        }
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
                "input[0].content[0]",
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
                "input[0].output[0]",
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
    fn images_render_as_placeholders_when_the_model_takes_them() {
        let json = r#"[{"role":"user","content":[{"type":"input_text","text":"see "},{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]"#;
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        let e = parse_input(Some(raw), &Limits::default()).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (Code::UnsupportedContent, Some("input[0].content[1]"))
        );
        assert!(e.message.contains("text only"), "{}", e.message);
        let vision = Limits {
            images: true,
            ..Limits::default()
        };
        let input = parse_input(Some(raw), &vision).unwrap();
        assert_eq!(
            input.items[0],
            Item::Message {
                role: Role::User,
                text: format!("see {IMAGE_PLACEHOLDER}")
            }
        );
    }

    #[test]
    fn limits() {
        let tight = Limits {
            max_items: 2,
            max_text_bytes: 4,
            max_tools: 1,
            max_tools_bytes: 4,
            images: false,
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
