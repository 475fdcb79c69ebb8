//! Fuzzing request parsing: random bytes, random JSON and mutations of a valid request
//! always give an error or a parsed event, never a panic.

use hotloop_core::validate::{parse_event, parse_request, ClientEvent, Limits};
use hotloop_core::Code;
use proptest::prelude::*;
use serde_json::{json, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e9f64..1e9).prop_map(|x| json!(x)),
        "[a-z_ ]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "message",
            "user",
            "assistant",
            "function_call",
            "input_text",
            "object",
            "#/$defs/X",
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_$]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn valid_request() -> Value {
    json!({
        "type": "response.create",
        "model": "m",
        "stream_id": "lane",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "ok"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {
                "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"],
                "$defs": {"A": {"type": ["string", "null"], "enum": ["x", null]}}}},
            {"type": "namespace", "name": "ns", "tools": []},
            {"type": "web_search"},
        ],
        "tool_choice": "auto",
        "metadata": {"k": "v"},
        "reasoning": {"effort": "high"},
        "temperature": 0.7,
        "max_output_tokens": 32,
    })
}

/// Every location of a JSON document, as a list of object keys / array indices.
fn locations(value: &Value, prefix: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                prefix.push(Value::String(k.clone()));
                locations(v, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                prefix.push(json!(i));
                locations(v, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn slot<'a>(doc: &'a mut Value, location: &[Value]) -> &'a mut Value {
    location.iter().fold(doc, |node, step| match step {
        Value::String(k) => &mut node[k.as_str()],
        other => &mut node[other.as_u64().unwrap() as usize],
    })
}

fn check(frame: &[u8], limits: &Limits) {
    match parse_event(frame, limits) {
        Err(e) => assert_eq!(e.code, Code::InvalidJson),
        Ok(ClientEvent::Create(request)) => match &request.error {
            Some(e) => assert!(!e.message.is_empty()),
            None => {
                let fields: Value = serde_json::from_str(&request.response_fields_json).unwrap();
                assert!(fields.is_object());
                let text = std::str::from_utf8(frame).unwrap();
                let input: Value = serde_json::from_str(request.input_json.text(text)).unwrap();
                assert_eq!(input.as_array().map(Vec::len), Some(request.input.items.len()));
            }
        },
        Ok(_) => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes(frame in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&frame, &Limits::default());
        let _ = parse_request(&frame, &Limits::default());
    }

    #[test]
    fn random_json(value in json_value(), kind in prop::sample::select(vec!["response.create", "response.append", "x"])) {
        check(value.to_string().as_bytes(), &Limits::default());
        if let Value::Object(mut map) = value {
            map.insert("type".into(), json!(kind));
            check(Value::Object(map).to_string().as_bytes(), &Limits::default());
        }
    }

    #[test]
    fn mutations_of_a_valid_request(
        picks in prop::collection::vec((any::<prop::sample::Index>(), json_value()), 1..4),
        tight in any::<bool>(),
    ) {
        let mut doc = valid_request();
        for (index, replacement) in picks {
            let mut all = Vec::new();
            locations(&doc, &mut Vec::new(), &mut all);
            let location = index.get(&all).clone();
            if location.first() == Some(&json!("type")) {
                continue;
            }
            *slot(&mut doc, &location) = replacement;
        }
        let limits = if tight {
            Limits { max_items: 2, max_text_bytes: 4, max_tools: 1, max_tools_bytes: 64, images: false }
        } else {
            Limits::default()
        };
        check(doc.to_string().as_bytes(), &limits);
        let nested = json!({"type": "response.create", "response": doc});
        check(nested.to_string().as_bytes(), &limits);
    }
}

#[test]
fn the_valid_request_is_valid() {
    let frame = valid_request().to_string();
    let Ok(ClientEvent::Create(request)) = parse_event(frame.as_bytes(), &Limits::default()) else {
        panic!("not a create request");
    };
    assert_eq!(request.error, None);
    assert_eq!(request.input.items.len(), 4);
    assert_eq!(request.skipped_tools.len(), 1);
}
