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
//! The part of a resent history the key has seen is recognized before it is parsed: the
//! raw bytes of each `input` element are hashed too, chained the same way from the
//! prefix's digest ([`raw_chain`]), and a key's [`SeenItems`] maps the raw address of a
//! request it served to the parsed address of the same items. A request whose leading
//! elements are, byte for byte, those of a request the key sent before has only the
//! elements after them decoded into items; the same items spelled another way miss here
//! and are matched by their parsed form, as before.
//!
//! The hash is XXH3-128 seeded once per process: the digests never leave the process, and
//! an item crafted to collide would have to guess the seed.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::OnceLock;

use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

use super::elements::{array_elements, span_of};
use super::field::offset_in;
use super::input::{parse_elements, parse_input, Input};
use super::values::Skip;
use super::{parse_request, CreateRequest, Limits};
use crate::error::{Code, Error, Result};
use crate::item::{Item, Prefix};

/// A 128-bit content address.
pub type Digest = u128;

/// The digests of a request's history: its prefix's, and each parsed input item's own
/// (not yet chained: a continuation chains them after its parent's digest).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct History {
    pub prefix: Digest,
    /// The items the key's [`SeenItems`] recognized by their bytes: the request's first
    /// `seen.items` items, not parsed (none when `seen.items` is 0).
    pub seen: Seen,
    /// The digests of the items after those.
    pub items: Vec<Digest>,
    /// Where the elements recognized by their bytes lie in the array's text (empty when
    /// none were): their values were checked when the key sent them, and are not read
    /// again ([`super::values::check_values_except`]).
    pub seen_bytes: Range<usize>,
    /// The raw address of the whole input ([`raw_chain`]'s last) and its count of
    /// elements, when it was computed (an `input` array parsed with a [`SeenItems`]):
    /// what [`SeenItems::remember`] keeps.
    pub raw: Option<(Digest, usize)>,
}

impl History {
    pub fn of(prefix: &Prefix, items: &[Item]) -> History {
        let prefix = prefix_digest(prefix);
        History {
            prefix,
            seen: Seen::nothing(prefix),
            items: items.iter().map(item_digest).collect(),
            seen_bytes: 0..0,
            raw: None,
        }
    }

    /// The chained digests after each parsed item, starting from `start` (when None: the
    /// digest after the items seen, the prefix's when none were): `items + 1` digests,
    /// `start` first.
    pub fn chained(&self, start: Option<Digest>) -> Vec<Digest> {
        let mut at = start.unwrap_or(self.seen.digest);
        let mut out = Vec::with_capacity(self.items.len() + 1);
        out.push(at);
        for item in &self.items {
            at = chain(at, *item);
            out.push(at);
        }
        out
    }
}

/// What the leading elements of an `input` (or `messages`) array stand for once parsed:
/// how many elements, how many items they became, and the digest after those items.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Seen {
    pub elements: usize,
    pub items: usize,
    pub digest: Digest,
}

impl Seen {
    /// No element: the prefix alone.
    pub fn nothing(prefix: Digest) -> Seen {
        Seen {
            elements: 0,
            items: 0,
            digest: prefix,
        }
    }
}

/// Raw addresses the key remembers at most; past it they are all forgotten (a miss
/// parses everything, as without them).
const MAX_SEEN: usize = 1 << 16;

/// One API key's raw addresses: the raw address of each request whose prompt state the
/// key's cache holds, with what its elements stand for parsed. Only requests that were
/// served are remembered (their items parsed and checked then, under the same limits:
/// the same bytes would parse and check the same), and an address is forgotten with the
/// state it names ([`SeenItems::forget`]), so a hit names a state the cache held when the
/// request was parsed.
#[derive(Debug, Default)]
pub struct SeenItems {
    raw: HashMap<Digest, Seen>,
    /// The raw addresses naming each parsed address.
    states: HashMap<Digest, Vec<Digest>>,
}

impl SeenItems {
    /// Remember a served request's raw address (when it has one, see [`History::raw`]).
    /// Returns whether it did. A refused request is not remembered: the bytes of what is
    /// remembered are not checked again ([`History::seen_bytes`]).
    pub fn remember(&mut self, request: &CreateRequest) -> bool {
        let history = &request.history;
        let (None, Some((raw, elements))) = (&request.error, history.raw) else {
            return false;
        };
        if self.raw.len() >= MAX_SEEN {
            self.raw.clear();
            self.states.clear();
        }
        let seen = Seen {
            elements,
            items: history.seen.items + history.items.len(),
            digest: *history.chained(None).last().expect("the start is first"),
        };
        if let Some(old) = self.raw.insert(raw, seen) {
            if old.digest != seen.digest {
                self.unlink(old.digest, raw);
            }
        }
        let names = self.states.entry(seen.digest).or_default();
        if !names.contains(&raw) {
            names.push(raw);
        }
        true
    }

    fn unlink(&mut self, digest: Digest, raw: Digest) {
        if let Some(names) = self.states.get_mut(&digest) {
            names.retain(|name| *name != raw);
            if names.is_empty() {
                self.states.remove(&digest);
            }
        }
    }

    /// Forget every raw address of the state at parsed address `digest` (it left the
    /// cache).
    pub fn forget(&mut self, digest: Digest) {
        for raw in self.states.remove(&digest).unwrap_or_default() {
            self.raw.remove(&raw);
        }
    }

    /// The longest run of leading elements remembered: `chain` is [`raw_chain`]'s.
    pub fn longest(&self, chain: &[Digest]) -> Option<Seen> {
        chain
            .iter()
            .enumerate()
            .skip(1)
            .rev()
            .find_map(|(elements, raw)| self.raw.get(raw).filter(|seen| seen.elements == elements))
            .copied()
    }

    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    pub fn clear(&mut self) {
        self.raw.clear();
        self.states.clear();
    }
}

/// The raw address of the fields a chat request's prefix is read from beside its first
/// message (`tools`, `reasoning_effort`), as sent (None: absent): [`raw_chain`]'s start.
pub fn raw_fields_digest(fields: &[Option<&str>]) -> Digest {
    let mut hasher = Fields::new(8);
    for field in fields {
        hasher.optional(*field);
    }
    hasher.digest()
}

/// The raw addresses of an array's elements after a prefix with digest `prefix`: one
/// after each element (its bytes as sent, hashed, not parsed), `elements.len() + 1`
/// digests, the start first. `kind` keeps a Responses `input` and a chat `messages` apart.
pub fn raw_chain(kind: u8, prefix: Digest, elements: &[&str]) -> Vec<Digest> {
    let mut start = Xxh3::with_seed(seed());
    start.update(&[6, kind]);
    start.update(&prefix.to_le_bytes());
    let mut at = start.digest128();
    let mut out = Vec::with_capacity(elements.len() + 1);
    out.push(at);
    for element in elements {
        let bytes = element.as_bytes();
        let mut hasher = Xxh3::with_seed(seed());
        hasher.update(&[7]);
        hasher.update(&at.to_le_bytes());
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
        at = hasher.digest128();
        out.push(at);
    }
    out
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

/// [`raw_chain`]'s kind of a Responses `input` array.
const INPUT: u8 = 1;

/// A request's `input` parsed with its history's digests. With `seen` (the key's, for a
/// request that continues no response or conversation), an `input` array's leading
/// elements that a request the key sent before had, byte for byte, are recognized and
/// not parsed (the module's docs); anything else is parsed whole, as without it.
pub(super) fn parse_history(
    raw: Option<&RawValue>,
    prefix: &Prefix,
    limits: &Limits,
    seen: Option<&SeenItems>,
) -> Result<(Input, History)> {
    let whole = || -> Result<(Input, History)> {
        let input = parse_input(raw, limits)?;
        let history = History::of(prefix, &input.items);
        Ok((input, history))
    };
    let (Some(seen), Some(raw)) = (seen, raw) else {
        return whole();
    };
    // A string input (or anything else that is not an array) has no elements.
    let Some(elements) = array_elements(raw.get()) else {
        return whole();
    };
    let prefix_digest = prefix_digest(prefix);
    let chain = raw_chain(INPUT, prefix_digest, &elements);
    let found = seen.longest(&chain).filter(|found| found.items == found.elements);
    // The elements after those seen, parsed on their own; an error is the whole parse's
    // (the same message and place a request never seen gets).
    let tail = found.and_then(|found| Some((found, parse_elements(&elements, found.elements, limits).ok()?)));
    let (input, mut history) = match tail {
        Some((found, input)) => {
            let items = input.items.iter().map(item_digest).collect();
            let history = History {
                prefix: prefix_digest,
                seen: found,
                items,
                seen_bytes: span_of(raw.get(), &elements[..found.elements]),
                raw: None,
            };
            (input, history)
        }
        None => whole()?,
    };
    history.raw = chain.last().map(|raw| (*raw, elements.len()));
    Ok((input, history))
}

/// The elements of a request's `input` or `messages` (`array`, a slice of `frame`) that
/// were recognized by their bytes, as the span of `frame` its check of values passes over.
/// `seen` are the elements, `bytes` where they lie in the array's text.
pub(super) fn seen_skip(
    frame: &str,
    array: Option<&RawValue>,
    seen: &Seen,
    bytes: &Range<usize>,
) -> Option<Skip> {
    let array = array?.get();
    let start = offset_in(frame, array)?;
    (bytes.end <= array.len() && seen.elements > 0).then(|| Skip {
        bytes: start + bytes.start..start + bytes.end,
        elements: seen.elements,
    })
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
        assert_ne!(a.history.chained(None), b.history.chained(None));
        let tools = request(r#"{"instructions":"x","input":"hi","tools":[{"type":"function","name":"f"}]}"#);
        assert_ne!(a.history.prefix, tools.history.prefix);
    }

    #[test]
    fn a_continuation_chains_from_its_parent() {
        let first = request(r#"{"input":[{"role":"user","content":"a"}]}"#);
        let both = request(r#"{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#);
        let second = request(r#"{"input":[{"role":"user","content":"b"}]}"#);
        let parent = *first.history.chained(None).last().unwrap();
        assert_eq!(
            second.history.chained(Some(parent)).last(),
            both.history.chained(None).last()
        );
        assert_eq!(both.history.chained(None)[0], both.history.prefix);
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
    fn seen_request(body: &str, seen: &SeenItems) -> crate::validate::CreateRequest {
        let request =
            crate::validate::parse_request_seen(body.as_bytes(), &Limits::default(), Some(seen)).unwrap();
        assert!(request.error.is_none(), "{:?}", request.error);
        request
    }

    fn last(request: &crate::validate::CreateRequest) -> Digest {
        *request.history.chained(None).last().unwrap()
    }

    const TWO: &str = r#"{"instructions":"x","input":[{"role":"user","content":"a"}, {"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}"#;
    const THREE: &str = r#"{"instructions":"x","input":[{"role":"user","content":"a"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
        {"type":"function_call_output","call_id":"c","output":"ok"}]}"#;

    #[test]
    fn leading_elements_seen_before_are_not_parsed() {
        let mut seen = SeenItems::default();
        let first = seen_request(TWO, &seen);
        assert_eq!(first.history.seen.items, 0);
        assert!(seen.remember(&first));
        let again = seen_request(TWO, &seen);
        assert_eq!((again.history.seen.items, again.input.items.len()), (2, 0));
        assert_eq!(last(&again), last(&request(TWO)));
        let longer = seen_request(THREE, &seen);
        assert_eq!((longer.history.seen.items, longer.input.items.len()), (2, 1));
        assert_eq!(longer.input.offset, 2);
        assert_eq!(last(&longer), last(&request(THREE)));
        assert_eq!(longer.tail(2).input.items, request(THREE).input.items[2..]);
    }

    #[test]
    fn other_bytes_or_another_prefix_are_parsed_whole() {
        let mut seen = SeenItems::default();
        seen.remember(&seen_request(TWO, &seen));
        // The same items spelled another way (whitespace, key order), another prefix:
        // parsed whole, with the same digests as a full parse.
        for body in [
            TWO.replace(r#""content":"a""#, r#""content": "a""#),
            TWO.replace(
                r#"{"role":"user","content":"a"}"#,
                r#"{"content":"a","role":"user"}"#,
            ),
            TWO.replace(r#""instructions":"x""#, r#""instructions":"y""#),
            TWO.replace(
                r#""instructions":"x","#,
                r#""instructions":"x","tools":[{"type":"function","name":"f"}],"#,
            ),
        ] {
            let request_seen = seen_request(&body, &seen);
            assert_eq!(request_seen.history.seen.items, 0, "{body}");
            assert_eq!(last(&request_seen), last(&request(&body)));
        }
        // Only the whitespace between elements differs: the elements are the same bytes.
        let spaced = seen_request(&TWO.replace("}, {", "},\n  {"), &seen);
        assert_eq!(spaced.history.seen.items, 2);
    }

    #[test]
    fn a_forgotten_state_is_parsed_whole() {
        let mut seen = SeenItems::default();
        let first = seen_request(TWO, &seen);
        seen.remember(&first);
        seen.forget(last(&first));
        assert!(seen.is_empty());
        assert_eq!(seen_request(THREE, &seen).history.seen.items, 0);
    }

    #[test]
    fn an_error_after_the_seen_items_is_a_full_parse_error() {
        let mut seen = SeenItems::default();
        seen.remember(&seen_request(TWO, &seen));
        for bad in [r#"{"type":"nope"}"#, "3", r#"{"role":"user","content":7}"#] {
            let body = THREE.replace(
                r#"{"type":"function_call_output","call_id":"c","output":"ok"}"#,
                bad,
            );
            let limits = Limits::default();
            let with = crate::validate::parse_request_seen(body.as_bytes(), &limits, Some(&seen)).unwrap();
            let without = parse_request(body.as_bytes(), &limits).unwrap();
            assert!(with.error.is_some());
            assert_eq!(with.error, without.error, "{bad}");
        }
    }

    #[test]
    fn a_continuation_is_never_recognized() {
        let mut seen = SeenItems::default();
        seen.remember(&seen_request(TWO, &seen));
        let body = TWO.replace(
            r#"{"instructions""#,
            r#"{"previous_response_id":"resp_1","instructions""#,
        );
        let continued = seen_request(&body, &seen);
        assert_eq!((continued.history.seen.items, continued.history.raw), (0, None));
    }
    fn chat(body: &str, seen: &SeenItems) -> crate::validate::CreateRequest {
        let limits = Limits::default();
        let request = crate::validate::parse_chat_request_seen(body.as_bytes(), &limits, Some(seen))
            .unwrap()
            .request;
        assert!(request.error.is_none(), "{:?}", request.error);
        let whole = crate::validate::parse_chat_request(body.as_bytes(), &limits)
            .unwrap()
            .request;
        assert_eq!(last(&request), last(&whole));
        assert_eq!(request.prefix, whole.prefix);
        assert_eq!(
            request.input.items,
            whole.input.items[request.history.seen.items..]
        );
        request
    }

    #[test]
    fn chat_messages_seen_before_are_not_parsed() {
        let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{}}}]"#;
        let first = format!(
            r#"{{{tools},"messages":[{{"role":"system","content":"x"}},{{"role":"user","content":"a"}}]}}"#
        );
        let reply = r#"{"role":"assistant","content":null,"reasoning":"r","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#;
        let second = first.replace(
            r#""content":"a"}]"#,
            &format!(r#""content":"a"}},{reply},{{"role":"tool","tool_call_id":"c","content":"ok"}}]"#),
        );
        let mut seen = SeenItems::default();
        seen.remember(&chat(&first, &seen));
        let continued = chat(&second, &seen);
        // Two messages (the system one is the instructions): one item; the reply is two.
        assert_eq!(
            (continued.history.seen.items, continued.input.items.len()),
            (1, 3)
        );
        assert_eq!(continued.prefix.instructions.as_deref(), Some("x"));
        seen.remember(&continued);
        assert_eq!(chat(&second, &seen).history.seen.items, 4);
        // Other tools, another system message, another spelling: parsed whole.
        for other in [
            second.replace(r#""name":"f","parameters""#, r#""name":"g","parameters""#),
            second.replace(r#""content":"x""#, r#""content":"y""#),
            second.replace(
                r#"{"role":"user","content":"a"}"#,
                r#"{"content":"a","role":"user"}"#,
            ),
        ] {
            assert_eq!(chat(&other, &seen).history.seen.items, 0, "{other}");
        }
    }

    #[test]
    fn a_value_refused_after_the_seen_elements_is_refused_where_it_is() {
        let mut seen = SeenItems::default();
        seen.remember(&seen_request(TWO, &seen));
        let limits = Limits::default();
        for (bad, param) in [
            (
                r#"{"type":"function_call_output","call_id":"c","output":"ok","zz":1e999}"#,
                "input[2].zz",
            ),
            (
                r#"{"type":"function_call_output","call_id":"c","output":"\ud800"}"#,
                "input[2].output",
            ),
        ] {
            let body = THREE.replace(
                r#"{"type":"function_call_output","call_id":"c","output":"ok"}"#,
                bad,
            );
            let with = crate::validate::parse_request_seen(body.as_bytes(), &limits, Some(&seen)).unwrap();
            let without = parse_request(body.as_bytes(), &limits).unwrap();
            let error = with.error.expect(bad);
            assert_eq!(
                (error.code, error.param.as_deref()),
                (Code::InvalidValue, Some(param))
            );
            assert_eq!(Some(error), without.error, "{bad}");
        }
        // Outside the input, after it: refused too.
        let body = THREE.replace(r#"]}"#, r#"],"metadata":{"n":1e999}}"#);
        let with = crate::validate::parse_request_seen(body.as_bytes(), &limits, Some(&seen)).unwrap();
        assert_eq!(with.error.and_then(|e| e.param).as_deref(), Some("metadata.n"));
    }

    #[test]
    fn a_chat_value_refused_after_the_seen_messages_is_refused_where_it_is() {
        let first = r#"{"messages":[{"role":"user","content":"a"}, {"role":"user","content":"b"}]}"#;
        let mut seen = SeenItems::default();
        seen.remember(&chat(first, &seen));
        let body = first.replace(r#"}]}"#, r#"},{"role":"user","content":"c","zz":-1e999}]}"#);
        let limits = Limits::default();
        let with = crate::validate::parse_chat_request_seen(body.as_bytes(), &limits, Some(&seen)).unwrap();
        let error = with.request.error.expect("refused");
        assert_eq!(error.param.as_deref(), Some("messages[2].zz"));
    }
}
