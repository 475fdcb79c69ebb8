//! The family parsers on canned model outputs (the llama.cpp sdist's tests/test-chat.cpp
//! cases and our own), fed token by token as a vocabulary with the markers as special
//! tokens would sample them, and again one byte per token (every split point).

use super::*;
use crate::format::transcript::{marker_vocab as vocab, BASE, MARKERS};

/// Ids of `text`: markers as their special token, the rest encoded normally or one
/// byte per token.
fn ids(t: &dyn Tokenizer, text: &str, bytewise: bool) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let next = MARKERS
            .iter()
            .filter_map(|m| rest.find(m).map(|at| (at, *m)))
            .min_by_key(|&(at, m)| (at, usize::MAX - m.len()));
        let plain = next.map_or(rest, |(at, _)| &rest[..at]);
        if bytewise {
            for b in plain.bytes() {
                out.push(
                    (0..BASE)
                        .find(|&id| !t.is_special(id) && t.token_bytes(id) == [b])
                        .unwrap(),
                );
            }
        } else {
            t.encode(plain, &mut out);
        }
        match next {
            Some((at, m)) => {
                out.push(t.special(m).unwrap());
                rest = &rest[at + m.len()..];
            }
            None => return out,
        }
    }
}

/// The stop tokens of every family.
fn stop_ids(t: &dyn Tokenizer) -> Vec<u32> {
    [
        "<|eot_id|>",
        "<|eom_id|>",
        "</s>",
        "<|im_end|>",
        "<｜end▁of▁sentence｜>",
    ]
    .iter()
    .map(|m| t.special(m).unwrap())
    .collect()
}

/// What the parser made of `text`: its items as short strings and the outcome, the
/// same when fed token by token and byte by byte.
fn parse(family: Family, in_reasoning: bool, text: &str) -> (Vec<String>, Outcome) {
    let t = vocab();
    let stop = stop_ids(t.as_ref());
    let mut results = Vec::new();
    for bytewise in [false, true] {
        let mut p = family.parser(t.clone(), stop.clone(), in_reasoning);
        let mut events = Vec::new();
        for id in ids(t.as_ref(), text, bytewise) {
            p.feed(id, &mut events);
        }
        let outcome = p.finish(&mut events);
        let items: Vec<String> = p
            .items()
            .iter()
            .map(|item| match item {
                Item::Message { text, .. } => format!("text:{text}"),
                Item::Reasoning { text } => format!("reasoning:{text}"),
                Item::FunctionCall { name, arguments, .. } => format!("call:{name}:{arguments}"),
                Item::FunctionCallOutput { .. } => unreachable!(),
            })
            .collect();
        // Every done event carries the item's whole text; deltas add up to it.
        let mut deltas = String::new();
        for e in &events {
            match e {
                ParseEvent::TextDelta { text, .. }
                | ParseEvent::ReasoningDelta { text, .. }
                | ParseEvent::ArgumentsDelta { text, .. } => deltas.push_str(text),
                _ => {}
            }
        }
        let whole: String = p
            .items()
            .iter()
            .map(|item| match item {
                Item::Message { text, .. } | Item::Reasoning { text } => text.as_str(),
                Item::FunctionCall { arguments, .. } => arguments.as_str(),
                Item::FunctionCallOutput { .. } => "",
            })
            .collect();
        if matches!(outcome, Outcome::Stopped) {
            assert_eq!(deltas, whole, "{text:?}");
        }
        results.push((items, outcome));
    }
    assert_eq!(results[0], results[1], "token and byte feeds differ on {text:?}");
    results.remove(0)
}

fn items(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn hermes_reasoning_text_and_calls() {
    let (got, outcome) = parse(
        Family::Hermes,
        false,
        "<think>\nI'm\nthinking\n</think>\n\nHello, world!\n<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 2}\"}\n</tool_call><|im_end|>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(
        got,
        items(&[
            "reasoning:\nI'm\nthinking\n",
            "text:Hello, world!",
            "call:special_function:{\"arg1\": 1}",
            "call:b:{\"x\": 2}",
        ])
    );
}

#[test]
fn qwen3_reasoning_opened_by_the_prompt() {
    // llama.cpp: "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?" with thinking on.
    let (got, outcome) = parse(
        Family::Hermes,
        true,
        "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?<|im_end|>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(
        got,
        items(&["reasoning:I'm\nthinking\n", "text:Hello, world!\nWhat's up?"])
    );
}

#[test]
fn hermes_malformed_and_unterminated_calls() {
    let (_, outcome) = parse(
        Family::Hermes,
        false,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}\n</tool_call><|im_end|>",
    );
    assert!(
        matches!(outcome, Outcome::Malformed(ref m) if m.contains("not a JSON object")),
        "{outcome:?}"
    );
    let (_, outcome) = parse(Family::Hermes, false, "<tool_call>\n{\"name\": \"f\"}<|im_end|>");
    assert!(
        matches!(outcome, Outcome::Malformed(ref m) if m.contains("unterminated")),
        "{outcome:?}"
    );
    let (_, outcome) = parse(
        Family::Hermes,
        false,
        "<tool_call>{\"arguments\": {}}</tool_call><|im_end|>",
    );
    assert!(
        matches!(outcome, Outcome::Malformed(ref m) if m.contains("no function name")),
        "{outcome:?}"
    );
}

#[test]
fn text_that_only_looks_like_a_marker_is_text() {
    let (got, outcome) = parse(Family::Hermes, false, "a <tool_ca b </think> c<|im_end|>");
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(got, items(&["text:a <tool_ca b </think> c"]));
    // Cut off: the text so far is kept, a partial call is dropped.
    let (got, outcome) = parse(Family::Hermes, false, "Hi <tool_call>{\"name\"");
    assert_eq!(outcome, Outcome::Truncated);
    assert_eq!(got, items(&["text:Hi "]));
}

#[test]
fn llama3_json_calls_bare_and_after_python_tag() {
    let (got, outcome) = parse(
        Family::Llama3Json,
        false,
        "{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}<|eom_id|>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(got, items(&["call:special_function:{\"arg1\": 1}"]));
    let (got, _) = parse(
        Family::Llama3Json,
        false,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"q\": \"x\"}}<|eom_id|>",
    );
    assert_eq!(got, items(&["call:a:{}", "call:b:{\"q\": \"x\"}"]));
    // A `;` inside an argument is not a call separator.
    let (got, outcome) = parse(
        Family::Llama3Json,
        false,
        "<|python_tag|>{\"name\": \"exec\", \"parameters\": {\"cmd\": \"cd /tmp; ls\"}};{\"name\": \"b\", \"parameters\": {}};<|eom_id|>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(got, items(&["call:exec:{\"cmd\": \"cd /tmp; ls\"}", "call:b:{}"]));
    let (_, outcome) = parse(
        Family::Llama3Json,
        false,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}} and more<|eom_id|>",
    );
    assert!(matches!(outcome, Outcome::Malformed(_)), "{outcome:?}");
    let (got, _) = parse(Family::Llama3Json, false, "Hello, world!\nWhat's up?<|eot_id|>");
    assert_eq!(got, items(&["text:Hello, world!\nWhat's up?"]));
    let (_, outcome) = parse(
        Family::Llama3Json,
        false,
        "<|python_tag|>brave_search.call(query=\"x\")<|eom_id|>",
    );
    assert!(matches!(outcome, Outcome::Malformed(_)), "{outcome:?}");
}

#[test]
fn mistral_v3_array_and_tekken_args_forms() {
    // llama.cpp's Mistral Nemo case.
    let (got, outcome) = parse(
        Family::Mistral,
        false,
        "[TOOL_CALLS][{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}, \"id\": \"123456789\"}]</s>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(got, items(&["call:special_function:{\"arg1\": 1}"]));
    // llama.cpp's Ministral / Devstral cases, with reasoning first.
    let (got, _) = parse(
        Family::Mistral,
        false,
        "[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{\"arg1\":1} and more[/THINK][TOOL_CALLS]special_function[ARGS]{\"arg1\": 1}[TOOL_CALLS]special_function_with_opt[ARGS]{\"arg1\": 1, \"arg2\": 2}</s>",
    );
    assert_eq!(
        got,
        items(&[
            "reasoning:Let me think about [TOOL_CALLS]special_function[ARGS]{\"arg1\":1} and more",
            "call:special_function:{\"arg1\": 1}",
            "call:special_function_with_opt:{\"arg1\": 1, \"arg2\": 2}",
        ])
    );
    let (_, outcome) = parse(Family::Mistral, false, "[TOOL_CALLS]f[ARGS]{\"a\": </s>");
    assert!(matches!(outcome, Outcome::Malformed(_)), "{outcome:?}");
}

#[test]
fn deepseek_r1_and_v31_calls() {
    // llama.cpp's DeepSeek R1 case (forced-open thinking).
    let (got, outcome) = parse(
        Family::DeepSeekV3,
        true,
        "I'm\nthinking</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    );
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(
        got,
        items(&["reasoning:I'm\nthinking", "call:special_function:{\"arg1\": 1}"])
    );
    let (got, _) = parse(
        Family::DeepSeekV3,
        false,
        "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>ls<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    );
    assert_eq!(
        got,
        items(&["text:Sure.", "call:get_time:{\"tz\": \"UTC\"}", "call:ls:{}"])
    );
    let (_, outcome) = parse(
        Family::DeepSeekV3,
        false,
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    );
    assert!(matches!(outcome, Outcome::Malformed(_)), "{outcome:?}");
}

#[test]
fn families_by_name_and_from_templates() {
    assert_eq!(Family::by_name("qwen3").unwrap(), Family::Hermes);
    assert_eq!(Family::by_name("deepseek_r1").unwrap(), Family::DeepSeekV3);
    assert_eq!(Family::by_name("nope").unwrap_err().code, Code::InvalidValue);
    assert_eq!(Family::detect("{{ '<tool_call>' }}"), Some(Family::Hermes));
    assert_eq!(Family::detect("{{ '[TOOL_CALLS]' }}"), Some(Family::Mistral));
    assert_eq!(Family::detect("<|python_tag|>"), Some(Family::Llama3Json));
    assert_eq!(Family::detect("<｜tool▁calls▁begin｜>"), Some(Family::DeepSeekV3));
    assert_eq!(Family::detect("{{ messages }}"), None);
}

/// Events of `text` fed one byte per token: those before the first token of `marker`,
/// and all of them; and how many bytes of arguments had gone out after each token.
fn events_split_at(
    family: Family,
    text: &str,
    marker: &str,
) -> (Vec<ParseEvent>, Vec<ParseEvent>, Vec<usize>) {
    let t = vocab();
    let stop = stop_ids(t.as_ref());
    let cut = t.special(marker).unwrap();
    let mut p = family.parser(t.clone(), stop, false);
    let (mut before, mut events, mut progress) = (None, Vec::new(), Vec::new());
    for id in ids(t.as_ref(), text, true) {
        if id == cut && before.is_none() {
            before = Some(events.clone());
        }
        p.feed(id, &mut events);
        progress.push(streamed_arguments(&events).len());
    }
    p.finish(&mut events);
    (before.unwrap_or_default(), events, progress)
}

fn streamed_arguments(events: &[ParseEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::ArgumentsDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn hermes_arguments_stream_before_the_call_closes() {
    let text = "<tool_call>\n{\"name\": \"exec\", \"arguments\": {\"cmd\": \"ls -la\", \"n\": [1, {\"a\": \"}\"}]}}\n</tool_call><|im_end|>";
    let (before, events, progress) = events_split_at(Family::Hermes, text, "</tool_call>");
    // The call started with its name and every argument byte went out before the close,
    // each as it was fed.
    assert!(matches!(&before[0], ParseEvent::CallStart { name, .. } if name == "exec"));
    let arguments = "{\"cmd\": \"ls -la\", \"n\": [1, {\"a\": \"}\"}]}";
    assert_eq!(streamed_arguments(&before), arguments);
    let mut steps = progress.clone();
    steps.dedup();
    assert_eq!(steps.len(), arguments.len() + 1, "{progress:?}");
    assert!(!before.iter().any(|e| matches!(e, ParseEvent::CallDone { .. })));
    let done = events.iter().find_map(|e| match e {
        ParseEvent::CallDone { arguments, .. } => Some(arguments.as_str()),
        _ => None,
    });
    assert_eq!(done, Some(arguments));
}

#[test]
fn a_hermes_call_cut_off_keeps_the_arguments_streamed() {
    let t = vocab();
    let text = "<tool_call>\n{\"name\": \"exec\", \"arguments\": {\"cmd\": \"ls";
    let mut p = Family::Hermes.parser(t.clone(), vec![t.special("<|im_end|>").unwrap()], false);
    let mut events = Vec::new();
    for id in ids(t.as_ref(), text, false) {
        p.feed(id, &mut events);
    }
    assert_eq!(p.finish(&mut events), Outcome::Truncated);
    assert_eq!(streamed_arguments(&events), "{\"cmd\": \"ls");
    assert!(matches!(p.items(), [Item::FunctionCall { name, arguments, .. }]
        if name == "exec" && arguments == "{\"cmd\": \"ls"));
}

#[test]
fn a_hermes_call_in_another_shape_is_still_read_whole() {
    // `arguments` before `name`: nothing streams, the call comes out at its end.
    let text = "<tool_call>\n{\"arguments\": {\"cmd\": \"ls\"}, \"name\": \"exec\"}\n</tool_call><|im_end|>";
    let (before, events, _) = events_split_at(Family::Hermes, text, "</tool_call>");
    assert!(before.is_empty());
    assert_eq!(streamed_arguments(&events), "{\"cmd\": \"ls\"}");
    let (got, outcome) = parse(Family::Hermes, false, text);
    assert_eq!(
        (got, outcome),
        (items(&["call:exec:{\"cmd\": \"ls\"}"]), Outcome::Stopped)
    );
}

/// The calls started and done among `events`, in order: `start:NAME`, `done:NAME`.
fn call_events(events: &[ParseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ParseEvent::CallStart { name, .. } => Some(format!("start:{name}")),
            ParseEvent::CallDone { name, .. } => Some(format!("done:{name}")),
            _ => None,
        })
        .collect()
}

#[test]
fn llama_and_mistral_calls_stream_one_after_another() {
    for (family, text, stop) in [
        (
            Family::Llama3Json,
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"cmd\": \"cd /tmp; ls\"}}; {\"name\": \"b\", \"parameters\": {\"q\": [1, 2]}}<|eom_id|>",
            "<|eom_id|>",
        ),
        (
            Family::Llama3Json,
            "{\"name\": \"a\", \"parameters\": {\"cmd\": \"cd /tmp; ls\"}};{\"name\": \"b\", \"arguments\": {\"q\": [1, 2]}}<|eom_id|>",
            "<|eom_id|>",
        ),
        (
            Family::Mistral,
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"cmd\": \"cd /tmp; ls\"}, \"id\": \"abc123def\"}, {\"name\": \"b\", \"arguments\": {\"q\": [1, 2]}, \"id\": \"x}y\"}]</s>",
            "</s>",
        ),
    ] {
        let (before, events, progress) = events_split_at(family, text, stop);
        // Both calls went out before the stop token, the first done before the second
        // started, every argument byte as it was fed.
        assert_eq!(call_events(&before), ["start:a", "done:a", "start:b"], "{text}");
        let arguments = "{\"cmd\": \"cd /tmp; ls\"}{\"q\": [1, 2]}";
        assert_eq!(streamed_arguments(&before), arguments, "{text}");
        let mut steps = progress.clone();
        steps.dedup();
        assert_eq!(steps.len(), arguments.len() + 1, "{text}: {progress:?}");
        assert_eq!(call_events(&events), ["start:a", "done:a", "start:b", "done:b"]);
        let (got, outcome) = parse(family, false, text);
        assert_eq!(outcome, Outcome::Stopped);
        assert_eq!(
            got,
            items(&["call:a:{\"cmd\": \"cd /tmp; ls\"}", "call:b:{\"q\": [1, 2]}"])
        );
    }
}

#[test]
fn completions_of_each_family_parse_back_to_their_items() {
    let tokenizer = vocab();
    let items = [
        Item::Reasoning { text: "think".into() },
        Item::Message {
            role: crate::item::Role::Assistant,
            text: "Calling.".into(),
        },
        Item::FunctionCall {
            call_id: String::new(),
            name: "get".into(),
            arguments: r#"{"a": 1}"#.into(),
        },
        Item::FunctionCall {
            call_id: String::new(),
            name: "put".into(),
            arguments: r#"{"b": [2]}"#.into(),
        },
    ];
    for family in [
        Family::Hermes,
        Family::Llama3Json,
        Family::Mistral,
        Family::DeepSeekV3,
    ] {
        let specials = crate::format::template::specials::Specials::new(
            Arc::clone(&tokenizer),
            crate::format::template::specials::ContentSpecials::Allow,
        );
        let mut ids = specials.encode_all(&family.completion_text(&items));
        let stop = tokenizer.special("<|im_end|>").unwrap();
        ids.push(stop);
        let mut parser = family.parser(Arc::clone(&tokenizer), vec![stop], false);
        let mut events = Vec::new();
        for id in ids {
            parser.feed(id, &mut events);
        }
        assert_eq!(
            parser.finish(&mut events),
            crate::format::Outcome::Stopped,
            "{family:?}"
        );
        let calls: Vec<(String, String)> = parser
            .items()
            .iter()
            .filter_map(|i| match i {
                Item::FunctionCall { name, arguments, .. } => Some((name.clone(), arguments.clone())),
                _ => None,
            })
            .collect();
        let args = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(calls.len(), 2, "{family:?}");
        assert_eq!(
            (calls[0].0.as_str(), args(&calls[0].1)),
            ("get", args(r#"{"a": 1}"#)),
            "{family:?}"
        );
        assert_eq!(
            (calls[1].0.as_str(), args(&calls[1].1)),
            ("put", args(r#"{"b": [2]}"#)),
            "{family:?}"
        );
    }
}
