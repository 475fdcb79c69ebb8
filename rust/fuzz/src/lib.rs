//! What the fuzz targets assert about whatever the core accepts: the boundary
//! invariant, checked by an oracle written apart from the core's own check
//! (`validate::check_values`), so a bug in one is not hidden by the same bug in the other.

use hotloop_core::validate::{AppendEvent, ClientEvent, CreateRequest};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// `json` is one JSON value a strict parser (Python's orjson) loads unchanged: strings
/// decode without lone surrogates (serde_json refuses them when it decodes a String),
/// an integer literal fits i64 or u64, any other number literal is a finite double.
pub fn assert_strict(json: &str) {
    let raw: &RawValue = serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    strict(raw);
}

fn strict(raw: &RawValue) {
    let text = raw.get().trim();
    match text.as_bytes().first() {
        Some(b'{') => {
            let map: BTreeMap<String, &RawValue> = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("object a strict parser refuses ({e}): {text}"));
            map.values().for_each(|v| strict(v));
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).expect("an array");
            items.iter().for_each(|v| strict(v));
        }
        Some(b'"') => {
            serde_json::from_str::<String>(text)
                .unwrap_or_else(|e| panic!("string a strict parser refuses ({e}): {text}"));
        }
        Some(b't' | b'f' | b'n') => {}
        _ if text.contains(['.', 'e', 'E']) => {
            let x: f64 = text.parse().unwrap_or_else(|e| panic!("number ({e}): {text}"));
            assert!(x.is_finite(), "number outside a double: {text}");
        }
        _ => assert!(
            text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok(),
            "integer outside 64 bits: {text}"
        ),
    }
}

/// An accepted request: the frame and everything it echoes or stores load strictly.
pub fn assert_accepted_request(frame: &str, request: &CreateRequest) {
    if request.error.is_some() {
        return;
    }
    assert_strict(frame);
    assert_strict(&request.response_fields_json);
    assert_strict(request.input_json.text(frame));
    assert_eq!(request.frame_bytes, frame.len());
}

/// Any accepted event of a frame: the invariant for what it carries.
pub fn assert_accepted_event(frame: &str, event: &ClientEvent) {
    match event {
        ClientEvent::Create(request) => assert_accepted_request(frame, request),
        ClientEvent::Append(AppendEvent {
            error: None,
            input_json,
            ..
        }) => {
            assert_strict(frame);
            assert_strict(input_json);
        }
        ClientEvent::Append(_) => {}
        ClientEvent::Cancel { .. } | ClientEvent::Processed { .. } | ClientEvent::Unknown { .. } => {
            assert_strict(frame)
        }
    }
}
