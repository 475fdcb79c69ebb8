use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::format::transcript::{completion, golden, output, parse, same_items, segments, text};
use crate::format::{Outcome, ParseEvent};
use crate::item::{Namespace, Tool};
use serde_json::Value;

fn call(id: &str, name: &str, arguments: &str) -> Item {
    Item::FunctionCall {
        call_id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn weather_prefix() -> Prefix {
    Prefix {
        instructions: Some("Always respond in riddles".into()),
        tools: vec![Tool {
            name: "get_current_weather".into(),
            description: Some("Gets the current weather in the provided location.".into()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}
                },
                "required": ["location"]
            }),
            strict: false,
        }],
        namespaces: Vec::new(),
        reasoning_effort: Some("high".into()),
    }
}

#[test]
fn prefix_matches_openai_harmony_text() {
    let h = Harmony::new();
    let segs = segments(&h, &weather_prefix(), &[]);
    let expected = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
Knowledge cutoff: 2024-06\n\nReasoning: high\n\n\
# Valid channels: analysis, commentary, final. Channel must be included for every message.\n\
Calls to these tools must go to the commentary channel: 'functions'.<|end|>\
<|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n# Tools\n\n## functions\n\n\
namespace functions {\n\n// Gets the current weather in the provided location.\n\
type get_current_weather = (_: {\n// The city and state, e.g. San Francisco, CA\nlocation: string,\n\
format?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n} // namespace functions<|end|>";
    assert_eq!(text(&h, &segs[0]), expected);
    assert_eq!(text(&h, &segs[1]), "<|start|>assistant");
}

#[test]
fn items_render_as_harmony_messages() {
    let h = Harmony::new();
    let items = vec![
        Item::Message {
            role: Role::User,
            text: "Weather in SF?".into(),
        },
        Item::Reasoning {
            text: "Need the tool.".into(),
        },
        call("c1", "get_current_weather", r#"{"location":"SF"}"#),
        Item::FunctionCallOutput {
            call_id: "c1".into(),
            output: "sunny".into(),
        },
        Item::Message {
            role: Role::Assistant,
            text: "It is sunny.".into(),
        },
    ];
    let segs = segments(&h, &Prefix::default(), &items);
    let texts: Vec<String> = segs[1..].iter().map(|s| text(&h, s)).collect();
    assert_eq!(
        texts,
        [
            "<|start|>user<|message|>Weather in SF?<|end|>",
            "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>",
            "<|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>{\"location\":\"SF\"}<|call|>",
            "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>",
            "<|start|>assistant<|channel|>final<|message|>It is sunny.<|end|>",
            "<|start|>assistant",
        ]
    );
}

#[test]
fn sampled_history_equals_rendered_history() {
    let h = Harmony::new();
    for items in [
        vec![
            Item::Reasoning { text: "think".into() },
            Item::Message {
                role: Role::Assistant,
                text: "answer".into(),
            },
        ],
        vec![
            Item::Reasoning { text: "think".into() },
            call("c", "f", r#"{"a": 1}"#),
        ],
        vec![Item::Message {
            role: Role::Assistant,
            text: "only text".into(),
        }],
    ] {
        let sampled = completion(&h, &items);
        let segs = segments(&h, &Prefix::default(), &items);
        let rendered: Vec<u32> = segs[1..segs.len() - 1].concat();
        let mut history = segs.last().unwrap().clone();
        history.extend(output(&h, &sampled));
        assert_eq!(history, rendered);
    }
}

#[test]
fn completion_round_trips_through_the_parser() {
    let h = Harmony::new();
    let items = vec![
        Item::Reasoning {
            text: "Let me think… 🤔".into(),
        },
        Item::Message {
            role: Role::Assistant,
            text: "Calling now — ünïcödé".into(),
        },
        call("x", "lookup", r#"{"q": "日本"}"#),
    ];
    let ids = completion(&h, &items);
    let parsed = parse(&h, &ids);
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(same_items(&parsed.items, &items), "{:?}", parsed.items);
    assert_eq!(parsed.output_tokens, ids.len());
    assert!(parsed.reasoning_tokens > 0 && parsed.reasoning_tokens < ids.len());
    let Item::FunctionCall { call_id, .. } = &parsed.items[2] else {
        panic!()
    };
    assert!(parsed.events.contains(&ParseEvent::CallDone {
        index: 2,
        name: "lookup".into(),
        call_id: call_id.clone(),
        arguments: r#"{"q": "日本"}"#.into(),
    }));
    // Deltas concatenate to the texts and each is whole UTF-8 (they are Strings).
    let reasoning: String = parsed
        .events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::ReasoningDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, "Let me think… 🤔");
}

#[test]
fn parses_the_channel_before_recipient_form_models_sample() {
    let h = Harmony::new();
    let s = h.specials();
    let mut ids = Vec::new();
    let t = h.tokenizer();
    ids.push(s.channel);
    t.encode("commentary to=functions.get_weather", &mut ids);
    ids.push(s.constrain);
    t.encode("json", &mut ids);
    ids.push(s.message);
    t.encode(r#"{"city":"Paris"}"#, &mut ids);
    ids.push(s.call);
    let parsed = parse(&h, &ids);
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(same_items(
        &parsed.items,
        &[call("", "get_weather", r#"{"city":"Paris"}"#)]
    ));
}

fn malformed(h: &Harmony, pieces: &[Result<u32, &str>]) -> String {
    let mut ids = Vec::new();
    for p in pieces {
        match p {
            Ok(id) => ids.push(*id),
            Err(text) => h.tokenizer().encode(text, &mut ids),
        }
    }
    match parse(h, &ids).outcome {
        Outcome::Malformed(m) => m,
        other => panic!("expected malformed, got {other:?}"),
    }
}

#[test]
fn off_format_output_is_malformed_with_a_reason() {
    let h = Harmony::new();
    let s = h.specials();
    let m = malformed(
        &h,
        &[Ok(s.channel), Err("thoughts"), Ok(s.message), Err("x"), Ok(s.end)],
    );
    assert!(m.contains("unknown channel"), "{m}");
    let m = malformed(
        &h,
        &[
            Ok(s.channel),
            Err("commentary to=functions."),
            Ok(s.message),
            Ok(s.call),
        ],
    );
    assert!(m.contains("no name"), "{m}");
    let m = malformed(&h, &[Ok(s.channel), Err("final"), Ok(s.ret)]);
    assert!(m.contains("unterminated"), "{m}");
    let m = malformed(
        &h,
        &[Ok(s.channel), Err("final"), Ok(s.message), Err("hi"), Ok(s.call)],
    );
    assert!(m.contains("ended a message"), "{m}");
    let m = malformed(
        &h,
        &[
            Ok(s.channel),
            Err("final"),
            Ok(s.message),
            Err("hi"),
            Ok(s.ret),
            Err("more"),
        ],
    );
    assert!(m.contains("after the stop token"), "{m}");
    let m = malformed(
        &h,
        &[
            Ok(s.channel),
            Err("final"),
            Ok(s.message),
            Err("hi"),
            Ok(s.end),
            Err("x"),
        ],
    );
    assert!(m.contains("expected <|start|>"), "{m}");
    let m = malformed(&h, &[Ok(s.channel), Err("final"), Ok(s.message), Ok(s.start)]);
    assert!(m.contains("never ended"), "{m}");
    let m = malformed(&h, &[Ok(s.message), Err("x"), Ok(s.end)]);
    assert!(m.contains("no channel"), "{m}");
    let m = malformed(&h, &[Ok(s.channel), Err("final"), Ok(s.message), Ok(u32::MAX)]);
    assert!(m.contains("outside the vocabulary"), "{m}");
}

#[test]
fn invalid_utf8_is_malformed() {
    let h = Harmony::new();
    let s = h.specials();
    // A lone continuation byte: find the single-byte token for 0x80.
    let t = h.tokenizer();
    let lone = (0..t.vocab_size() as u32)
        .find(|&id| !t.is_special(id) && t.token_bytes(id) == [0x80])
        .expect("o200k has byte tokens");
    let m = malformed(
        &h,
        &[
            Ok(s.channel),
            Err("final"),
            Ok(s.message),
            Err("a"),
            Ok(lone),
            Ok(s.ret),
        ],
    );
    assert!(m.contains("invalid UTF-8"), "{m}");
}

#[test]
fn truncated_output_keeps_what_was_written() {
    let h = Harmony::new();
    let ids = completion(
        &h,
        &[Item::Message {
            role: Role::Assistant,
            text: "a long answer".into(),
        }],
    );
    let parsed = parse(&h, &ids[..ids.len() - 1]);
    assert_eq!(parsed.outcome, Outcome::Truncated);
    assert_eq!(
        parsed.items,
        [Item::Message {
            role: Role::Assistant,
            text: "a long answer".into()
        }]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn random_tokens_never_panic(ids in proptest::collection::vec(
        prop_oneof![0u32..201_100, 200_000u32..200_020, Just(u32::MAX)], 0..60)) {
        let h = Harmony::new();
        let parsed = parse(&h, &ids);
        prop_assert!(parsed.output_tokens == ids.len());
    }
}

#[test]
fn segments_equal_openai_harmony_golden_vectors() {
    let h = Harmony::new();
    let cases = golden(include_str!("../../../../tests/golden/harmony_render.json"));
    assert!(!cases.is_empty());
    for case in cases {
        let ours = segments(&h, &case.prefix, &case.items).concat();
        assert_eq!(text(&h, &ours), text(&h, &case.tokens), "case {}", case.name);
        assert_eq!(ours, case.tokens, "case {}", case.name);
    }
}

#[test]
fn parser_reads_what_openai_harmony_reads() {
    let h = Harmony::new();
    let golden: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../../../../tests/golden/harmony_parse.json")).unwrap();
    assert!(!golden.is_empty());
    for case in &golden {
        let name = case["name"].as_str().unwrap();
        let tokens: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let expected: Vec<Item> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let text = m["text"].as_str().unwrap().to_owned();
                match (m["channel"].as_str(), m["recipient"].as_str()) {
                    (_, Some(recipient)) => call("", recipient.strip_prefix("functions.").unwrap(), &text),
                    (Some("analysis"), None) => Item::Reasoning { text },
                    _ => Item::Message {
                        role: Role::Assistant,
                        text,
                    },
                }
            })
            .collect();
        let parsed = parse(&h, &tokens);
        assert_eq!(parsed.outcome, Outcome::Stopped, "case {name}");
        assert!(
            same_items(&parsed.items, &expected),
            "case {name}: {:?}",
            parsed.items
        );
        // The streamed deltas add up to the finished items.
        let mut streamed = std::collections::BTreeMap::<usize, String>::new();
        for event in &parsed.events {
            if let ParseEvent::TextDelta { index, text }
            | ParseEvent::ReasoningDelta { index, text }
            | ParseEvent::ArgumentsDelta { index, text } = event
            {
                streamed.entry(*index).or_default().push_str(text);
            }
        }
        for (index, item) in parsed.items.iter().enumerate() {
            let whole = match item {
                Item::Message { text, .. } | Item::Reasoning { text } => text,
                Item::FunctionCall { arguments, .. } => arguments,
                Item::FunctionCallOutput { output, .. } => output,
            };
            assert_eq!(
                streamed.get(&index).map(String::as_str).unwrap_or(""),
                whole,
                "case {name}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_completions_round_trip(
        reasoning in proptest::option::of("[\\PC\n]{0,40}"),
        answer in proptest::option::of("[\\PC\n]{0,40}"),
        call_args in proptest::option::of(("[a-z_]{1,12}", "\\PC{0,40}")),
    ) {
        let h = Harmony::new();
        let mut items = Vec::new();
        items.extend(reasoning.map(|text| Item::Reasoning { text }));
        items.extend(answer.map(|text| Item::Message { role: Role::Assistant, text }));
        items.extend(call_args.map(|(name, args)| call("", &name, &args)));
        let ids = completion(&h, &items);
        if items.is_empty() {
            // Nothing to say is still a (empty) final answer.
            items.push(Item::Message { role: Role::Assistant, text: String::new() });
        }
        let parsed = parse(&h, &ids);
        prop_assert_eq!(parsed.outcome, Outcome::Stopped);
        prop_assert!(same_items(&parsed.items, &items), "{:?}", parsed.items);
    }
}

fn namespace_prefix() -> Prefix {
    let tool = |name: &str, description: Option<&str>, parameters| Tool {
        name: name.into(),
        description: description.map(Into::into),
        parameters,
        strict: false,
    };
    Prefix {
        instructions: None,
        tools: vec![
            tool(
                "multi_agent_v1.spawn_agent",
                Some("Start a sub-agent."),
                json!({"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}),
            ),
            tool(
                "exec",
                None,
                json!({"type": "object", "properties": {"cmd": {"type": "string"}}}),
            ),
            tool("multi_agent_v1.wait", None, Value::Null),
        ],
        namespaces: vec![
            Namespace {
                name: "multi_agent_v1".into(),
                description: Some("Sub-agents.\nRun in parallel.".into()),
            },
            Namespace {
                name: "apps".into(),
                description: Some("No tools yet.".into()),
            },
        ],
        reasoning_effort: None,
    }
}

#[test]
fn namespaces_render_as_their_own_blocks_in_name_order() {
    let h = Harmony::new();
    let segs = segments(&h, &namespace_prefix(), &[]);
    let expected = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n\
# Valid channels: analysis, commentary, final. Channel must be included for every message.\n\
Calls to these tools must go to the commentary channel: 'functions'.<|end|>\
<|start|>developer<|message|># Tools\n\n## apps\n\nNo tools yet.\n\n## functions\n\n\
namespace functions {\n\ntype exec = (_: {\ncmd?: string,\n}) => any;\n\n} // namespace functions\n\n\
## multi_agent_v1\n\n// Sub-agents.\n// Run in parallel.\nnamespace multi_agent_v1 {\n\n\
// Start a sub-agent.\ntype spawn_agent = (_: {\ntask: string,\n}) => any;\n\n\
type wait = () => any;\n\n} // namespace multi_agent_v1<|end|>";
    assert_eq!(text(&h, &segs[0]), expected);
    // Only namespaced tools: no `functions` block and no line about it.
    let mut only = namespace_prefix();
    only.tools.retain(|t| t.name != "exec");
    let rendered = text(&h, &segments(&h, &only, &[])[0]);
    assert!(!rendered.contains("functions"), "{rendered}");
    assert!(rendered.contains("## multi_agent_v1"), "{rendered}");
}

#[test]
fn a_namespaced_call_is_called_by_its_qualified_name_and_renders_back_the_same() {
    let h = Harmony::new();
    let items = vec![call("c1", "multi_agent_v1.spawn_agent", r#"{"task":"x"}"#)];
    let ids = completion(&h, &items);
    let sampled = text(&h, &ids);
    assert!(
        sampled.starts_with(" to=multi_agent_v1.spawn_agent<|channel|>commentary"),
        "{sampled}"
    );
    let parsed = parse(&h, &ids);
    assert_eq!(parsed.outcome, Outcome::Stopped);
    assert!(same_items(&parsed.items, &items), "{:?}", parsed.items);
    // The sampled call and the call sent back as input render to the same tokens.
    let segs = segments(&h, &namespace_prefix(), &items);
    let mut history = segs.last().unwrap().clone();
    history.extend(output(&h, &completion(&h, &items)));
    assert_eq!(history, segs[1..segs.len() - 1].concat());
    let answered = [
        call("c1", "multi_agent_v1.wait", "{}"),
        Item::FunctionCallOutput {
            call_id: "c1".into(),
            output: "done".into(),
        },
    ];
    let segs = segments(&h, &namespace_prefix(), &answered);
    assert_eq!(
        text(&h, &segs[2]),
        "<|start|>multi_agent_v1.wait to=assistant<|channel|>commentary<|message|>done<|end|>"
    );
    // A recipient without a namespace is still no function.
    let s = h.specials();
    let m = malformed(
        &h,
        &[
            Ok(s.channel),
            Err("commentary to=python"),
            Ok(s.message),
            Ok(s.call),
        ],
    );
    assert!(m.contains("only namespaced tools"), "{m}");
}
