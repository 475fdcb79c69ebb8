//! ChatML against an OpenAI vocabulary with `<|im_start|>`/`<|im_end|>` added (the
//! exactness tests against the SmolLM2 template and llama.cpp are in tests/test_format_chatml.py).

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::format::transcript::{completion, golden, output, parse, same_items, segments, text};
use crate::format::{Outcome, ParseEvent};
use crate::tokenizer;

const IM_START: u32 = 200_100;
const IM_END: u32 = 200_101;
/// Tags with a token of their own, as in Qwen2.5's vocabulary (user-defined, not control).
const TOOL_CALL: u32 = 200_102;
const TOOL_CALL_END: u32 = 200_103;

/// o200k_base plus the two ChatML special tokens.
struct ChatVocab(Arc<dyn Tokenizer>);

impl Tokenizer for ChatVocab {
    fn name(&self) -> &str {
        "o200k_chatml"
    }
    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        self.0.encode(text, out)
    }
    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        self.0.pieces(text)
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        match id {
            IM_START => b"<|im_start|>",
            IM_END => b"<|im_end|>",
            TOOL_CALL => b"<tool_call>",
            TOOL_CALL_END => b"</tool_call>",
            _ => self.0.token_bytes(id),
        }
    }
    fn special(&self, name: &str) -> Option<u32> {
        match name {
            "<|im_start|>" => Some(IM_START),
            "<|im_end|>" => Some(IM_END),
            _ => self.0.special(name),
        }
    }
    fn is_special(&self, id: u32) -> bool {
        (IM_START..=TOOL_CALL_END).contains(&id) || self.0.is_special(id)
    }
    fn vocab_size(&self) -> usize {
        TOOL_CALL_END as usize + 1
    }
}

const SMOL_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

pub(crate) fn chatml() -> ChatMl {
    let vocab: Arc<dyn Tokenizer> = Arc::new(ChatVocab(tokenizer::by_name("o200k_base").unwrap()));
    ChatMl::new(vocab, Some(SMOL_SYSTEM.into())).unwrap()
}

fn user(text: &str) -> Item {
    Item::Message {
        role: Role::User,
        text: text.into(),
    }
}

fn assistant(text: &str) -> Item {
    Item::Message {
        role: Role::Assistant,
        text: text.into(),
    }
}

fn call(id: &str, name: &str, arguments: &str) -> Item {
    Item::FunctionCall {
        call_id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn result(id: &str, output: &str) -> Item {
    Item::FunctionCallOutput {
        call_id: id.into(),
        output: output.into(),
    }
}

fn weather_tool() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("Weather now".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        strict: false,
    }
}

#[test]
fn tokenizer_without_im_tokens_is_refused() {
    let err = ChatMl::new(tokenizer::by_name("o200k_base").unwrap(), None)
        .err()
        .unwrap();
    assert_eq!(err.code, Code::InvalidVocabulary);
}

#[test]
fn smollm2_template_text_with_default_system() {
    let f = chatml();
    let items = [user("Hi"), assistant("Hello!"), user("Bye")];
    let all = segments(&f, &Prefix::default(), &items).concat();
    assert_eq!(
        text(&f, &all),
        format!(
            "<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        )
    );
}

#[test]
fn qwen_tool_template_text() {
    let f = chatml();
    let prefix = Prefix {
        instructions: Some("Be brief.".into()),
        tools: vec![weather_tool()],
        namespaces: Vec::new(),
        reasoning_effort: None,
    };
    let items = [
        user("Weather in Paris and Rome?"),
        assistant("Checking."),
        call("a", "get_weather", r#"{"city":"Paris"}"#),
        call("b", "get_weather", r#"{"city":"Rome"}"#),
        result("a", "sunny"),
        result("b", "rain"),
    ];
    let all = segments(&f, &prefix, &items).concat();
    let expected = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": \
{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\n\
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n\
<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n";
    assert_eq!(text(&f, &all), expected);
}

#[test]
fn text_equals_the_templates_golden_vectors() {
    let f = chatml();
    let cases = golden(include_str!("../../../../tests/golden/chatml_render.json"));
    assert!(!cases.is_empty());
    for case in cases {
        let ours = text(&f, &segments(&f, &case.prefix, &case.items).concat());
        assert_eq!(Some(ours), case.text, "case {}", case.name);
    }
}

#[test]
fn segments_concatenate_to_the_whole_template_tokenized_at_once() {
    // Turns that are not merged with a neighbour join only at special tokens: exact for any vocabulary.
    let f = chatml();
    let items = [
        user("Hi there,\n\n  friend"),
        assistant("Hello!  "),
        user("Weather?"),
        call("a", "get_weather", r#"{"city": "Paris"}"#),
        result("a", "  sunny\n\n"),
    ];
    let segs = segments(&f, &Prefix::default(), &items);
    let at_once = tokenize_template(&f, &text(&f, &segs.concat()));
    assert_eq!(segs.concat(), at_once);
}

#[test]
fn sampled_history_equals_rendered_history() {
    let f = chatml();
    let items = [
        assistant("Let me look."),
        call("a", "get_weather", r#"{"city": "Paris"}"#),
    ];
    let sampled = completion(&f, &items);
    let segs = segments(&f, &Prefix::default(), &[user("q")]);
    let mut history = segs.concat();
    history.extend(output(&f, &sampled));
    // The next segment closes the turn, as it would after rendered items.
    let next = segments(
        &f,
        &Prefix::default(),
        &[
            user("q"),
            assistant("Let me look."),
            call("a", "get_weather", "{}"),
            user("more"),
        ],
    );
    history.extend(&next[4]);
    let mut rendered = segments(
        &f,
        &Prefix::default(),
        &[user("q"), items[0].clone(), items[1].clone(), user("more")],
    );
    rendered.pop();
    assert_eq!(text(&f, &history), text(&f, &rendered.concat()));
}

#[test]
fn completion_round_trips_through_the_parser() {
    let f = chatml();
    for items in [
        vec![assistant("Plain answer — ünïcödé 🤔")],
        vec![call("a", "get_weather", r#"{"city": "Paris"}"#)],
        vec![
            assistant("Checking two."),
            call("a", "get_weather", r#"{"city": "Paris"}"#),
            call("b", "get_weather", r#"{"city": "日本"}"#),
        ],
    ] {
        let ids = completion(&f, &items);
        let parsed = parse(&f, &ids);
        assert_eq!(parsed.outcome, Outcome::Stopped);
        assert!(same_items(&parsed.items, &items), "{:?}", parsed.items);
        assert_eq!(parsed.output_tokens, ids.len());
        assert_eq!(parsed.reasoning_tokens, 0);
    }
}

#[test]
fn text_that_only_looks_like_a_tag_is_released() {
    let f = chatml();
    let ids = completion(&f, &[assistant("a <tool> and\n<tool_c")]);
    let parsed = parse(&f, &ids);
    assert_eq!(parsed.items, [assistant("a <tool> and\n<tool_c")]);
    let deltas: String = parsed
        .events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "a <tool> and\n<tool_c");
}

fn parse_text(f: &ChatMl, text: &str) -> crate::format::transcript::Parsed {
    let mut ids = Vec::new();
    f.tokenizer().encode(text, &mut ids);
    ids.push(IM_END);
    parse(f, &ids)
}

#[test]
fn call_arguments_stream_before_the_call_ends() {
    let f = chatml();
    let args = r#"{"path": "src/main.rs", "lines": [1, 2, 3], "note": "a } and \" inside"}"#;
    let parsed = parse_text(
        &f,
        &format!("<tool_call>\n{{\"name\": \"read\", \"arguments\": {args}}}\n</tool_call>"),
    );
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(
        same_items(&parsed.items, &[call("", "read", args)]),
        "{:?}",
        parsed.items
    );
    let deltas: Vec<&str> = parsed
        .events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::ArgumentsDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 3, "{deltas:?}");
    assert_eq!(deltas.concat(), args);
    assert!(matches!(parsed.events[0], ParseEvent::CallStart { .. }));
}

#[test]
fn calls_in_other_shapes_are_parsed_whole() {
    let f = chatml();
    for (text, name, args) in [
        (
            r#"<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>"#,
            "f",
            r#"{"a": 1}"#,
        ),
        (
            r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#,
            "f",
            r#"{"a": 1}"#,
        ),
        (
            r#"<tool_call>{"name":"g","arguments":{"x":"</tool_call>"}}</tool_call>"#,
            "g",
            r#"{"x":"</tool_call>"}"#,
        ),
        (r#"<tool_call>{"name": "h"}</tool_call>"#, "h", "{}"),
    ] {
        let parsed = parse_text(&f, text);
        assert_eq!(parsed.outcome, Outcome::Stopped, "{text}");
        assert!(
            same_items(&parsed.items, &[call("", name, args)]),
            "{text}: {:?}",
            parsed.items
        );
    }
}

#[test]
fn whitespace_before_a_call_is_not_a_message() {
    let f = chatml();
    let parsed = parse_text(
        &f,
        "\n\n <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    );
    assert!(
        same_items(&parsed.items, &[call("", "f", "{}")]),
        "{:?}",
        parsed.items
    );
    assert!(!parsed
        .events
        .iter()
        .any(|e| matches!(e, ParseEvent::MessageStart { .. })));
}

#[test]
fn tags_sampled_as_single_tokens_are_read_as_text() {
    let f = chatml();
    let mut ids = Vec::new();
    f.tokenizer().encode("Checking.\n", &mut ids);
    ids.push(TOOL_CALL);
    f.tokenizer()
        .encode("\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", &mut ids);
    ids.extend([TOOL_CALL_END, IM_END]);
    let parsed = parse(&f, &ids);
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(same_items(
        &parsed.items,
        &[assistant("Checking."), call("", "f", r#"{"a": 1}"#)]
    ));
}

#[test]
fn a_long_call_parsed_whole_finds_its_closing_tag() {
    let f = chatml();
    let long = "日本 </tool_call ".repeat(2000);
    let args = format!(r#"{{"x": "{long}"}}"#);
    let parsed = parse_text(
        &f,
        &format!(r#"<tool_call>{{"arguments": {args}, "name": "f"}}</tool_call>"#),
    );
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(same_items(&parsed.items, &[call("", "f", &args)]));
}

#[test]
fn a_call_cut_off_mid_arguments_is_truncated() {
    let f = chatml();
    let mut ids = Vec::new();
    f.tokenizer().encode(
        r#"Sure.
<tool_call>
{"name": "f", "arguments": {"a": "#,
        &mut ids,
    );
    let parsed = parse(&f, &ids);
    assert_eq!(parsed.outcome, Outcome::Truncated);
    assert_eq!(parsed.items[0], assistant("Sure."));
    assert!(matches!(&parsed.items[1], Item::FunctionCall { name, .. } if name == "f"));
}

fn outcome_of(f: &ChatMl, text: &str, end: bool) -> Outcome {
    let mut ids = Vec::new();
    f.tokenizer().encode(text, &mut ids);
    if end {
        ids.push(IM_END);
    }
    parse(f, &ids).outcome
}

#[test]
fn off_format_output_is_malformed_with_a_reason() {
    let f = chatml();
    let reason = |o: Outcome| match o {
        Outcome::Malformed(m) => m,
        other => panic!("expected malformed, got {other:?}"),
    };
    assert!(reason(outcome_of(&f, "<tool_call>\n{\"name\": \"f\"", true)).contains("unterminated"));
    assert!(reason(outcome_of(
        &f,
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        true
    ))
    .contains("no function name"));
    assert!(
        reason(outcome_of(&f, "<tool_call>\nnot json\n</tool_call>", true)).contains("not a JSON object")
    );
    let parsed = parse(&f, &[IM_START]);
    assert!(reason(parsed.outcome).contains("began another turn"));
    let parsed = parse(&f, &[IM_END, 15]);
    assert!(reason(parsed.outcome).contains("after the stop token"));
    assert_eq!(outcome_of(&f, "cut off", false), Outcome::Truncated);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_tokens_never_panic(ids in proptest::collection::vec(
        prop_oneof![0u32..1000, 199_000u32..199_998, Just(199_999), Just(200_018), Just(IM_START), Just(IM_END), Just(TOOL_CALL), Just(TOOL_CALL_END), Just(u32::MAX)], 0..60)) {
        let f = chatml();
        let parsed = parse(&f, &ids);
        prop_assert!(parsed.output_tokens == ids.len());
    }

    #[test]
    fn random_text_round_trips(text in "[a-z <>_/\n{}\"é🤔]{0,40}") {
        let f = chatml();
        let items = [assistant(&text)];
        let parsed = parse(&f, &completion(&f, &items));
        // Text without a complete <tool_call> is one message (none when empty).
        if !text.contains("<tool_call>") && !text.is_empty() {
            prop_assert!(same_items(&parsed.items, &items));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_completions_round_trip(
        answer in "[\\PC\n]{0,40}",
        calls in proptest::collection::vec(("[a-z_]{1,12}", proptest::collection::btree_map("[a-z]{1,5}", "\\PC{0,12}", 0..4)), 0..3),
    ) {
        prop_assume!(!answer.contains("<tool_call>"));
        let f = chatml();
        let mut items = Vec::new();
        // Whitespace alone before calls is not an answer.
        if !answer.is_empty() && (calls.is_empty() || !answer.trim().is_empty()) {
            items.push(assistant(&answer));
        }
        for (name, args) in &calls {
            // Arguments come back as the template writes them (Python's json.dumps).
            items.push(call("", name, &tojson(&serde_json::to_value(args).unwrap())));
        }
        let parsed = parse(&f, &completion(&f, &items));
        prop_assert_eq!(parsed.outcome, Outcome::Stopped);
        prop_assert!(same_items(&parsed.items, &items), "{:?} vs {:?}", parsed.items, items);
    }
}

/// `text` tokenized as llama.cpp tokenizes a rendered template: special tokens by name,
/// each text run between them encoded as one string.
pub(crate) fn tokenize_template(f: &ChatMl, text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = [("<|im_start|>", IM_START), ("<|im_end|>", IM_END)]
            .iter()
            .filter_map(|(tag, id)| rest.find(tag).map(|at| (at, *tag, *id)))
            .min();
        let Some((at, tag, id)) = next else {
            f.tokenizer().encode(rest, &mut ids);
            break;
        };
        f.tokenizer().encode(&rest[..at], &mut ids);
        ids.push(id);
        rest = &rest[at + tag.len()..];
    }
    ids
}

#[test]
fn a_namespaced_function_is_a_flat_function_under_its_qualified_name() {
    // Chat templates know only flat functions: a `namespace` tool's function is offered,
    // called and rendered back as `NAMESPACE.NAME`.
    let f = chatml();
    let prefix = Prefix {
        tools: vec![Tool {
            name: "multi_agent_v1.wait".into(),
            ..weather_tool()
        }],
        ..Prefix::default()
    };
    let offered = text(&f, &segments(&f, &prefix, &[])[0]);
    assert!(
        offered.contains(r#"{"type": "function", "function": {"name": "multi_agent_v1.wait", "#),
        "{offered}"
    );
    let parsed = parse_text(
        &f,
        "<tool_call>\n{\"name\": \"multi_agent_v1.wait\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    let items = [call("", "multi_agent_v1.wait", r#"{"city": "Paris"}"#)];
    assert!(same_items(&parsed.items, &items), "{:?}", parsed.items);
    assert!(same_items(&parse(&f, &completion(&f, &items)).items, &items));
}
