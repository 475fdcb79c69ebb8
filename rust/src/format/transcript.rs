//! Test support: drive a format the way the conversation layer does (one renderer per
//! segment, `Context` from the previous item), run its parser over sampled ids, and
//! read the golden cases of tests/golden/.

use std::sync::Arc;

use serde_json::Value;

use super::{ChatFormat, Context, Outcome, ParseEvent};
use crate::item::{Item, ItemKind, Prefix, Role, Tool};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;

/// The conversation as segments: the prefix, one per item, then the generation header.
pub fn segments(format: &dyn ChatFormat, prefix: &Prefix, items: &[Item]) -> Vec<Vec<u32>> {
    let tokenizer = format.tokenizer().as_ref();
    let call_name = |id: &str| {
        items.iter().find_map(|item| match item {
            Item::FunctionCall { call_id, name, .. } if call_id == id => Some(name.clone()),
            _ => None,
        })
    };
    let mut out = Vec::new();
    let mut r = Renderer::new(tokenizer);
    format.render_prefix(prefix, &mut r);
    out.push(r.finish());
    let mut prev: Option<ItemKind> = None;
    for item in items {
        let mut r = Renderer::new(tokenizer);
        format.render_item(
            &Context {
                prev,
                call_name: &call_name,
            },
            item,
            &mut r,
        );
        out.push(r.finish());
        prev = Some(item.kind());
    }
    let mut r = Renderer::new(tokenizer);
    format.render_generation_header(
        &Context {
            prev,
            call_name: &call_name,
        },
        &mut r,
    );
    out.push(r.finish());
    out
}

pub fn completion(format: &dyn ChatFormat, items: &[Item]) -> Vec<u32> {
    let mut r = Renderer::new(format.tokenizer().as_ref());
    format.render_completion(items, &mut r);
    r.finish()
}

pub fn output(format: &dyn ChatFormat, sampled: &[u32]) -> Vec<u32> {
    let mut r = Renderer::new(format.tokenizer().as_ref());
    format.render_output(sampled, &mut r);
    r.finish()
}

pub fn text(format: &dyn ChatFormat, ids: &[u32]) -> String {
    let mut bytes = Vec::new();
    format.tokenizer().decode_bytes(ids, &mut bytes);
    String::from_utf8(bytes).expect("rendered ids decode to UTF-8")
}

pub struct Parsed {
    pub events: Vec<ParseEvent>,
    pub outcome: Outcome,
    pub items: Vec<Item>,
    pub output_tokens: usize,
    pub reasoning_tokens: usize,
}

pub fn parse(format: &dyn ChatFormat, ids: &[u32]) -> Parsed {
    let mut parser = format.parser();
    let mut events = Vec::new();
    // One token per engine step, each step's events apart: a step's deltas of one item
    // would merge into one event.
    for &id in ids {
        let mut step = Vec::new();
        parser.feed(id, &mut step);
        events.append(&mut step);
    }
    let outcome = parser.finish(&mut events);
    Parsed {
        events,
        outcome,
        items: parser.items().to_vec(),
        output_tokens: parser.output_tokens(),
        reasoning_tokens: parser.reasoning_tokens(),
    }
}

/// Items equal up to the call ids the parser minted.
pub fn same_items(parsed: &[Item], expected: &[Item]) -> bool {
    let strip = |items: &[Item]| -> Vec<Item> {
        items
            .iter()
            .map(|item| match item {
                Item::FunctionCall { name, arguments, .. } => Item::FunctionCall {
                    call_id: String::new(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                },
                other => other.clone(),
            })
            .collect()
    };
    strip(parsed) == strip(expected)
}

/// A case of the golden vectors in tests/golden/ (written by the Python tests from the
/// reference renderers): a conversation and what the reference rendered for it.
pub struct GoldenCase {
    pub name: String,
    pub prefix: Prefix,
    pub items: Vec<Item>,
    pub tokens: Vec<u32>,
    pub text: Option<String>,
}

pub fn golden(json: &str) -> Vec<GoldenCase> {
    let cases: Vec<Value> = serde_json::from_str(json).expect("golden vectors are JSON");
    cases.iter().map(golden_case).collect()
}

fn golden_case(case: &Value) -> GoldenCase {
    let s = |v: &Value, k: &str| v[k].as_str().map(str::to_owned);
    let p = &case["prefix"];
    let tools = p["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
    let prefix = Prefix {
        instructions: s(p, "instructions"),
        tools: tools
            .iter()
            .map(|t| Tool {
                name: s(t, "name").unwrap_or_default(),
                description: s(t, "description"),
                parameters: t["parameters"].clone(),
                strict: false,
            })
            .collect(),
        namespaces: Vec::new(),
        reasoning_effort: s(p, "reasoning_effort"),
    };
    let field = |v: &Value, k: &str| s(v, k).unwrap_or_default();
    let items = case["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|i| match i["type"].as_str() {
            Some("message") => Item::Message {
                role: match i["role"].as_str() {
                    Some("system") => Role::System,
                    Some("developer") => Role::Developer,
                    Some("user") => Role::User,
                    _ => Role::Assistant,
                },
                text: field(i, "text"),
            },
            Some("reasoning") => Item::Reasoning {
                text: field(i, "text"),
            },
            Some("function_call") => Item::FunctionCall {
                call_id: field(i, "call_id"),
                name: field(i, "name"),
                arguments: field(i, "arguments"),
            },
            _ => Item::FunctionCallOutput {
                call_id: field(i, "call_id"),
                output: field(i, "output"),
            },
        })
        .collect();
    let tokens = case["tokens"].as_array().map(Vec::as_slice).unwrap_or_default();
    GoldenCase {
        name: field(case, "name"),
        prefix,
        items,
        tokens: tokens
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| t as u32)
            .collect(),
        text: s(case, "text"),
    }
}

pub const MARKERS: &[&str] = &[
    "<|eot_id|>",
    "<|im_start|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[THINK]",
    "[/THINK]",
    "</s>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
];
pub const BASE: u32 = 200_100;

/// o200k_base with the families' markers (and ChatML's) as special tokens: a vocabulary
/// where every chat format's markers are one token each.
struct MarkerVocab(Arc<dyn Tokenizer>);

impl Tokenizer for MarkerVocab {
    fn name(&self) -> &str {
        "o200k_markers"
    }
    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        self.0.encode(text, out)
    }
    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        self.0.pieces(text)
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        match id.checked_sub(BASE) {
            Some(i) if (i as usize) < MARKERS.len() => MARKERS[i as usize].as_bytes(),
            _ => self.0.token_bytes(id),
        }
    }
    fn special(&self, name: &str) -> Option<u32> {
        MARKERS.iter().position(|m| *m == name).map(|i| BASE + i as u32)
    }
    fn is_special(&self, id: u32) -> bool {
        id >= BASE || self.0.is_special(id)
    }
    fn vocab_size(&self) -> usize {
        BASE as usize + MARKERS.len()
    }
}

pub fn marker_vocab() -> Arc<dyn Tokenizer> {
    Arc::new(MarkerVocab(crate::tokenizer::by_name("o200k_base").unwrap()))
}
