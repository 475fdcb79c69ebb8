//! [`SegmentBuilder`]: the prompt built segment by segment through a [`ChatFormat`]
//! (harmony, ChatML).
//!
//! The prompt is a sequence of segments (see `segment`): the prefix (instructions,
//! tools), one per input item, and per turn the assistant header and the sampled output,
//! kept as the sampled ids verbatim. Its tokens and segments live in persistent chunked
//! vectors (`crate::chunks`), so a checkpoint, a fork from it and a [`Prompt`] share
//! the history instead of copying it.
//!
//! Appending renders and tokenizes only the new segments. Anything that rewrites history
//! is explicit and counted in [`Stats`]: a changed prefix re-renders from the prefix on; an
//! abandoned turn drops its header; a growing text re-tokenizes from just before its join
//! (`growth`). A text run left open by the last segment (ChatML's `\n` after `<|im_end|>`)
//! is kept as text and encoded provisionally at the end of the prompt, so that the next
//! append continues it exactly as a full render would.
//!
//! This module does not know any chat format beyond the `ChatFormat` trait.

mod growth;
mod kept;
pub(crate) mod segment;

use std::mem::size_of;
use std::sync::Arc;

use growth::{Change, Continuation, Position, Recorder, Recording};
use kept::KeptItem;
use segment::{Body, PrefixEntry, Rendering, Segment, Step};

use super::builder::{same_kind, Appended, PromptBuilder};
use super::{OpenCall, Prompt};
use crate::chunks::Chunks;
use crate::error::{Code, Error, Result};
use crate::format::{ChatFormat, Context, OutputParser};
use crate::item::{Item, Prefix};
use crate::render::Renderer;
use crate::tokenizer::Tokenizer;

/// Work counters of one conversation (forks start from zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub segments_rendered: u64,
    pub tokens_rendered: u64,
    /// Tokens kept from the cache by appends instead of being rendered again.
    pub tokens_reused: u64,
    /// History rewrites forced by a changed prefix.
    pub invalidations: u64,
    /// Growing texts whose re-tokenization failed its check and re-encoded the segment.
    pub text_fallbacks: u64,
}

impl Stats {
    pub fn pairs(&self) -> [(&'static str, u64); 5] {
        [
            ("segments_rendered", self.segments_rendered),
            ("tokens_rendered", self.tokens_rendered),
            ("tokens_reused", self.tokens_reused),
            ("invalidations", self.invalidations),
            ("text_fallbacks", self.text_fallbacks),
        ]
    }

    fn count(&mut self, work: &Work) {
        self.segments_rendered += work.segments as u64;
        self.tokens_rendered += work.tokens as u64;
        self.tokens_reused += work.kept as u64;
    }
}

/// Where the last growing text may restart re-tokenization (see `growth`).
#[derive(Clone, Copy, PartialEq)]
struct GrowthHint {
    segment: usize,
    /// Which encoded text of the segment's rendering; None for the open run.
    text: Option<usize>,
    byte: usize,
}

/// How `grow_last`'s fast path went.
#[derive(PartialEq)]
enum Regrowth {
    /// Re-tokenized in place; this many tokens were kept.
    Done(usize),
    /// The grown item renders to a different structure (e.g. an empty text now encoded).
    Restructured,
    /// The re-encoded ids disagreed with the cached ones.
    CheckFailed,
}

/// Tokens rendered and kept by one rewrite.
struct Work {
    kept: usize,
    segments: usize,
    tokens: usize,
}

/// The prompt of one conversation as segments. Cloning it is O(1): everything is shared.
#[derive(Clone)]
pub struct SegmentBuilder {
    format: Arc<dyn ChatFormat>,
    tokens: Chunks<u32>,
    segments: Chunks<Segment>,
    /// The run left open by the last segment; its ids are the last `run_tokens` tokens.
    run: Arc<str>,
    run_tokens: usize,
    hint: Option<GrowthHint>,
    /// Everything the builder holds (`unique_bytes(None)`), kept up to date by `settle`
    /// in O(changed nodes).
    bytes: usize,
    stats: Stats,
}

/// The prefix of a builder that has rendered nothing yet.
static NO_PREFIX: Prefix = Prefix {
    instructions: None,
    tools: Vec::new(),
    namespaces: Vec::new(),
    reasoning_effort: None,
};

impl SegmentBuilder {
    /// An empty prompt: nothing is rendered, not even the prefix, until the first append
    /// (so that the first turn's tokens all count as new, none as cached).
    pub fn new(format: Arc<dyn ChatFormat>) -> SegmentBuilder {
        SegmentBuilder {
            format,
            tokens: Chunks::default(),
            segments: Chunks::default(),
            run: Arc::from(""),
            run_tokens: 0,
            hint: None,
            bytes: 0,
            stats: Stats::default(),
        }
    }

    /// Tokens that are final (the provisional encoding of the open run excluded).
    fn final_len(&self) -> usize {
        self.tokens.len() - self.run_tokens
    }

    fn segment(&self, index: usize) -> &Segment {
        self.segments.get(index).expect("segment index in range")
    }

    /// Where the items end: before the open turn's header, if any.
    fn history_len(&self) -> usize {
        self.segments.len() - usize::from(self.turn_open())
    }

    /// Name of the function an earlier call of this prompt called: one of the open
    /// `calls`, else found by walking the segments back (only when re-rendering history).
    fn call_name(&self, calls: &[OpenCall], call_id: &str) -> Option<String> {
        if let Some(open) = calls.iter().find(|c| c.call_id == call_id) {
            return Some(open.name.clone());
        }
        let named = |item: &Item| match item {
            Item::FunctionCall {
                call_id: id, name, ..
            } if id == call_id => Some(name.clone()),
            _ => None,
        };
        (0..self.segments.len())
            .rev()
            .find_map(|i| match &self.segment(i).body {
                Body::Item(item) => item.plain().and_then(named),
                Body::Output(items) => items.iter().rev().find_map(named),
                _ => None,
            })
    }

    /// Segments `from..to` as steps that render them again (output ids copied verbatim).
    fn replay(&self, from: usize, to: usize) -> Vec<Step> {
        (from..to)
            .map(|i| {
                let seg = self.segment(i);
                match &seg.body {
                    Body::Prefix(entry) => Step::Prefix(Arc::clone(entry)),
                    Body::Item(item) => Step::Item(item.item()),
                    Body::Header => Step::Header,
                    Body::Output(items) => {
                        let (end, run_after) = if i + 1 < self.segments.len() {
                            let next = self.segment(i + 1);
                            (next.start, next.carried.clone())
                        } else {
                            (
                                self.final_len(),
                                (!self.run.is_empty()).then(|| Arc::clone(&self.run)),
                            )
                        };
                        Step::Replay {
                            items: Arc::clone(items),
                            ids: self.tokens.to_vec(seg.start, end),
                            run_after,
                        }
                    }
                }
            })
            .collect()
    }

    /// Drop segments `from..` and render `steps` in their place.
    fn rewrite(&mut self, from: usize, steps: Vec<Step>, calls: &[OpenCall]) -> Work {
        let format = Arc::clone(&self.format);
        let (start, carried) = if from < self.segments.len() {
            let seg = self.segment(from);
            (seg.start, seg.carried.clone())
        } else {
            (self.final_len(), Some(Arc::clone(&self.run)))
        };
        let prev = from.checked_sub(1).and_then(|i| self.segment(i).kind());
        let before = self.clone();
        let earlier = |id: &str| before.call_name(calls, id);
        let carried = carried.as_deref().unwrap_or("");
        // Appending after an open run continues it: its cached ids spare re-encoding it whole.
        let continuation = (from == self.segments.len() && self.run_tokens > 0).then(|| {
            Continuation::new(
                format.tokenizer().as_ref(),
                carried,
                self.tokens.to_vec(start, self.tokens.len()),
            )
        });
        let tokenizer: &dyn Tokenizer = match &continuation {
            Some(c) => c,
            None => format.tokenizer().as_ref(),
        };
        let mut rendering = Rendering::new(format.as_ref(), tokenizer, start, carried, prev, &earlier);
        self.tokens.truncate(start);
        self.segments.truncate(from);
        let count = steps.len();
        for step in steps {
            let segment = rendering.render(step);
            self.segments.push(segment);
        }
        let (ids, run) = rendering.renderer.into_parts();
        self.tokens.extend_from_slice(&ids);
        let mut provisional = Vec::new();
        tokenizer.encode(&run, &mut provisional);
        self.tokens.extend_from_slice(&provisional);
        self.run = Arc::from(run);
        self.run_tokens = provisional.len();
        self.hint = None;
        let reused = continuation.as_ref().map_or(0, Continuation::reused);
        let work = Work {
            kept: start + reused,
            segments: count,
            tokens: ids.len() + provisional.len() - reused,
        };
        self.stats.count(&work);
        work
    }

    /// Bring `bytes` up to date after changes made since `before` (a walk over the
    /// nodes that differ, not over the history).
    fn settle(&mut self, before: &SegmentBuilder) {
        let added = self.own_bytes(Some(before));
        let dropped = before.own_bytes(Some(self));
        self.bytes = before.bytes + added - dropped;
    }

    fn own_bytes(&self, base: Option<&SegmentBuilder>) -> usize {
        let run = match base {
            Some(b) if Arc::ptr_eq(&b.run, &self.run) => 0,
            _ => self.run.len(),
        };
        self.tokens.unique_bytes(base.map(|b| &b.tokens))
            + self.segments.unique_bytes(base.map(|b| &b.segments))
            + run
    }

    /// The fast path of `grow_last`: find the one text of the item's rendering that grew
    /// and re-tokenize its end in place.
    fn regrow_last(&mut self, last: usize, old: &Item, new: &Arc<Item>, calls: &[OpenCall]) -> Regrowth {
        let format = Arc::clone(&self.format);
        let tokenizer = format.tokenizer().as_ref();
        let seg = self.segment(last).clone();
        let prev = self.segment(last - 1).kind();
        let record = |item: &Item| {
            let recorder = Recorder::new(tokenizer);
            let (shape, run) = {
                let mut r = Renderer::new(&recorder);
                r.text(seg.carried.as_deref().unwrap_or(""));
                let lookup = |id: &str| self.call_name(calls, id);
                let ctx = Context {
                    prev,
                    call_name: &lookup,
                };
                format.render_item(&ctx, item, &mut r);
                r.into_parts()
            };
            Recording {
                shape,
                texts: recorder.into_texts(),
                run,
            }
        };
        let (was, now) = (record(old), record(new));
        let Some(change) = was.change(&now) else {
            return Regrowth::Restructured;
        };
        let (text, old_text, new_text, end, floor) = match change {
            Change::Text { index, after } => {
                let after: usize = after
                    .iter()
                    .map(|p| match p {
                        Position::Id => 1,
                        Position::Text(i) => {
                            let mut ids = Vec::new();
                            tokenizer.encode(&was.texts[*i], &mut ids);
                            ids.len()
                        }
                    })
                    .sum();
                let end = self.final_len().saturating_sub(after);
                (Some(index), &was.texts[index], &now.texts[index], end, seg.start)
            }
            Change::Run => (None, &was.run, &now.run, self.tokens.len(), self.final_len()),
        };
        if end < floor {
            return Regrowth::CheckFailed;
        }
        let hint = self
            .hint
            .filter(|h| h.segment == last && h.text == text)
            .map(|h| h.byte);
        let tokens = &self.tokens;
        let Some(regrown) = growth::regrow(tokenizer, old_text, new_text, hint, |n| {
            tokens.to_vec(end.saturating_sub(n).max(floor), end)
        }) else {
            return Regrowth::CheckFailed;
        };
        let kept = end - regrown.drop;
        let tail = self.tokens.to_vec(end, self.tokens.len());
        self.tokens.truncate(kept);
        self.tokens.extend_from_slice(&regrown.ids);
        self.tokens.extend_from_slice(&tail);
        if text.is_none() {
            self.run = Arc::from(now.run.as_str());
            self.run_tokens = self.run_tokens - regrown.drop + regrown.ids.len();
        }
        self.segments.truncate(last);
        self.segments.push(Segment {
            // Kept as it is: a text that grows again is read again.
            body: Body::Item(KeptItem::Plain(Arc::clone(new))),
            ..seg
        });
        self.hint = Some(GrowthHint {
            segment: last,
            text,
            byte: regrown.hint,
        });
        Regrowth::Done(kept)
    }
}

impl PromptBuilder for SegmentBuilder {
    fn boxed_clone(&self) -> Box<dyn PromptBuilder> {
        Box::new(self.clone())
    }

    fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        self.format.tokenizer()
    }

    fn prefix(&self) -> &Prefix {
        match self.segments.get(0).map(|s| &s.body) {
            Some(Body::Prefix(entry)) => &entry.prefix,
            Some(_) => unreachable!("a prompt starts with its prefix"),
            None => &NO_PREFIX,
        }
    }

    fn turn_open(&self) -> bool {
        matches!(self.segments.last().map(|s| &s.body), Some(Body::Header))
    }

    fn append(
        &mut self,
        prefix: Option<Prefix>,
        items: &[Item],
        open_turn: bool,
        calls: &[OpenCall],
    ) -> Result<Appended> {
        let before = self.clone();
        let history = self.history_len();
        // An empty prompt renders its prefix first, whatever it is.
        let prefix = match prefix {
            None if history == 0 => Some(Prefix::default()),
            p => p,
        };
        let invalidated = prefix.is_some() && history > 1;
        let mut steps = Vec::with_capacity(history + items.len() + 1);
        let from = match prefix {
            Some(p) => {
                steps.push(Step::Prefix(PrefixEntry::new(p)));
                steps.extend(self.replay(1, history));
                0
            }
            None => history,
        };
        steps.extend(items.iter().map(|item| Step::Item(Arc::new(item.clone()))));
        if open_turn {
            steps.push(Step::Header);
        }
        let work = self.rewrite(from, steps, calls);
        if invalidated {
            self.stats.invalidations += 1;
        }
        self.settle(&before);
        Ok(Appended {
            kept: work.kept,
            invalidated,
        })
    }

    /// Re-tokenizes only from just before the join when that checks out against the
    /// cached ids, otherwise re-renders the item's segment.
    fn grow_last(&mut self, chunk: &str, calls: &[OpenCall]) -> Result<usize> {
        let before = self.clone();
        if self.turn_open() {
            self.rewrite(self.segments.len() - 1, Vec::new(), calls);
        }
        let last = self.segments.len().saturating_sub(1);
        let seg = self.segments.get(last).cloned();
        let (Some(Body::Item(old)), true) = (seg.as_ref().map(|s| &s.body), last > 0) else {
            return Err(Error::new(
                Code::InvalidValue,
                "append_text grows the last input item, and the conversation does not end with one",
            ));
        };
        let old = old.item();
        let new = Arc::new(grown(&old, chunk));
        match self.regrow_last(last, &old, &new, calls) {
            Regrowth::Done(kept) => {
                self.stats.segments_rendered += 1;
                self.stats.tokens_reused += kept as u64;
                self.stats.tokens_rendered += (self.tokens.len() - kept) as u64;
            }
            outcome => {
                self.rewrite(last, vec![Step::Item(Arc::clone(&new))], calls);
                if outcome == Regrowth::CheckFailed {
                    self.stats.text_fallbacks += 1;
                }
            }
        }
        self.settle(&before);
        Ok(self.tokens.len() - before.tokens.common_prefix_len(&self.tokens))
    }

    /// The sampled ids verbatim, as `ChatFormat::render_output` writes them.
    fn append_output(
        &mut self,
        items: &[Item],
        sampled: &[u32],
        open_first: bool,
        calls: &[OpenCall],
    ) -> Result<()> {
        let before = self.clone();
        let mut steps = Vec::with_capacity(2);
        if open_first {
            steps.push(Step::Header);
        }
        steps.push(Step::Output {
            items: items.into(),
            sampled: sampled.to_vec(),
        });
        self.rewrite(self.segments.len(), steps, calls);
        self.settle(&before);
        Ok(())
    }

    fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.tokens.clone(),
        }
    }

    fn generation_prompt(&self, calls: &[OpenCall]) -> Result<Prompt> {
        let mut next = self.clone();
        next.rewrite(next.history_len(), vec![Step::Header], calls);
        Ok(Prompt { tokens: next.tokens })
    }

    fn parser(&self) -> Box<dyn OutputParser> {
        self.format.parser()
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn memory_bytes(&self) -> usize {
        size_of::<SegmentBuilder>() + self.bytes
    }

    fn unique_bytes(&self, base: Option<&dyn PromptBuilder>) -> usize {
        self.own_bytes(same_kind::<SegmentBuilder>(base))
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        self.stats.pairs().to_vec()
    }

    fn reset_stats(&mut self) {
        self.stats = Stats::default();
    }
}

/// `item` with `chunk` appended to its growing text (message or reasoning text, tool
/// output, call arguments).
fn grown(item: &Item, chunk: &str) -> Item {
    let mut item = item.clone();
    match &mut item {
        Item::Message { text, .. } | Item::Reasoning { text } => text.push_str(chunk),
        Item::FunctionCallOutput { output, .. } => output.push_str(chunk),
        Item::FunctionCall { arguments, .. } => arguments.push_str(chunk),
    }
    item
}

#[cfg(test)]
mod tests;
