//! Client events of the WebSocket transport (protocol.md section 2): one JSON object per
//! text frame, dispatched on its `type`.

use serde_json::value::RawValue;

use super::field;
use super::input::{input_json, parse_input, Input};
use super::path::Path;
use super::request::{not_utf8, parse_object, Body, CreateRequest};
use super::values::check_values;
use super::Limits;
use crate::error::{Code, Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    Create(Box<CreateRequest>),
    Cancel {
        response_id: Option<String>,
        stream_id: Option<String>,
    },
    /// Sent by Codex after each response; the server ignores it.
    Processed {
        response_id: Option<String>,
    },
    Append(AppendEvent),
    /// Any other `type`: the server answers `unknown_event_type`.
    Unknown {
        kind: String,
        stream_id: Option<String>,
    },
}

/// `response.append` (protocol.md section 8): tool results for a paused response.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendEvent {
    pub response_id: Option<String>,
    pub error: Option<Error>,
    pub input: Input,
    pub input_json: String,
}

/// Parse one client frame. Malformed JSON, a frame that is not an object, or one
/// without a string `type` is an `invalid_json` error; a schema problem of a
/// `response.create` is kept in its `error`.
pub fn parse_event(frame: &[u8], limits: &Limits) -> Result<ClientEvent> {
    let mut event = read_event(frame, limits)?;
    if let ClientEvent::Create(request) = &mut event {
        request.frame_bytes = frame.len();
    }
    Ok(event)
}

fn read_event(frame: &[u8], limits: &Limits) -> Result<ClientEvent> {
    let text = std::str::from_utf8(frame).map_err(|_| not_utf8())?;
    let body: Body = parse_object(text, "The event")?;
    let kind = match body.kind {
        Some(k) if field::is_string(k) => field::string(k, &Path::root("type"))?,
        _ => {
            return Err(Error::new(
                Code::InvalidJson,
                "The event has no string 'type' (expected e.g. 'response.create').",
            ))
        }
    };
    // The boundary invariant, over the whole frame: a create or an append keeps the
    // refusal in its error slot (answered on its lane), any other event is refused.
    if let Err(e) = check_values(text) {
        return match kind.as_str() {
            "response.create" => Ok(ClientEvent::Create(Box::new(CreateRequest::refused(
                e,
                id(body.stream_id),
            )))),
            "response.append" => Ok(ClientEvent::Append(AppendEvent {
                response_id: id(body.response_id),
                error: Some(e),
                input: Input::default(),
                input_json: input_json(None),
            })),
            _ => Err(e),
        };
    }
    Ok(match kind.as_str() {
        "response.create" => ClientEvent::Create(Box::new(create(&body, text, limits))),
        "response.cancel" => ClientEvent::Cancel {
            response_id: id(body.response_id),
            stream_id: id(body.stream_id),
        },
        "response.processed" => ClientEvent::Processed {
            response_id: id(body.response_id),
        },
        "response.append" => {
            let (input, error) = match parse_input(body.input, limits) {
                Ok(input) => (input, None),
                Err(e) => (Input::default(), Some(e)),
            };
            ClientEvent::Append(AppendEvent {
                response_id: id(body.response_id),
                error,
                input,
                input_json: input_json(body.input),
            })
        }
        _ => ClientEvent::Unknown {
            kind,
            stream_id: id(body.stream_id),
        },
    })
}

fn create(body: &Body, frame: &str, limits: &Limits) -> CreateRequest {
    let Some(nested) = body.response else {
        return CreateRequest::from_body(body, frame, None, limits, None, None);
    };
    let path = Path::root("response");
    if !field::is_object(nested) {
        return CreateRequest::refused(
            field::type_error(&path, "an object", field::kind(nested)),
            id(body.stream_id),
        );
    }
    match field::object::<Body>(nested, &path) {
        Ok(inner) => CreateRequest::from_body(&inner, frame, body.stream_id, limits, None, None),
        Err(e) => CreateRequest::refused(e, id(body.stream_id)),
    }
}

/// Identifiers of events without an error slot are informative: a non-string reads as absent.
fn id(raw: Option<&RawValue>) -> Option<String> {
    raw.filter(|r| field::is_string(r))
        .and_then(|r| serde_json::from_str(r.get()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::{Item, Role};
    use crate::validate::InputJson;
    use serde_json::{json, Value};

    fn event(frame: &str) -> Result<ClientEvent> {
        parse_event(frame.as_bytes(), &Limits::default())
    }

    fn create_request(frame: &str) -> CreateRequest {
        match event(frame).unwrap() {
            ClientEvent::Create(r) => *r,
            other => panic!("not a create: {other:?}"),
        }
    }

    #[test]
    fn malformed_frames_are_invalid_json() {
        for frame in [
            "",
            "{",
            "[1]",
            "3",
            r#""response.create""#,
            "{}",
            r#"{"type": 3}"#,
            r#"{"type":"a","type":"b"}"#,
        ] {
            let e = event(frame).unwrap_err();
            assert_eq!(e.code, Code::InvalidJson, "{frame}: {}", e.message);
        }
        assert_eq!(
            parse_event(b"{\"type\":\"x\xff\"}", &Limits::default())
                .unwrap_err()
                .code,
            Code::InvalidJson
        );
        assert!(event("[1]")
            .unwrap_err()
            .message
            .contains("must be a JSON object"));
    }

    #[test]
    fn flat_and_nested_create_parse_alike() {
        let flat = create_request(
            r#"{"type":"response.create","model":"m","input":"hi","stream":true,"prompt_cache_key":"k",
                "include":["reasoning.encrypted_content"],"client_metadata":{"a":1},"text":{"verbosity":"low"}}"#,
        );
        let nested = create_request(
            r#"{"type":"response.create","response":{"model":"m","input":"hi","stream":true,"prompt_cache_key":"k","text":{"verbosity":"low"}}}"#,
        );
        assert_eq!(flat.error, None);
        assert_eq!(flat.input.items, nested.input.items);
        assert_eq!(flat.response_fields_json, nested.response_fields_json);
        assert_eq!(flat.model.as_deref(), Some("m"));
        assert!(flat.stream && flat.store && flat.generate);
        let nested =
            create_request(r#"{"type":"response.create","stream_id":"lane","response":{"input":[]}}"#);
        assert_eq!(nested.stream_id.as_deref(), Some("lane"));
        let bad = create_request(r#"{"type":"response.create","stream_id":"l","response":[1]}"#);
        assert_eq!(bad.error.as_ref().map(|e| e.code), Some(Code::InvalidType));
        assert_eq!(bad.stream_id.as_deref(), Some("l"));
    }

    #[test]
    fn response_fields_have_defaults_and_nulls() {
        let r = create_request(r#"{"type":"response.create","input":"x","instructions":"\"model\":null"}"#);
        let at = r.response_fields_json.find(r#""model":null"#).unwrap();
        assert!(
            r.response_fields_json[..at].ends_with(r#"{},"#),
            "{}",
            r.response_fields_json
        );
        let r = create_request(r#"{"type":"response.create","input":"x"}"#);
        let fields: Value = serde_json::from_str(&r.response_fields_json).unwrap();
        assert_eq!(
            fields,
            json!({
                "instructions": null, "max_output_tokens": null, "metadata": {}, "model": null,
                "parallel_tool_calls": true, "previous_response_id": null,
                "reasoning": {"effort": null, "summary": null},
                "store": true, "temperature": 1.0, "text": {"format": {"type": "text"}},
                "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
                // Open Responses requires these with a value: the API's defaults.
                "frequency_penalty": 0.0, "presence_penalty": 0.0, "top_logprobs": 0,
                "service_tier": "default", "max_tool_calls": null, "safety_identifier": null,
                "prompt_cache_key": null
            })
        );
        let r = create_request(
            r#"{"type":"response.create","model":"gpt-oss","instructions":"be \"brief\"","max_output_tokens":64,
                "metadata":{"k":"v"},"parallel_tool_calls":false,"previous_response_id":"resp_1",
                "reasoning":{"effort":"high","summary":"auto"},"store":false,"temperature":0.5,
                "text":{"format":{"type":"json_object"}},"tool_choice":{"type":"function","name":"f"},
                "tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"}],
                "top_p":0.9,"truncation":"auto","generate":false,"stream_id":"a.b-c_1"}"#,
        );
        assert_eq!(r.error, None);
        let fields: Value = serde_json::from_str(&r.response_fields_json).unwrap();
        assert_eq!(
            fields,
            json!({
                "instructions": "be \"brief\"", "max_output_tokens": 64, "metadata": {"k": "v"},
                "model": "gpt-oss", "parallel_tool_calls": false, "previous_response_id": "resp_1",
                "reasoning": {"effort": "high", "summary": "auto"}, "store": false, "temperature": 0.5,
                "text": {"format": {"type": "json_object"}}, "tool_choice": {"type": "function", "name": "f"},
                "tools": [
                    {"type":"function","name":"f","parameters":{"type":"object"},"description":null,"strict":true},
                    {"type":"web_search"}
                ],
                "top_p": 0.9, "truncation": "auto",
                "frequency_penalty": 0.0, "presence_penalty": 0.0, "top_logprobs": 0,
                "service_tier": "default", "max_tool_calls": null, "safety_identifier": null,
                "prompt_cache_key": null
            })
        );
        assert!(!r.generate && !r.store);
        assert_eq!(r.prefix.reasoning_effort.as_deref(), Some("high"));
        assert_eq!(r.prefix.tools.len(), 1);
        assert_eq!(r.skipped_tools.len(), 1);
        assert_eq!(r.max_output_tokens, Some(64));
        assert_eq!(r.stream_id.as_deref(), Some("a.b-c_1"));
    }

    #[test]
    fn schema_problems_stay_in_the_request() {
        let cases: &[(&str, Code, &str)] = &[
            (r#""temperature":3"#, Code::InvalidValue, "temperature"),
            (r#""top_p":-0.1"#, Code::InvalidValue, "top_p"),
            (
                r#""max_output_tokens":0"#,
                Code::InvalidValue,
                "max_output_tokens",
            ),
            (
                r#""max_output_tokens":"5""#,
                Code::InvalidType,
                "max_output_tokens",
            ),
            (r#""store":"no""#, Code::InvalidType, "store"),
            (r#""model":1"#, Code::InvalidType, "model"),
            (r#""metadata":{"a":1}"#, Code::InvalidType, "metadata.a"),
            (r#""metadata":[]"#, Code::InvalidType, "metadata"),
            (
                r#""reasoning":{"effort":"extreme"}"#,
                Code::InvalidValue,
                "reasoning.effort",
            ),
            (r#""truncation":"sometimes""#, Code::InvalidValue, "truncation"),
            (
                r#""text":{"format":{"type":"yaml"}}"#,
                Code::InvalidValue,
                "text.format.type",
            ),
            (r#""instructions":["x"]"#, Code::InvalidType, "instructions"),
            (
                r#""input":[{"role":"user","content":[{"type":"input_audio"}]}]"#,
                Code::UnsupportedContent,
                "input[0].content[0]",
            ),
        ];
        for (fields, code, param) in cases {
            let r = create_request(&format!(
                r#"{{"type":"response.create","stream_id":"s",{fields}}}"#
            ));
            let e = r.error.expect(fields);
            assert_eq!(
                (e.code, e.param.as_deref()),
                (*code, Some(*param)),
                "{fields}: {}",
                e.message
            );
            assert_eq!(r.stream_id.as_deref(), Some("s"));
            assert_eq!(r.response_fields_json, "{}");
        }
        let many: String = (0..17)
            .map(|i| format!(r#""k{i}":"v""#))
            .collect::<Vec<_>>()
            .join(",");
        let r = create_request(&format!(r#"{{"type":"response.create","metadata":{{{many}}}}}"#));
        assert_eq!(r.error.unwrap().param.as_deref(), Some("metadata"));
    }

    /// Issue 15 items 1 and 2: values a strict parser refuses, in every field the core
    /// passes through raw, are refused with `invalid_value` at their field, never echoed.
    #[test]
    fn values_strict_parsers_refuse_are_refused_at_their_field() {
        let huge = "9".repeat(400);
        let cases = [
            (
                r#""store":true,"input":[{"type":"message","role":"user","content":"hi","zz":1e999}]"#
                    .to_string(),
                "input[0].zz",
            ),
            (
                r#""input":[{"role":"user","content":[{"type":"input_text","text":"a","zz":-1e999}]}]"#
                    .to_string(),
                "input[0].content[0].zz",
            ),
            (
                r#""input":[{"type":"reasoning","summary":[],"encrypted_content":"\ud800"}]"#.to_string(),
                "input[0].encrypted_content",
            ),
            (
                format!(
                    r#""tools":[{{"type":"function","name":"f"}},{{"type":"web_search"}},{{"type":"function","name":"g","foo":{huge}}}]"#
                ),
                "tools[2].foo",
            ),
            (
                r#""tools":[{"type":"web_search","filters":{"x":1e999}}]"#.to_string(),
                "tools[0].filters.x",
            ),
            (
                r#""tools":[{"type":"custom","name":"c","format":"\udfff"}]"#.to_string(),
                "tools[0].format",
            ),
            (
                r#""reasoning":{"effort":"\ud800"}"#.to_string(),
                "reasoning.effort",
            ),
            (
                r#""reasoning":{"effort":"low","x":1e999}"#.to_string(),
                "reasoning.x",
            ),
            (r#""metadata":{"k":"\ud800\u0041"}"#.to_string(), "metadata.k"),
            (
                r#""tool_choice":{"type":"web_search","x":1e400}"#.to_string(),
                "tool_choice.x",
            ),
            (
                r#""client_metadata":{"x":18446744073709551616}"#.to_string(),
                "client_metadata.x",
            ),
            (
                r#""text":{"format":{"type":"text"},"v":1e999}"#.to_string(),
                "text.v",
            ),
        ];
        for (fields, param) in &cases {
            let frame = format!(r#"{{"type":"response.create","stream_id":"s",{fields}}}"#);
            let r = create_request(&frame);
            let e = r.error.expect(fields);
            assert_eq!(
                (e.code, e.param.as_deref()),
                (Code::InvalidValue, Some(*param)),
                "{fields}: {}",
                e.message
            );
            assert_eq!(r.stream_id.as_deref(), Some("s"));
            assert_eq!(
                (r.response_fields_json.as_str(), r.input_json.text(&frame)),
                ("{}", "[]")
            );
            let http = crate::validate::parse_request(format!("{{{fields}}}").as_bytes(), &Limits::default())
                .unwrap();
            assert_eq!(
                http.error.map(|e| e.param),
                Some(Some(param.to_string())),
                "{fields}"
            );
        }
        let nested = create_request(
            r#"{"type":"response.create","response":{"input":[{"role":"user","content":"x","zz":1e999}]}}"#,
        );
        assert_eq!(
            nested.error.unwrap().param.as_deref(),
            Some("response.input[0].zz")
        );
        let ClientEvent::Append(append) =
            event(r#"{"type":"response.append","input":[{"type":"function_call_output","call_id":"c","output":"\ud800"}]}"#).unwrap()
        else {
            panic!("not an append")
        };
        assert_eq!(append.error.unwrap().param.as_deref(), Some("input[0].output"));
        let e = event(r#"{"type":"response.cancel","stream_id":"s","x":1e999}"#).unwrap_err();
        assert_eq!((e.code, e.param.as_deref()), (Code::InvalidValue, Some("x")));
    }

    /// What the core accepts it can serialize back: the echoed fields and the input
    /// load in a strict parse, numbers and escapes at the edge of the range included.
    #[test]
    fn accepted_values_round_trip() {
        let frame = r#"{"type":"response.create","input":[{"role":"user","content":"\ud83d\ude00","zz":1.7976931348623157e308,"n":-9223372036854775808}],
                "tools":[{"type":"web_search","u":18446744073709551615}],"reasoning":{"effort":"low","t":1e-999}}"#;
        let r = create_request(frame);
        assert_eq!(r.error, None);
        for json in [r.response_fields_json.as_str(), r.input_json.text(frame)] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::from_str::<Value>(&value.to_string()).unwrap(), value);
        }
    }

    #[test]
    fn other_events() {
        assert_eq!(
            event(r#"{"type":"response.cancel","response_id":"resp_1","stream_id":"s"}"#).unwrap(),
            ClientEvent::Cancel {
                response_id: Some("resp_1".into()),
                stream_id: Some("s".into())
            }
        );
        assert_eq!(
            event(r#"{"type":"response.processed","response_id":"resp_1"}"#).unwrap(),
            ClientEvent::Processed {
                response_id: Some("resp_1".into())
            }
        );
        assert_eq!(
            event(r#"{"type":"session.update","stream_id":7}"#).unwrap(),
            ClientEvent::Unknown {
                kind: "session.update".into(),
                stream_id: None
            }
        );
        let ClientEvent::Append(append) = event(
            r#"{"type":"response.append","response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c","output":"ok"}]}"#,
        )
        .unwrap() else {
            panic!("not an append")
        };
        assert_eq!(append.error, None);
        assert_eq!(
            append.input.items,
            vec![Item::FunctionCallOutput {
                call_id: "c".into(),
                output: "ok".into()
            }]
        );
        let ClientEvent::Append(bad) = event(r#"{"type":"response.append","input":[{"type":"x"}]}"#).unwrap()
        else {
            panic!("not an append")
        };
        assert_eq!(bad.error.map(|e| e.code), Some(Code::UnsupportedContent));
    }

    #[test]
    fn prewarm_overrides_generate() {
        let prewarm = create_request(
            r#"{"type":"response.create","model":"m","input":"hi","prompt_cache_options":{"prewarm":true}}"#,
        );
        assert_eq!(prewarm.error, None);
        assert!(!prewarm.generate);
        let generating = create_request(
            r#"{"type":"response.create","model":"m","input":"hi","prompt_cache_options":{"prewarm":false}}"#,
        );
        assert!(generating.generate);
    }

    #[test]
    fn codex_warm_up_then_delta() {
        let warm_up = create_request(
            r#"{"type":"response.create","model":"gpt-5-codex","generate":false,"store":false,"stream":true,
                "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]}],
                "tools":[{"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"],"additionalProperties":false},"strict":false},
                         {"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: x"}}],
                "tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"medium","summary":"auto"},
                "include":["reasoning.encrypted_content"],"prompt_cache_key":"abc","text":{"verbosity":"medium"}}"#,
        );
        assert_eq!(warm_up.error, None);
        assert!(!warm_up.generate);
        assert_eq!(
            warm_up.input.items,
            vec![Item::Message {
                role: Role::Developer,
                text: "You are Codex.".into()
            }]
        );
        let frame = r#"{"type":"response.create","previous_response_id":"resp_1","store":false,
                "input":[{"type":"function_call_output","call_id":"call_1","output":"exit 0"}]}"#;
        let delta = create_request(frame);
        assert_eq!(delta.error, None);
        assert_eq!(delta.previous_response_id.as_deref(), Some("resp_1"));
        // The array as sent, read from the frame (not copied).
        assert!(matches!(delta.input_json, InputJson::InFrame(_)));
        assert_eq!(
            delta.input_json.text(frame),
            r#"[{"type":"function_call_output","call_id":"call_1","output":"exit 0"}]"#
        );
    }

    #[test]
    fn http_bodies() {
        let r = crate::validate::parse_request(
            br#"{"model":"m","input":"hi","stream":true}"#,
            &Limits::default(),
        )
        .unwrap();
        assert!(r.stream);
        assert_eq!(r.input.items.len(), 1);
        assert_eq!(
            crate::validate::parse_request(b"[]", &Limits::default())
                .unwrap_err()
                .code,
            Code::InvalidJson
        );
    }

    /// An `input` array is read from the body it came in, not copied; a string input
    /// is written as its one message; either way the JSON is the input as items.
    #[test]
    fn input_json_is_read_from_the_body() {
        let body = r#"{"model":"m", "input" : [ {"role":"user","content":"hi \u00e9"} ] ,"stream":true}"#;
        let r = crate::validate::parse_request(body.as_bytes(), &Limits::default()).unwrap();
        assert!(matches!(r.input_json, InputJson::InFrame(_)));
        assert_eq!(
            r.input_json.text(body),
            r#"[ {"role":"user","content":"hi \u00e9"} ]"#
        );
        let r = crate::validate::parse_request(br#"{"input":"hi"}"#, &Limits::default()).unwrap();
        assert_eq!(
            r.input_json,
            InputJson::Built(r#"[{"type":"message","role":"user","content":"hi"}]"#.into())
        );
        let r = crate::validate::parse_request(br#"{"model":"m"}"#, &Limits::default()).unwrap();
        assert_eq!(r.input_json, InputJson::Built("[]".into()));
    }
}
