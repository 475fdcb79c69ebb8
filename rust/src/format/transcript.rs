//! Test support: drive a format the way the conversation layer does (one renderer per
//! segment, `Context` from the previous item) and run its parser over sampled ids.

use super::{ChatFormat, Context, Outcome, ParseEvent};
use crate::item::{Item, ItemKind, Prefix};
use crate::render::Renderer;

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
    for &id in ids {
        parser.feed(id, &mut events);
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
