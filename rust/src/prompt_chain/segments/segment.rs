//! Segments: what a [`super::SegmentBuilder`]'s prompt is made of, and how a run of them is
//! rendered into tokens.
//!
//! A segment is one unit of history: the prefix (instructions, tools), one input item,
//! the assistant header of a turn, or one turn's sampled output. It records where its
//! tokens start and the open text run it inherited from the segment before (ChatML's
//! `\n` after `<|im_end|>`, a tool-result group left open), which is all that is needed
//! to re-render the chain from that segment on without touching what comes before.

use std::collections::HashMap;
use std::mem::size_of;
use std::sync::Arc;

use super::kept::KeptItem;
use crate::chunks::{Addressable, Element};
use crate::format::{ChatFormat, Context};
use crate::item::{Item, ItemKind, Prefix, Role};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;

/// The prefix with its size measured once (tool schemas are large and only their size is
/// needed for memory accounting).
pub(crate) struct PrefixEntry {
    pub prefix: Prefix,
    pub bytes: usize,
}

impl PrefixEntry {
    pub fn new(prefix: Prefix) -> Arc<PrefixEntry> {
        let tools: usize = prefix
            .tools
            .iter()
            .map(|t| {
                size_of::<crate::item::Tool>()
                    + t.name.len()
                    + t.description.as_ref().map_or(0, String::len)
                    + t.parameters.to_string().len()
            })
            .sum();
        let bytes = tools
            + prefix.instructions.as_ref().map_or(0, String::len)
            + prefix.reasoning_effort.as_ref().map_or(0, String::len);
        Arc::new(PrefixEntry { prefix, bytes })
    }
}

#[derive(Clone)]
pub(crate) enum Body {
    Prefix(Arc<PrefixEntry>),
    Item(KeptItem),
    /// The tokens that open an assistant turn; the last segment while the turn is open.
    Header,
    /// One turn's sampled ids (the segment's tokens, verbatim) and the items parsed from them.
    Output(Arc<[Item]>),
}

#[derive(Clone)]
pub(crate) struct Segment {
    /// Index of the segment's first token in the chain.
    pub start: usize,
    /// The open text run inherited from the previous segment, continued by this one.
    pub carried: Option<Arc<str>>,
    pub body: Body,
}

/// Heap bytes of an item's strings plus the item itself.
pub(crate) fn item_bytes(item: &Item) -> usize {
    size_of::<Item>()
        + match item {
            Item::Message { text, .. } | Item::Reasoning { text } => text.len(),
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => call_id.len() + name.len() + arguments.len(),
            Item::FunctionCallOutput { call_id, output } => call_id.len() + output.len(),
        }
}

const ARC_HEADER: usize = 2 * size_of::<usize>();

impl Element for Segment {
    const LEAF: usize = 8;
    fn heap_bytes(&self) -> usize {
        let carried = self.carried.as_ref().map_or(0, |c| ARC_HEADER + c.len());
        carried
            + ARC_HEADER
            + match &self.body {
                Body::Prefix(p) => p.bytes,
                Body::Item(item) => item.heap_bytes(),
                Body::Header => 0,
                Body::Output(items) => items.iter().map(item_bytes).sum(),
            }
    }

    fn shares_heap(&self, other: &Self) -> bool {
        let body = match (&self.body, &other.body) {
            (Body::Prefix(a), Body::Prefix(b)) => Arc::ptr_eq(a, b),
            (Body::Item(a), Body::Item(b)) => a.same(b),
            (Body::Output(a), Body::Output(b)) => Arc::ptr_eq(a, b),
            (Body::Header, Body::Header) => true,
            _ => false,
        };
        let carried = match (&self.carried, &other.carried) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        body && carried
    }
}

impl Addressable for Segment {}

impl Segment {
    /// The item kind a following item sees as `Context::prev`.
    pub fn kind(&self) -> Option<ItemKind> {
        match &self.body {
            Body::Prefix(_) => None,
            Body::Item(item) => Some(item.kind()),
            Body::Header => Some(ItemKind::Message(Role::Assistant)),
            Body::Output(items) => Some(
                items
                    .last()
                    .map_or(ItemKind::Message(Role::Assistant), Item::kind),
            ),
        }
    }
}

/// One segment to render: new history, or existing history being re-rendered.
pub(crate) enum Step {
    Prefix(Arc<PrefixEntry>),
    Item(Arc<Item>),
    Header,
    /// New model output: rendered through `ChatFormat::render_output`.
    Output {
        items: Arc<[Item]>,
        sampled: Vec<u32>,
    },
    /// Existing model output: its tokens copied verbatim, then the run it left open.
    Replay {
        items: Arc<[Item]>,
        ids: Vec<u32>,
        run_after: Option<Arc<str>>,
    },
}

/// Renders steps one after the other, recording a segment for each.
pub(crate) struct Rendering<'a> {
    pub format: &'a dyn ChatFormat,
    pub renderer: Renderer<'a>,
    /// Chain position of the renderer's first token.
    pub base: usize,
    pub prev: Option<ItemKind>,
    /// Names of calls met in this rendering, by call id.
    names: HashMap<String, String>,
    /// Names of calls made before this rendering.
    earlier: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Rendering<'a> {
    /// Render after `carried`, the open run, with `tokenizer` (the format's, or one that
    /// knows the run's cached ids).
    pub fn new(
        format: &'a dyn ChatFormat,
        tokenizer: &'a dyn Tokenizer,
        base: usize,
        carried: &str,
        prev: Option<ItemKind>,
        earlier: &'a dyn Fn(&str) -> Option<String>,
    ) -> Self {
        let mut renderer = Renderer::new(tokenizer);
        renderer.text(carried);
        Rendering {
            format,
            renderer,
            base,
            prev,
            names: HashMap::new(),
            earlier,
        }
    }

    fn remember_calls(&mut self, items: &[Item]) {
        for item in items {
            if let Item::FunctionCall { call_id, name, .. } = item {
                self.names.insert(call_id.clone(), name.clone());
            }
        }
    }

    pub fn render(&mut self, step: Step) -> Segment {
        let carried = |r: &Renderer| (!r.open_run().is_empty()).then(|| Arc::<str>::from(r.open_run()));
        let mut start = self.base + self.renderer.len();
        let mut inherited = carried(&self.renderer);
        let names = &self.names;
        let earlier = self.earlier;
        let lookup = |id: &str| names.get(id).cloned().or_else(|| earlier(id));
        let ctx = Context {
            prev: self.prev,
            call_name: &lookup,
        };
        let body = match step {
            Step::Prefix(entry) => {
                self.format.render_prefix(&entry.prefix, &mut self.renderer);
                self.prev = None;
                Body::Prefix(entry)
            }
            Step::Item(item) => {
                self.format.render_item(&ctx, &item, &mut self.renderer);
                self.prev = Some(item.kind());
                self.remember_calls(std::slice::from_ref(&item));
                Body::Item(KeptItem::new(item))
            }
            Step::Header => {
                self.format.render_generation_header(&ctx, &mut self.renderer);
                Body::Header
            }
            Step::Output { items, sampled } => {
                // Output segments start clean so that their tokens are exactly the ids
                // render_output wrote, which is what a replay copies.
                self.renderer.flush();
                start = self.base + self.renderer.len();
                inherited = None;
                self.format.render_output(&sampled, &mut self.renderer);
                self.after_output(&items);
                Body::Output(items)
            }
            Step::Replay {
                items,
                ids,
                run_after,
            } => {
                self.renderer.flush();
                start = self.base + self.renderer.len();
                inherited = None;
                self.renderer.ids(&ids);
                self.renderer.text(run_after.as_deref().unwrap_or(""));
                self.after_output(&items);
                Body::Output(items)
            }
        };
        Segment {
            start,
            carried: inherited,
            body,
        }
    }

    fn after_output(&mut self, items: &[Item]) {
        self.prev = Some(
            items
                .last()
                .map_or(ItemKind::Message(Role::Assistant), Item::kind),
        );
        self.remember_calls(items);
    }
}
