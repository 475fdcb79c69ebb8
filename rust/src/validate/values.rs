//! The boundary invariant: every value of an accepted frame can be serialized back and
//! loaded by a strict JSON parser (Python's `orjson`, SQLite's JSON functions).
//!
//! serde_json validates the syntax of a frame, but the slices the core passes through
//! raw (an unknown field of an item, a content part or a tool, `reasoning`, `metadata`,
//! `tools`, the input as sent) are skipped without being decoded, so two kinds of value
//! got through that strict parsers refuse:
//!
//! - numbers outside what a parser holds in 64 bits: a float literal whose value is not
//!   a finite f64 (`1e999`, `-1e999`), an integer literal outside i64/u64 (a 400-digit
//!   integer). They are refused, not normalized: rewriting a number would make the
//!   stored request differ from the one the client sent.
//! - `\u` escapes that are lone UTF-16 surrogates (`"\ud800"`, `"\udfff"`, a high
//!   surrogate followed by anything but a low one), in strings and in keys.
//!
//! [`check_values`] walks the whole frame once, right after serde_json accepted its
//! syntax, and refuses the first such value with `invalid_value` and the path of the
//! field that holds it (`input[0].zz`, `tools[2].foo`, `reasoning.effort`). It keeps
//! only a stack of open containers, and builds the path only for an error.

use std::ops::Range;

use crate::error::{Code, Error, Result};

/// An open container, with where the scan is inside it.
enum Open {
    Object {
        /// The current key, as a byte range of the frame (without its quotes).
        key: (usize, usize),
        /// The next string is a key (after `{` or a `,`).
        expects_key: bool,
    },
    Array {
        index: usize,
    },
}

/// Check every number and string escape of `text`, a JSON text serde_json already
/// accepted. The first value a strict parser would refuse is an `invalid_value` error
/// located at its field. Never panics, whatever `text` is.
pub fn check_values(text: &str) -> Result<()> {
    check_values_except(text, None)
}

/// Leading elements of an array that a check passes over: `bytes`, the span of `text`
/// from the first one's start to the last one's end, holds `elements` of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Skip {
    pub bytes: Range<usize>,
    pub elements: usize,
}

/// [`check_values`] without reading the elements in `skip`: those of a history resent
/// by its key, byte for byte, whose values were checked when it sent them
/// (`history.rs`). Errors elsewhere are located as [`check_values`] locates them.
pub fn check_values_except(text: &str, skip: Option<Skip>) -> Result<()> {
    let bytes = text.as_bytes();
    let mut stack: Vec<Open> = Vec::new();
    let skip = skip.filter(|s| s.elements > 0 && s.bytes.end <= bytes.len());
    let (skip_at, skip_to, skipped) =
        skip.map_or((usize::MAX, 0, 0), |s| (s.bytes.start, s.bytes.end, s.elements));
    let mut i = 0;
    while i < bytes.len() {
        if i == skip_at {
            // The array's first element: the scan resumes after the last one skipped,
            // as if it had counted the commas between them.
            if let Some(Open::Array { index }) = stack.last_mut() {
                *index += skipped - 1;
                i = skip_to;
                continue;
            }
        }
        match bytes[i] {
            b'"' => {
                let end = string_end(bytes, i + 1).map_err(|r| refuse(text, &stack, r))?;
                if let Some(Open::Object { key, expects_key }) = stack.last_mut() {
                    if *expects_key {
                        *key = (i + 1, end);
                        *expects_key = false;
                    }
                }
                i = end + 1;
            }
            b'{' => {
                stack.push(Open::Object {
                    key: (i, i),
                    expects_key: true,
                });
                i += 1;
            }
            b'[' => {
                stack.push(Open::Array { index: 0 });
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                i += 1;
            }
            b',' => {
                match stack.last_mut() {
                    Some(Open::Array { index }) => *index += 1,
                    Some(Open::Object { expects_key, .. }) => *expects_key = true,
                    None => {}
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let end = number_end(bytes, i);
                check_number(&text[i..end]).map_err(|problem| refuse(text, &stack, problem))?;
                i = end;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// The index of the quote closing the string whose content starts at `start`, or the
/// lone surrogate escape in it.
fn string_end(bytes: &[u8], start: usize) -> std::result::Result<usize, String> {
    let mut i = start;
    loop {
        // Strings are most of a frame's bytes: jump to the next quote or backslash.
        // An escape may claim bytes past the end of a truncated text.
        let rest = bytes.get(i..).unwrap_or_default();
        let Some(offset) = memchr::memchr2(b'"', b'\\', rest) else {
            return Ok(bytes.len());
        };
        i += offset;
        if bytes[i] == b'"' {
            return Ok(i);
        }
        if bytes.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let unit = hex4(bytes, i + 2);
        match unit {
            Some(0xD800..=0xDBFF) => {
                let low = if bytes.get(i + 6..i + 8) == Some(b"\\u") {
                    hex4(bytes, i + 8)
                } else {
                    None
                };
                if !matches!(low, Some(0xDC00..=0xDFFF)) {
                    return Err(lone_surrogate(
                        bytes,
                        i,
                        "a high surrogate not followed by a low one",
                    ));
                }
                i += 12;
            }
            Some(0xDC00..=0xDFFF) => {
                return Err(lone_surrogate(
                    bytes,
                    i,
                    "a low surrogate without a high one before it",
                ))
            }
            _ => i += 6,
        }
    }
}

fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

fn lone_surrogate(bytes: &[u8], at: usize, what: &str) -> String {
    let escape = String::from_utf8_lossy(&bytes[at..bytes.len().min(at + 6)]);
    format!(
        "the escape '{escape}' is {what} (a lone UTF-16 surrogate is not a character, \
         and strict JSON parsers refuse it)"
    )
}

/// The end of the number token starting at `start`.
fn number_end(bytes: &[u8], start: usize) -> usize {
    let len = bytes[start..]
        .iter()
        .position(|&b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .unwrap_or(bytes.len() - start);
    start + len
}

/// A number a strict parser holds: an integer literal within i64/u64, any other literal
/// a finite f64.
fn check_number(literal: &str) -> std::result::Result<(), String> {
    let integer = !literal.contains(['.', 'e', 'E']);
    // Up to 18 digits always fit; longer ones are parsed to know.
    if integer && literal.len() <= 18 {
        return Ok(());
    }
    let fits = if integer {
        literal.parse::<i64>().is_ok() || literal.parse::<u64>().is_ok()
    } else {
        literal.parse::<f64>().is_ok_and(f64::is_finite)
    };
    if fits {
        return Ok(());
    }
    let shown = if literal.len() > 24 {
        format!("{}... ({} characters)", &literal[..16], literal.len())
    } else {
        literal.to_string()
    };
    Err(if integer {
        format!("the integer {shown} does not fit in 64 bits (between -2^63 and 2^64-1)")
    } else {
        format!("the number {shown} is out of the range of a double (it overflows to infinity)")
    })
}

/// The error for `problem`, located at the field the scan is in.
fn refuse(text: &str, stack: &[Open], problem: String) -> Error {
    let mut param = String::new();
    for open in stack {
        match open {
            // An object still waiting for its key is where a refused key sits: the
            // error is located at that object.
            Open::Object {
                expects_key: true, ..
            } => {}
            Open::Object {
                key: (start, end), ..
            } => {
                if !param.is_empty() {
                    param.push('.');
                }
                param.push_str(&text[*start..*end]);
            }
            Open::Array { index } => param.push_str(&format!("[{index}]")),
        }
    }
    let at = if param.is_empty() { "the request" } else { &param };
    let error = Error::new(Code::InvalidValue, format!("Invalid value in '{at}': {problem}."));
    if param.is_empty() {
        error
    } else {
        error.at(param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(text: &str) -> Option<String> {
        let e = check_values(text).expect_err(text);
        assert_eq!(e.code, Code::InvalidValue, "{text}");
        e.param
    }

    #[test]
    fn skipped_elements_are_not_read_and_the_rest_is_located_after_them() {
        let text = r#"{"input":[1e999, "\ud800",{"a":-1e999}],"b":2}"#;
        let start = text.find('[').unwrap() + 1;
        let end = text.find(",{").unwrap();
        let skip = |elements| Skip {
            bytes: start..end,
            elements,
        };
        let e = check_values_except(text, Some(skip(2))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[2].a"));
        // Without the skip, the first element is refused.
        assert_eq!(param(text).as_deref(), Some("input[0]"));
        let fine = text.replace("-1e999", "1");
        check_values_except(&fine, Some(skip(2))).unwrap();
    }

    #[test]
    fn ordinary_values_pass() {
        for text in [
            r#"{"a":[1,-2,3.5,1e10,-1.5E-300,0,18446744073709551615,-9223372036854775808]}"#,
            r#"{"s":"\u00e9\ud83d\ude00\n\"\\","t":true,"n":null,"o":{"x":[{}]}}"#,
            r#"{"tiny":1e-999,"max":1.7976931348623157e308}"#,
        ] {
            check_values(text).unwrap();
        }
    }

    #[test]
    fn numbers_outside_64_bits_are_refused_at_their_field() {
        let huge = "9".repeat(400);
        let cases = [
            (
                r#"{"input":[{"type":"message","zz":1e999}]}"#.to_string(),
                "input[0].zz",
            ),
            (r#"{"a":{"b":[0,[1,-1e999]]}}"#.to_string(), "a.b[1][1]"),
            (
                format!(r#"{{"tools":[{{}},{{}},{{"foo":{huge}}}]}}"#),
                "tools[2].foo",
            ),
            (r#"{"x":18446744073709551616}"#.to_string(), "x"),
            (r#"{"x":-9223372036854775809}"#.to_string(), "x"),
            (format!(r#"{{"x":{huge}.5}}"#), "x"),
        ];
        for (text, expected) in cases {
            assert_eq!(param(&text).as_deref(), Some(expected), "{text}");
        }
        let e = check_values(&format!(r#"{{"x":{huge}}}"#)).unwrap_err();
        assert!(e.message.contains("400 characters"), "{}", e.message);
    }

    #[test]
    fn lone_surrogates_are_refused_at_their_field() {
        let cases = [
            (r#"{"reasoning":{"effort":"\ud800"}}"#, "reasoning.effort"),
            (r#"{"a":["ok","\udfff"]}"#, "a[1]"),
            (r#"{"a":"\ud800\u0041"}"#, "a"),
            (r#"{"a":"\ud800x"}"#, "a"),
            (r#"{"a":"x\uDBFF"}"#, "a"),
            (r#"{"m":{"k":"v","\ud800":"v"}}"#, "m"),
        ];
        for (text, expected) in cases {
            assert_eq!(param(text).as_deref(), Some(expected), "{text}");
        }
    }

    #[test]
    fn never_panics_on_truncated_text() {
        for text in [
            r#"{"a":"\ud8"#,
            r#"{"a":"\"#,
            "{\"a\":1e",
            "-",
            "\"",
            "]]}}",
            r#"{"a":"\ud800\u"#,
        ] {
            let _ = check_values(text);
        }
    }
}
