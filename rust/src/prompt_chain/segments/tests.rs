//! The cache against a from-scratch render, under a small test-only chat format that has
//! every shape a real one has: specials between items, a run left open across segments
//! (`\n` after `<|end|>`, grouped tool results, reasoning written as plain text), encoded
//! fragments, an open run after the generation header, and a normalised stop token.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::format::chatml::tests::{chatml, tokenize_template};
use crate::format::transcript::{self, golden, GoldenCase};
use crate::format::{Outcome, OutputParser, ParseEvent};
use crate::item::{ItemKind, Role, Tool};
use crate::prompt_chain::{Checkpoint, Conversation, Delta};
use crate::tokenizer::{self, Tokenizer};
use crate::validate::{self, CreateRequest, Limits, Policy};

const START: u32 = 200_006;
const END: u32 = 200_007;
const MESSAGE: u32 = 200_008;
const CALL: u32 = 200_012;
const RETURN: u32 = 200_002;

struct Mock {
    tokenizer: Arc<dyn Tokenizer>,
}

fn mock() -> Arc<dyn ChatFormat> {
    Arc::new(Mock {
        tokenizer: tokenizer::by_name("o200k_harmony").unwrap(),
    })
}

impl Mock {
    fn close_group(ctx: &Context, r: &mut Renderer) {
        if ctx.prev == Some(ItemKind::FunctionCallOutput) {
            r.special(END);
            r.text("\n");
        }
    }
}

impl ChatFormat for Mock {
    fn name(&self) -> &str {
        "mock"
    }
    fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }
    fn render_prefix(&self, prefix: &Prefix, r: &mut Renderer) {
        if prefix.instructions.is_none() && prefix.tools.is_empty() {
            return;
        }
        r.special(START);
        r.text("system\n");
        r.text(prefix.instructions.as_deref().unwrap_or(""));
        for tool in &prefix.tools {
            r.text(&format!("\ntool {}", tool.name));
        }
        r.special(END);
        r.text("\n");
    }
    fn render_item(&self, ctx: &Context, item: &Item, r: &mut Renderer) {
        if !matches!(item, Item::FunctionCallOutput { .. }) {
            Self::close_group(ctx, r);
        }
        match item {
            Item::Message { role, text } => {
                r.special(START);
                r.text(role.as_str());
                r.special(MESSAGE);
                r.text(text);
                r.special(END);
                r.text("\n");
            }
            Item::FunctionCall { name, arguments, .. } => {
                r.special(START);
                r.text(&format!("assistant to={name}"));
                r.special(MESSAGE);
                r.fragment(arguments);
                r.special(CALL);
            }
            Item::FunctionCallOutput { call_id, output } => {
                if ctx.prev != Some(ItemKind::FunctionCallOutput) {
                    r.special(START);
                    r.text("tool");
                    r.special(MESSAGE);
                }
                let name = (ctx.call_name)(call_id).unwrap_or_default();
                r.text(&format!("<out {name}>{output}</out>"));
            }
            Item::Reasoning { text } => r.text(&format!("<think>{text}</think>")),
        }
    }
    fn render_generation_header(&self, ctx: &Context, r: &mut Renderer) {
        Self::close_group(ctx, r);
        r.special(START);
        r.text("assistant\n");
    }
    fn render_output(&self, sampled: &[u32], r: &mut Renderer) {
        match sampled.split_last() {
            Some((&RETURN, body)) => {
                r.ids(body);
                r.special(END);
            }
            _ => r.ids(sampled),
        }
        r.text("\n");
    }
    fn stop_tokens(&self) -> &[u32] {
        &[RETURN, CALL]
    }
    fn parser(&self) -> Box<dyn OutputParser> {
        Box::new(MockParser {
            tokenizer: Arc::clone(&self.tokenizer),
            bytes: Vec::new(),
            items: Vec::new(),
            stopped: false,
            fed: 0,
        })
    }
    fn render_completion(&self, items: &[Item], r: &mut Renderer) {
        for item in items {
            match item {
                Item::FunctionCall { name, arguments, .. } => {
                    r.fragment(&format!("{name} {arguments}"));
                    r.special(CALL);
                }
                Item::Message { text, .. } => {
                    r.fragment(text);
                    r.special(RETURN);
                }
                _ => {}
            }
        }
    }
}

/// Call ids minted by the mock parser, unique like a real parser's.
static CALL_IDS: AtomicU64 = AtomicU64::new(0);

/// Text until `<|return|>` is a message; `name args` until `<|call|>` is a call.
struct MockParser {
    tokenizer: Arc<dyn Tokenizer>,
    bytes: Vec<u8>,
    items: Vec<Item>,
    stopped: bool,
    fed: usize,
}

impl OutputParser for MockParser {
    fn feed(&mut self, id: u32, _out: &mut Vec<ParseEvent>) {
        if self.stopped {
            return;
        }
        self.fed += 1;
        let text = String::from_utf8_lossy(&self.bytes).into_owned();
        match id {
            RETURN => {
                self.items.push(Item::Message {
                    role: Role::Assistant,
                    text,
                });
                self.stopped = true;
            }
            CALL => {
                let (name, arguments) = text.split_once(' ').unwrap_or((&text, ""));
                self.items.push(Item::FunctionCall {
                    call_id: format!("call_{}", CALL_IDS.fetch_add(1, Ordering::Relaxed)),
                    name: name.to_owned(),
                    arguments: arguments.to_owned(),
                });
                self.stopped = true;
            }
            _ => self.bytes.extend_from_slice(self.tokenizer.token_bytes(id)),
        }
    }
    fn finish(&mut self, _out: &mut Vec<ParseEvent>) -> Outcome {
        if self.stopped {
            Outcome::Stopped
        } else {
            Outcome::Truncated
        }
    }
    fn items(&self) -> &[Item] {
        &self.items
    }
    fn stopped(&self) -> bool {
        self.stopped
    }
    fn output_tokens(&self) -> usize {
        self.fed
    }
    fn reasoning_tokens(&self) -> usize {
        0
    }
}

/// The segment builder a conversation of these tests holds.
fn builder(conv: &Conversation) -> &SegmentBuilder {
    (conv.state.builder.as_ref() as &dyn Any)
        .downcast_ref()
        .expect("a conversation of segments")
}

/// A conversation as a list, rendered from scratch: the reference.
#[derive(Clone, Default, Debug)]
struct Model {
    /// A conversation renders nothing, not even its prefix, until its first append.
    started: bool,
    prefix: Prefix,
    entries: Vec<Entry>,
    open_turn: bool,
    open_calls: Vec<String>,
}

#[derive(Clone, Debug)]
enum Entry {
    Item(Item),
    Header,
    Output(Vec<u32>, Item),
}

impl Model {
    fn render(&self, format: &dyn ChatFormat) -> Vec<u32> {
        if !self.started {
            return Vec::new();
        }
        let mut r = Renderer::new(format.tokenizer().as_ref());
        format.render_prefix(&self.prefix, &mut r);
        let mut names: HashMap<String, String> = HashMap::new();
        let mut prev = None;
        for entry in &self.entries {
            let lookup = |id: &str| names.get(id).cloned();
            let ctx = Context {
                prev,
                call_name: &lookup,
            };
            let item = match entry {
                Entry::Item(item) => {
                    format.render_item(&ctx, item, &mut r);
                    item
                }
                Entry::Header => {
                    format.render_generation_header(&ctx, &mut r);
                    continue;
                }
                Entry::Output(ids, item) => {
                    format.render_output(ids, &mut r);
                    item
                }
            };
            if let Item::FunctionCall { call_id, name, .. } = item {
                names.insert(call_id.clone(), name.clone());
            }
            prev = Some(item.kind());
        }
        if self.open_turn {
            let lookup = |id: &str| names.get(id).cloned();
            let ctx = Context {
                prev,
                call_name: &lookup,
            };
            format.render_generation_header(&ctx, &mut r);
        }
        r.finish()
    }

    fn add_items(&mut self, items: &[Item]) {
        self.started = true;
        self.open_turn = false;
        for item in items {
            match item {
                Item::FunctionCall { call_id, .. } => self.open_calls.push(call_id.clone()),
                Item::FunctionCallOutput { call_id, .. } => self.open_calls.retain(|c| c != call_id),
                _ => {}
            }
            self.entries.push(Entry::Item(item.clone()));
        }
    }
}

fn text() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just(" ".to_string()),
        Just("  ".to_string()),
        Just("\n".to_string()),
        Just("'ll".to_string()),
        Just("日本".to_string()),
        Just("🦀".to_string()),
        Just("<|end|>".to_string()),
        Just("{\"a\": 1}".to_string()),
        "[a-zA-Z]{1,8}",
        "[0-9]{1,7}",
        "[ !-/:-@]{1,4}",
    ];
    let short = prop::collection::vec(atoms, 0..10).prop_map(|v| v.concat());
    // Some long enough to be kept deflated (`kept::PACK_FROM`), read back on re-renders.
    prop_oneof![4 => short.clone(), 1 => short.prop_map(|t| t.repeat(80))]
}

/// Items before open calls are known; `Answer` becomes a tool output for an open call.
#[derive(Clone, Debug)]
enum ItemSeed {
    Message(u8, String),
    Call(String, String),
    Answer(String),
    Reasoning(String),
}

fn item_seed() -> impl Strategy<Value = ItemSeed> {
    prop_oneof![
        3 => (0u8..3, text()).prop_map(|(r, t)| ItemSeed::Message(r, t)),
        1 => ("[a-z]{1,6}", text()).prop_map(|(n, a)| ItemSeed::Call(n, a)),
        2 => text().prop_map(ItemSeed::Answer),
        1 => text().prop_map(ItemSeed::Reasoning),
    ]
}

fn resolve(seeds: &[ItemSeed], model: &Model, serial: &mut usize) -> Vec<Item> {
    let mut open = model.open_calls.clone();
    seeds
        .iter()
        .map(|seed| match seed {
            ItemSeed::Message(r, text) => Item::Message {
                role: [Role::User, Role::Developer, Role::Assistant][*r as usize],
                text: text.clone(),
            },
            ItemSeed::Call(name, arguments) => {
                *serial += 1;
                let call_id = format!("c{serial}");
                open.push(call_id.clone());
                Item::FunctionCall {
                    call_id,
                    name: name.clone(),
                    arguments: arguments.clone(),
                }
            }
            ItemSeed::Answer(output) if !open.is_empty() => Item::FunctionCallOutput {
                call_id: open.remove(0),
                output: output.clone(),
            },
            ItemSeed::Answer(text) | ItemSeed::Reasoning(text) => Item::Reasoning { text: text.clone() },
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<ItemSeed>),
    Extend(u8, Vec<ItemSeed>),
    Text(String),
    Answer(bool, String),
    Checkpoint,
    Fork(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(item_seed(), 0..4).prop_map(Op::Append),
        3 => (0u8..3, prop::collection::vec(item_seed(), 0..3)).prop_map(|(p, s)| Op::Extend(p, s)),
        3 => text().prop_map(Op::Text),
        2 => (any::<bool>(), text()).prop_map(|(c, t)| Op::Answer(c, t)),
        1 => Just(Op::Checkpoint),
        1 => (0usize..8).prop_map(Op::Fork),
    ]
}

fn prefix(choice: u8) -> Prefix {
    match choice {
        0 => Prefix::default(),
        1 => Prefix {
            instructions: Some("Be brief.".into()),
            ..Prefix::default()
        },
        _ => Prefix {
            instructions: Some("Use tools.".into()),
            tools: vec![Tool {
                name: "exec".into(),
                description: None,
                parameters: serde_json::json!({"type": "object"}),
                strict: false,
            }],
            namespaces: Vec::new(),
            reasoning_effort: None,
        },
    }
}

fn run_ops(format: Arc<dyn ChatFormat>, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let mut conv = Conversation::new(SegmentBuilder::new(Arc::clone(&format)), 1_000_000);
    let mut model = Model::default();
    let mut saved: Vec<(Checkpoint, Model)> = Vec::new();
    let mut serial = 0;
    for op in ops {
        match op {
            Op::Append(seeds) => {
                let items = resolve(&seeds, &model, &mut serial);
                conv.append_items(items.clone(), None).unwrap();
                model.add_items(&items);
            }
            Op::Extend(p, seeds) => {
                let items = resolve(&seeds, &model, &mut serial);
                let delta = Delta {
                    prefix: prefix(p),
                    items: items.clone(),
                    max_output_tokens: Some(16),
                };
                let before = conv.prompt();
                let turn = conv.extend(delta).unwrap();
                let changed = model.prefix != prefix(p);
                let had_history = !model.entries.is_empty();
                model.add_items(&items);
                model.prefix = prefix(p);
                model.open_turn = true;
                prop_assert_eq!(turn.prompt_tokens, conv.token_count());
                prop_assert!(turn.cached_tokens <= before.common_prefix_len(&conv.prompt()));
                prop_assert_eq!(turn.invalidated, changed && had_history);
                if turn.invalidated {
                    prop_assert_eq!(turn.cached_tokens, 0);
                }
            }
            Op::Text(chunk) => {
                let result = conv.append_text(&chunk);
                match model.entries.last_mut() {
                    Some(Entry::Item(item)) => {
                        let changed = result.unwrap();
                        *item = grown(item, &chunk);
                        model.open_turn &= chunk.is_empty();
                        prop_assert!(changed <= conv.token_count());
                    }
                    _ if chunk.is_empty() => prop_assert_eq!(result.unwrap(), 0),
                    _ => prop_assert!(result.is_err()),
                }
            }
            Op::Answer(call, text) => {
                let Ok(mut parser) = conv.parser() else {
                    prop_assert!(!model.open_turn);
                    continue;
                };
                serial += 1;
                let item = if call {
                    Item::FunctionCall {
                        call_id: String::new(),
                        name: format!("f{serial}"),
                        arguments: text,
                    }
                } else {
                    Item::Message {
                        role: Role::Assistant,
                        text,
                    }
                };
                let mut r = Renderer::new(format.tokenizer().as_ref());
                format.render_completion(&[item], &mut r);
                let sampled = r.finish();
                let mut events = Vec::new();
                for &id in &sampled {
                    parser.feed(id, &mut events);
                }
                prop_assert!(parser.stopped());
                parser.finish(&mut events);
                conv.commit_output(&parser).unwrap();
                let parsed = parser.items().last().cloned().unwrap();
                if let Item::FunctionCall { call_id, .. } = &parsed {
                    model.open_calls.push(call_id.clone());
                }
                model.entries.push(Entry::Header);
                model.entries.push(Entry::Output(sampled, parsed));
                model.open_turn = false;
            }
            Op::Checkpoint => saved.push((conv.checkpoint(), model.clone())),
            Op::Fork(i) => {
                if !saved.is_empty() {
                    let (checkpoint, m) = &saved[i % saved.len()];
                    conv = checkpoint.fork();
                    model = m.clone();
                }
            }
        }
        prop_assert_eq!(
            conv.prompt().tokens(),
            model.render(format.as_ref()),
            "model {:?}",
            model
        );
        prop_assert_eq!(conv.open_call_ids(), model.open_calls.clone());
        prop_assert_eq!(builder(&conv).stats.text_fallbacks, 0);
        prop_assert_eq!(builder(&conv).bytes, builder(&conv).own_bytes(None));
    }
    for (checkpoint, m) in &saved {
        prop_assert_eq!(checkpoint.prompt().tokens(), m.render(format.as_ref()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Any sequence of appends, turns, growing texts, checkpoints and forks yields the
    /// tokens of rendering that conversation from scratch, and checkpoints never change.
    #[test]
    fn cache_equals_render_from_scratch(ops in prop::collection::vec(op(), 1..25)) {
        run_ops(mock(), ops)?;
    }

    /// The same under the real harmony format.
    #[test]
    fn harmony_cache_equals_render_from_scratch(ops in prop::collection::vec(op(), 1..25)) {
        run_ops(Arc::new(crate::format::harmony::Harmony::new()), ops)?;
    }
}

fn user(text: &str) -> Item {
    Item::Message {
        role: Role::User,
        text: text.into(),
    }
}

#[test]
fn appending_renders_only_the_new_items() {
    let mut conv = Conversation::new(SegmentBuilder::new(mock()), 1_000_000);
    let items: Vec<Item> = (0..50)
        .map(|i| user(&format!("message {i} ").repeat(20)))
        .collect();
    conv.append_items(items, None).unwrap();
    let rendered = builder(&conv).stats.tokens_rendered;
    let turn = conv
        .extend(Delta {
            items: vec![user("one more")],
            ..Delta::default()
        })
        .unwrap();
    assert!(turn.new_tokens < 20, "{turn:?}");
    assert_eq!(turn.cached_tokens + turn.new_tokens, turn.prompt_tokens);
    assert!(builder(&conv).stats.tokens_rendered - rendered < 20);
    assert_eq!(builder(&conv).stats.invalidations, 0);
}

#[test]
fn a_changed_prefix_invalidates_and_is_counted() {
    let mut conv = Conversation::new(SegmentBuilder::new(mock()), 1_000_000);
    conv.extend(Delta {
        prefix: prefix(1),
        items: vec![user("hi")],
        ..Delta::default()
    })
    .unwrap();
    assert_eq!(builder(&conv).stats.invalidations, 0);
    let turn = conv
        .extend(Delta {
            prefix: prefix(2),
            items: vec![user("again")],
            ..Delta::default()
        })
        .unwrap();
    assert!(turn.invalidated);
    assert_eq!(turn.cached_tokens, 0);
    assert_eq!(builder(&conv).stats.invalidations, 1);
}

#[test]
fn errors_leave_the_conversation_unchanged() {
    let mut conv = Conversation::new(SegmentBuilder::new(mock()), 200);
    conv.append_items(vec![user("hello")], None).unwrap();
    let before = conv.prompt().tokens();
    let answer = Item::FunctionCallOutput {
        call_id: "nope".into(),
        output: "x".into(),
    };
    let err = conv
        .extend(Delta {
            items: vec![user("fine"), answer],
            ..Delta::default()
        })
        .unwrap_err();
    assert_eq!(err.code, Code::UnknownCallId);
    assert_eq!(err.param.as_deref(), Some("input"));
    assert!(err.message.contains("input[1]"), "{}", err.message);
    let err = conv
        .extend(Delta {
            items: vec![user("fine")],
            max_output_tokens: Some(190),
            ..Delta::default()
        })
        .unwrap_err();
    assert_eq!(err.code, Code::ContextLengthExceeded);
    assert_eq!(conv.prompt().tokens(), before);
    assert!(conv.parser().is_err());
}

fn call(id: &str) -> Item {
    Item::FunctionCall {
        call_id: id.into(),
        name: "f".into(),
        arguments: "{}".into(),
    }
}

fn output(id: &str) -> Item {
    Item::FunctionCallOutput {
        call_id: id.into(),
        output: "ok".into(),
    }
}

#[test]
fn call_id_failures_name_the_item_and_change_nothing() {
    let mut conv = Conversation::new(SegmentBuilder::new(mock()), 100_000);
    conv.append_items(vec![call("a")], None).unwrap();
    let before = conv.prompt().tokens();
    for (bad, at) in [
        (vec![output("zz")], "input[0]"),
        (vec![output("a"), output("a")], "input[1]"),
        (vec![call("a")], "input[0]"),
        (vec![call("n"), call("n")], "input[1]"),
    ] {
        let e = conv.append_items(bad, None).unwrap_err();
        assert_eq!(e.code, Code::UnknownCallId);
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(e.message.starts_with(at), "{}", e.message);
        assert_eq!(conv.open_call_ids(), vec!["a"]);
        assert_eq!(conv.prompt().tokens(), before);
    }
    // An answered id may be used again by a later call.
    conv.append_items(vec![output("a"), call("a"), output("a")], None)
        .unwrap();
    assert!(conv.open_call_ids().is_empty());
}

proptest! {
    /// Against a model of the rule, valid and invalid deltas alike: an output answers a
    /// call open before it (in the chain or earlier in the delta); a call may not reuse
    /// an open id; a failing delta changes nothing; forks keep their own open calls.
    #[test]
    fn call_ids_follow_the_rule_and_failures_are_atomic(
        deltas in proptest::collection::vec(
            proptest::collection::vec((proptest::bool::ANY, 0u8..4), 0..5),
            1..8,
        )
    ) {
        let mut conv = Conversation::new(SegmentBuilder::new(mock()), 1_000_000);
        let mut model: Vec<String> = Vec::new();
        let mut saved = Vec::new();
        for delta in deltas {
            let items: Vec<Item> = delta
                .iter()
                .map(|&(is_call, id)| {
                    let id = format!("c{id}");
                    if is_call { call(&id) } else { output(&id) }
                })
                .collect();
            let mut next = model.clone();
            let valid = items.iter().all(|item| match item {
                Item::FunctionCall { call_id, .. } if !next.contains(call_id) => {
                    next.push(call_id.clone());
                    true
                }
                Item::FunctionCallOutput { call_id, .. } if next.contains(call_id) => {
                    next.retain(|c| c != call_id);
                    true
                }
                _ => false,
            });
            let before = conv.prompt().tokens();
            let result = conv.append_items(items, None);
            prop_assert_eq!(result.is_ok(), valid);
            if valid {
                model = next;
            } else {
                prop_assert_eq!(conv.prompt().tokens(), before);
            }
            prop_assert_eq!(conv.open_call_ids(), model.clone());
            saved.push((conv.checkpoint(), model.clone()));
        }
        for (checkpoint, expected) in saved {
            prop_assert_eq!(checkpoint.fork().open_call_ids(), expected);
        }
    }
}

#[test]
fn growing_a_long_tool_output_stays_exact_and_cheap() {
    let format = mock();
    let mut conv = Conversation::new(SegmentBuilder::new(Arc::clone(&format)), 10_000_000);
    let call = Item::FunctionCall {
        call_id: "c1".into(),
        name: "exec".into(),
        arguments: "{}".into(),
    };
    let answer = Item::FunctionCallOutput {
        call_id: "c1".into(),
        output: String::new(),
    };
    conv.append_items(vec![call, answer], None).unwrap();
    let line = "drwxr-xr-x  2 root root  4096 Nov 29 08:45 .ci\n";
    let mut full = String::new();
    for i in 0..2000 {
        let chunk = format!("{i} {line}");
        full.push_str(&chunk);
        let changed = conv.append_text(&chunk).unwrap();
        assert!(changed < 64, "{changed}");
    }
    let mut model = Model::default();
    model.add_items(&[
        Item::FunctionCall {
            call_id: "c1".into(),
            name: "exec".into(),
            arguments: "{}".into(),
        },
        Item::FunctionCallOutput {
            call_id: "c1".into(),
            output: full,
        },
    ]);
    assert_eq!(conv.prompt().tokens(), model.render(format.as_ref()));
    assert_eq!(builder(&conv).stats.text_fallbacks, 0);
}

#[test]
fn checkpoints_share_history_and_account_only_what_they_add() {
    let mut conv = Conversation::new(SegmentBuilder::new(mock()), 10_000_000);
    let big: Vec<Item> = (0..400)
        .map(|i| user(&format!("line {i} of a long history, ").repeat(20)))
        .collect();
    let text: usize = big
        .iter()
        .map(|i| segment::item_bytes(i) - size_of::<Item>())
        .sum();
    conv.append_items(big, None).unwrap();
    let first = conv.checkpoint();
    assert!(first.memory_bytes() > text);
    conv.append_items(vec![user("a short turn")], None).unwrap();
    let second = conv.checkpoint();
    assert!(second.memory_bytes() < 4096, "{}", second.memory_bytes());
    let mut fork = first.fork();
    fork.append_items(vec![user("another branch")], None).unwrap();
    assert!(fork.prompt().common_prefix_len(&second.prompt()) >= first.token_count());
    // Memory: tokens at 4 bytes each plus item text, within 1.5x.
    let ideal = conv.token_count() * 4 + text;
    assert!(
        conv.memory_bytes() <= ideal * 3 / 2,
        "{} vs {ideal}",
        conv.memory_bytes()
    );
}

#[test]
fn appending_after_a_long_open_run_continues_it() {
    // Consecutive tool outputs form one run in the mock (as in ChatML): each append
    // continues the run the previous one left open.
    let format = mock();
    let mut conv = Conversation::new(SegmentBuilder::new(Arc::clone(&format)), 10_000_000);
    let calls: Vec<Item> = (0..200)
        .map(|i| Item::FunctionCall {
            call_id: format!("c{i}"),
            name: "exec".into(),
            arguments: "{}".into(),
        })
        .collect();
    conv.append_items(calls.clone(), None).unwrap();
    let mut model = Model::default();
    model.add_items(&calls);
    for i in 0..200 {
        let answer = Item::FunctionCallOutput {
            call_id: format!("c{i}"),
            output: format!("total {i}\n-rw-r--r-- 1 root root 425 Nov 29 README.md\n"),
        };
        let turn = conv.append_items(vec![answer.clone()], None).unwrap();
        model.add_items(&[answer]);
        assert!(turn.new_tokens < 60, "{i} {turn:?}");
    }
    assert_eq!(conv.prompt().tokens(), model.render(format.as_ref()));
}

fn parsed(body: &str) -> CreateRequest {
    validate::parse_request(body.as_bytes(), &Limits::default()).unwrap()
}

#[test]
fn requests_extend_with_policy_on_new_text_only() {
    let harmony: Arc<dyn ChatFormat> = Arc::new(crate::format::harmony::Harmony::new());
    let policy = Policy::new(&["secret"], true).unwrap();
    let mut conv = Conversation::new(SegmentBuilder::new(harmony), 100_000);
    let first = conv
        .extend_request(
            &parsed(r#"{"instructions":"Be brief.","input":"hi"}"#),
            Some(&policy),
        )
        .unwrap();
    assert_eq!(first.cached_tokens, 0);
    let before = conv.prompt().tokens();
    let err = conv
        .extend_request(
            &parsed(r#"{"instructions":"Be brief.","input":"a SECRET"}"#),
            Some(&policy),
        )
        .unwrap_err();
    assert_eq!(
        (err.code, err.param.as_deref()),
        (Code::ContentPolicyViolation, Some("input"))
    );
    let err = conv
        .extend_request(
            &parsed(r#"{"instructions":"tell secret","input":"x"}"#),
            Some(&policy),
        )
        .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("instructions"));
    let err = conv
        .extend_request(&parsed(r#"{"input":[{"type":"nope"}]}"#), None)
        .unwrap_err();
    assert_eq!(err.code, Code::UnsupportedContent);
    assert_eq!(conv.prompt().tokens(), before);
    let next = conv
        .extend_request(
            &parsed(r#"{"instructions":"Be brief.","input":"more"}"#),
            Some(&policy),
        )
        .unwrap();
    assert!(!next.invalidated && next.cached_tokens > 0);
}

#[test]
fn json_appends_keep_the_prefix_unless_given() {
    let harmony: Arc<dyn ChatFormat> = Arc::new(crate::format::harmony::Harmony::new());
    let mut conv = Conversation::new(SegmentBuilder::new(Arc::clone(&harmony)), 100_000);
    let tools = r#"[{"type":"function","name":"ls","parameters":{"type":"object"}}]"#;
    conv.append_json(
        r#"[{"role":"user","content":"hi"}]"#,
        Some("Be brief.".into()),
        Some(tools),
    )
    .unwrap();
    let turn = conv.append_json(r#""more""#, None, None).unwrap();
    assert!(!turn.invalidated);
    assert_eq!(conv.prefix().instructions.as_deref(), Some("Be brief."));
    assert_eq!(conv.prefix().tools.len(), 1);
    let turn = conv.append_json("[]", None, Some("[]")).unwrap();
    assert!(turn.invalidated && conv.prefix().tools.is_empty());
    assert_eq!(conv.prefix().instructions.as_deref(), Some("Be brief."));
    let err = conv.append_json("[] , 1", None, None).unwrap_err();
    assert_eq!(err.code, Code::InvalidJson);
}

/// The prompt a conversation holds for `case` when its first `split` items arrive in one
/// call and the rest as the next turn's delta: what a warm continuation renders.
fn prompt_split_at(format: &Arc<dyn ChatFormat>, case: &GoldenCase, split: usize) -> Vec<u32> {
    let mut conversation = Conversation::new(SegmentBuilder::new(format.clone()), 1 << 20);
    conversation
        .append_items(case.items[..split].to_vec(), Some(case.prefix.clone()))
        .unwrap();
    let delta = Delta {
        prefix: case.prefix.clone(),
        items: case.items[split..].to_vec(),
        max_output_tokens: None,
    };
    conversation.extend(delta).unwrap();
    conversation.prompt().tokens()
}

#[test]
fn conversation_cache_renders_openai_harmony_golden_vectors_at_every_split() {
    let format: Arc<dyn ChatFormat> = Arc::new(crate::format::harmony::Harmony::new());
    for case in golden(include_str!("../../../../tests/golden/harmony_render.json")) {
        for split in 0..=case.items.len() {
            assert_eq!(
                prompt_split_at(&format, &case, split),
                case.tokens,
                "case {} split {split}",
                case.name
            );
        }
    }
}

#[test]
fn conversation_cache_tokenizes_the_chatml_template_as_one_string_at_every_split() {
    // o200k glues a newline to the punctuation before it, so merged turns (a text and its
    // calls, consecutive results) are exact only because the cache carries the open run.
    let format: Arc<dyn ChatFormat> = Arc::new(chatml());
    for case in golden(include_str!("../../../../tests/golden/chatml_render.json")) {
        let template = case.text.clone().unwrap();
        let expected = tokenize_template(&chatml(), &template);
        for split in 0..=case.items.len() {
            let ours = prompt_split_at(&format, &case, split);
            assert_eq!(
                transcript::text(&chatml(), &ours),
                template,
                "case {} split {split}",
                case.name
            );
            assert_eq!(ours, expected, "case {} split {split}", case.name);
        }
    }
}
