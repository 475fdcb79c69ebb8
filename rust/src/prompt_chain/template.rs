//! [`TemplateBuilder`]: the prompt built under a model's own chat template, rendered and
//! tokenized by difference.
//!
//! The state is one [`TemplatePrompt`] (incremental by difference, see
//! `format::template::prompt`) and the request prefix it was rendered with. A clone of it
//! shares the text and ids (persistent chunks) and the messages. A committed model turn
//! becomes messages (its parsed items) and is rendered as the template renders it, so the
//! next prompt equals `tokenizers.encode(render(...))`; in verbatim mode the sampled ids
//! are kept where the template renders their text unchanged.

use std::mem::size_of;
use std::sync::Arc;

use super::builder::{same_kind, Appended, PromptBuilder};
use super::{OpenCall, Prompt};
use crate::error::{Code, Error, Result};
use crate::format::template::prompt::TemplatePrompt;
use crate::format::template::TemplateFormat;
use crate::format::OutputParser;
use crate::item::{Item, Prefix};
use crate::tokenizer::Tokenizer;

/// The prompt of one conversation under a chat template.
#[derive(Clone)]
pub struct TemplateBuilder {
    format: Arc<TemplateFormat>,
    prompt: TemplatePrompt,
    /// Shared: the builder is cloned every turn and at every checkpoint.
    prefix: Arc<Prefix>,
    turn_open: bool,
    /// Rendering the last committed output rewrote earlier text: the next turn's
    /// prompt is `invalidated`.
    rewrite_pending: bool,
}

impl TemplateBuilder {
    pub fn new(format: Arc<TemplateFormat>) -> TemplateBuilder {
        let prompt = TemplatePrompt::new(
            Arc::clone(format.template()),
            Arc::clone(format.specials()),
            None,
            format.options(&Prefix::default()),
            format.policy(),
        );
        TemplateBuilder {
            format,
            prompt,
            prefix: Arc::new(Prefix::default()),
            turn_open: false,
            rewrite_pending: false,
        }
    }

    /// The prompt itself (its text, messages and probe verdict).
    pub fn template_prompt(&self) -> &TemplatePrompt {
        &self.prompt
    }
}

impl PromptBuilder for TemplateBuilder {
    fn boxed_clone(&self) -> Box<dyn PromptBuilder> {
        Box::new(self.clone())
    }

    fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        self.format.tokenizer()
    }

    fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    fn turn_open(&self) -> bool {
        self.turn_open
    }

    fn append(
        &mut self,
        prefix: Option<Prefix>,
        items: &[Item],
        open_turn: bool,
        _calls: &[OpenCall],
    ) -> Result<Appended> {
        self.format.specials().check_input(prefix.as_ref(), items)?;
        let invalidated = prefix.is_some() && !self.prompt.is_empty();
        if let Some(prefix) = prefix {
            self.prompt
                .set_prefix(prefix.instructions.as_deref(), self.format.options(&prefix));
            self.prefix = Arc::new(prefix);
        }
        self.prompt.push_items(self.format.template_items(items).iter());
        let rewrites = self.prompt.stats().rewrites;
        let kept = self.prompt.prompt(open_turn)?;
        let invalidated = invalidated || self.rewrite_pending || self.prompt.stats().rewrites > rewrites;
        self.rewrite_pending = false;
        self.turn_open = open_turn;
        Ok(Appended { kept, invalidated })
    }

    /// A message or tool output arriving in chunks.
    fn grow_last(&mut self, chunk: &str, _calls: &[OpenCall]) -> Result<usize> {
        if !self.prompt.grow_last(chunk) {
            return Err(Error::new(
                Code::InvalidValue,
                "append_text grows the last message's text, and the conversation does not end with one",
            ));
        }
        let kept = self.prompt.prompt(false)?;
        self.turn_open = false;
        Ok(self.prompt.len() - kept)
    }

    /// The items become the assistant message(s) and are rendered as the template renders
    /// them (verbatim mode keeps the sampled ids where the render agrees with them).
    fn append_output(
        &mut self,
        items: &[Item],
        sampled: &[u32],
        open_first: bool,
        _calls: &[OpenCall],
    ) -> Result<()> {
        if self.prompt.policy().verbatim {
            if open_first {
                self.prompt.prompt(true)?;
            }
            self.prompt.push_output(sampled);
        }
        self.prompt.push_items(self.format.template_items(items).iter());
        let rewrites = self.prompt.stats().rewrites;
        self.prompt.prompt(false)?;
        self.rewrite_pending |= self.prompt.stats().rewrites > rewrites;
        self.turn_open = false;
        Ok(())
    }

    fn prompt(&self) -> Prompt {
        Prompt {
            tokens: self.prompt.id_chunks().clone(),
        }
    }

    /// The render with `add_generation_prompt=True`.
    fn generation_prompt(&self, _calls: &[OpenCall]) -> Result<Prompt> {
        let mut prompt = self.prompt.clone();
        prompt.prompt(true)?;
        Ok(Prompt {
            tokens: prompt.id_chunks().clone(),
        })
    }

    /// The template's family, starting inside reasoning when the generation prompt
    /// opened it.
    fn parser(&self) -> Box<dyn OutputParser> {
        self.format.family().parser(
            Arc::clone(self.format.tokenizer()),
            self.format.stop_tokens().to_vec(),
            self.prompt.opens_reasoning(),
        )
    }

    fn len(&self) -> usize {
        self.prompt.len()
    }

    fn memory_bytes(&self) -> usize {
        size_of::<TemplateBuilder>() + self.prompt.memory_bytes(None)
    }

    fn unique_bytes(&self, base: Option<&dyn PromptBuilder>) -> usize {
        self.prompt
            .memory_bytes(same_kind::<TemplateBuilder>(base).map(|b| &b.prompt))
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        self.prompt.stats().pairs().to_vec()
    }

    fn reset_stats(&mut self) {
        self.prompt.reset_stats();
    }
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
