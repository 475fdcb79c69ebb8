//! Content addresses of a conversation's history: a digest of each item's canonical form
//! (the [`Item`] it parses to, which is all a chat format renders) and of the request's
//! [`Prefix`], chained so that the digest after item `k` names the prefix and every item
//! up to `k`, in order.
//!
//! The server keys rendered states by these chained digests, so a request that resends
//! its whole history finds the longest state it extends without comparing (or
//! rendering) the history again. Two requests whose items parse to the same items get the
//! same digests, whatever their JSON spelling (key order, whitespace, escapes, a string
//! `input` or the message it stands for). A replayed model output matches the response
//! that produced it when it parses to the item that response's `output` holds
//! ([`output_digests`] of that `output`).
//!
//! The hash is XXH3-128 seeded once per process: the digests never leave the process, and
//! an item crafted to collide would have to guess the seed.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;

use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

use super::{parse_request, Limits};
use crate::error::{Code, Error, Result};
use crate::item::{Item, Prefix};

/// A 128-bit content address.
pub type Digest = u128;

/// The digests of a request's history: its prefix's, and each input item's own (not yet
/// chained: a continuation chains them after its parent's digest).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct History {
    pub prefix: Digest,
    pub items: Vec<Digest>,
}

impl History {
    pub fn of(prefix: &Prefix, items: &[Item]) -> History {
        History {
            prefix: prefix_digest(prefix),
            items: items.iter().map(item_digest).collect(),
        }
    }

    /// The chained digests after each item from `first` on, starting from `start` (the
    /// prefix's digest when None): `len - first + 1` digests, `start` first.
    pub fn chained(&self, start: Option<Digest>, first: usize) -> Vec<Digest> {
        let mut at = start.unwrap_or(self.prefix);
        let rest = self.items.get(first..).unwrap_or(&[]);
        let mut out = Vec::with_capacity(rest.len() + 1);
        out.push(at);
        for item in rest {
            at = chain(at, *item);
            out.push(at);
        }
        out
    }
}

fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    // RandomState draws its keys from the OS once per process (then per thread).
    *SEED.get_or_init(|| RandomState::new().hash_one(0x68_6f_74_6c_6f_6f_70u64))
}

/// A hasher over length-prefixed fields, so that no two different field lists feed it
/// the same bytes.
struct Fields(Xxh3);

impl Fields {
    fn new(tag: u8) -> Fields {
        let mut hasher = Xxh3::with_seed(seed());
        hasher.update(&[tag]);
        Fields(hasher)
    }

    fn text(&mut self, text: &str) -> &mut Self {
        self.0.update(&(text.len() as u64).to_le_bytes());
        self.0.update(text.as_bytes());
        self
    }

    fn optional(&mut self, text: Option<&str>) -> &mut Self {
        match text {
            None => self.0.update(&[0]),
            Some(text) => {
                self.0.update(&[1]);
                self.text(text);
            }
        }
        self
    }

    fn digest(&self) -> Digest {
        self.0.digest128()
    }
}

/// The digest of one item's canonical form.
pub fn item_digest(item: &Item) -> Digest {
    match item {
        Item::Message { role, text } => Fields::new(1).text(role.as_str()).text(text).digest(),
        Item::FunctionCall {
            call_id,
            name,
            arguments,
        } => Fields::new(2).text(call_id).text(name).text(arguments).digest(),
        Item::FunctionCallOutput { call_id, output } => Fields::new(3).text(call_id).text(output).digest(),
        Item::Reasoning { text } => Fields::new(4).text(text).digest(),
    }
}

/// The digest of what a format renders before the items: instructions, function tools
/// (a schema's keys in their order, which the render keeps), namespaces, reasoning effort.
pub fn prefix_digest(prefix: &Prefix) -> Digest {
    let mut fields = Fields::new(5);
    fields.optional(prefix.instructions.as_deref());
    fields.text(&prefix.tools.len().to_string());
    for tool in &prefix.tools {
        fields
            .text(&tool.name)
            .optional(tool.description.as_deref())
            .text(&tool.parameters.to_string())
            .text(if tool.strict { "strict" } else { "" });
    }
    fields.text(&prefix.namespaces.len().to_string());
    for namespace in &prefix.namespaces {
        fields
            .text(&namespace.name)
            .optional(namespace.description.as_deref());
    }
    fields.optional(prefix.reasoning_effort.as_deref());
    fields.digest()
}

/// The digest after `item` of a history whose digest was `at`.
pub fn chain(at: Digest, item: Digest) -> Digest {
    let mut hasher = Xxh3::with_seed(seed());
    hasher.update(&at.to_le_bytes());
    hasher.update(&item.to_le_bytes());
    hasher.digest128()
}

/// The digests of a response's `output` items (a JSON array, as the server sent it),
/// parsed as input items are: what a client replaying that output must match.
pub fn output_digests(output_json: &str) -> Result<Vec<Digest>> {
    serde_json::from_str::<&RawValue>(output_json)
        .map_err(|_| Error::new(Code::InvalidJson, "output_json is not one JSON value"))?;
    let request = parse_request(
        format!("{{\"input\":{output_json}}}").as_bytes(),
        &Limits::default(),
    )?;
    match request.error {
        Some(error) => Err(error),
        None => Ok(request.history.items),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Role;

    fn request(body: &str) -> crate::validate::CreateRequest {
        let request = parse_request(body.as_bytes(), &Limits::default()).unwrap();
        assert!(request.error.is_none(), "{:?}", request.error);
        request
    }

    #[test]
    fn the_spelling_of_an_item_does_not_change_its_digest() {
        let a = request(r#"{"input":[{"type":"message","role":"user","content":"hi"}]}"#);
        let b = request(
            r#"{"input": [ {"content": [{"type": "input_text", "text": "h\u0069"}], "role": "user"} ]}"#,
        );
        let c = request(r#"{"input":"hi"}"#);
        assert_eq!(a.history, b.history);
        assert_eq!(a.history, c.history);
    }

    #[test]
    fn a_different_field_changes_the_digest() {
        let item = |role, text: &str| {
            item_digest(&Item::Message {
                role,
                text: text.to_string(),
            })
        };
        assert_ne!(item(Role::User, "hi"), item(Role::Assistant, "hi"));
        assert_ne!(item(Role::User, "hi"), item(Role::User, "hi "));
        // Length prefixes: moving bytes from one field to the next is a different item.
        let call = |id: &str, name: &str| {
            item_digest(&Item::FunctionCall {
                call_id: id.to_string(),
                name: name.to_string(),
                arguments: "{}".to_string(),
            })
        };
        assert_ne!(call("ab", "c"), call("a", "bc"));
    }

    #[test]
    fn the_prefix_heads_the_chain() {
        let a = request(r#"{"instructions":"x","input":"hi"}"#);
        let b = request(r#"{"instructions":"y","input":"hi"}"#);
        assert_eq!(a.history.items, b.history.items);
        assert_ne!(a.history.chained(None, 0), b.history.chained(None, 0));
        let tools = request(r#"{"instructions":"x","input":"hi","tools":[{"type":"function","name":"f"}]}"#);
        assert_ne!(a.history.prefix, tools.history.prefix);
    }

    #[test]
    fn a_continuation_chains_from_its_parent() {
        let first = request(r#"{"input":[{"role":"user","content":"a"}]}"#);
        let both = request(r#"{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#);
        let second = request(r#"{"input":[{"role":"user","content":"b"}]}"#);
        let parent = *first.history.chained(None, 0).last().unwrap();
        assert_eq!(
            second.history.chained(Some(parent), 0).last(),
            both.history.chained(None, 0).last()
        );
        assert_eq!(both.history.chained(None, 1)[0], both.history.prefix);
    }

    #[test]
    fn a_replayed_output_matches_the_output_sent() {
        let output = r#"[{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},
            {"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}","status":"completed"}]"#;
        let replayed = request(
            r#"{"input":[{"content":[{"text":"think","type":"reasoning_text"}],"type":"reasoning","summary":[]},
            {"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"}]}"#,
        );
        assert_eq!(output_digests(output).unwrap(), replayed.history.items);
    }
}
