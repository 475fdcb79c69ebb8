//! The elements of a JSON array as their bytes, without decoding them: what a resent
//! history's raw addresses are hashed from (`history.rs`).

use std::ops::Range;

use super::field::offset_in;

/// The elements of `array`, a JSON text serde_json accepted, each as its bytes without
/// the whitespace around it; None when it is not an array. One pass that looks only for
/// what delimits the elements: a resent history is mostly strings, skipped from quote to
/// quote (the bytes in between are checked by the parse of whatever is not recognized).
pub(super) fn array_elements(array: &str) -> Option<Vec<&str>> {
    let bytes = array.as_bytes();
    let mut i = bytes.iter().position(|b| !b.is_ascii_whitespace())?;
    if bytes[i] != b'[' {
        return None;
    }
    i += 1;
    let mut elements = Vec::new();
    // The element being read: where it starts, and the end of its last byte so far
    // that is not whitespace.
    let mut start = None;
    let mut end = i;
    let mut depth = 0usize;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => {
                i += 1;
                continue;
            }
            b',' if depth == 0 => {
                elements.push(&array[start?..end]);
                start = None;
                i += 1;
                continue;
            }
            b']' | b'}' if depth == 0 => {
                if let Some(start) = start {
                    elements.push(&array[start..end]);
                }
                return Some(elements);
            }
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth -= 1,
            _ => {}
        }
        start.get_or_insert(i);
        i = if byte == b'"' {
            closing_quote(bytes, i + 1)
        } else {
            i
        } + 1;
        end = i;
    }
    None
}

/// The quote that ends the string whose content starts at `from`: the next quote not
/// escaped (preceded by an even number of backslashes).
fn closing_quote(bytes: &[u8], mut from: usize) -> usize {
    while let Some(offset) = memchr::memchr(b'"', &bytes[from.min(bytes.len())..]) {
        let quote = from + offset;
        let backslashes = bytes[..quote].iter().rev().take_while(|&&b| b == b'\\').count();
        if backslashes % 2 == 0 {
            return quote;
        }
        from = quote + 1;
    }
    bytes.len()
}

/// The bytes of `array`'s text that `elements` (leading elements of it, slices of it)
/// span: from the first one's start to the last one's end; empty when there are none.
pub(super) fn span_of(array: &str, elements: &[&str]) -> Range<usize> {
    let span =
        |(first, last): (&&str, &&str)| Some(offset_in(array, first)?..offset_in(array, last)? + last.len());
    elements
        .first()
        .zip(elements.last())
        .and_then(span)
        .unwrap_or(0..0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    /// A JSON value as text, spelled with the whitespace, escapes and nesting that could
    /// confuse a scanner looking only for delimiters.
    fn json_value() -> impl Strategy<Value = String> {
        let string = prop_oneof![
            Just(r#""""#.to_string()),
            Just(r#""a\"b""#.to_string()),
            Just(r#""\\""#.to_string()),
            Just(r#""\\\"]},[{""#.to_string()),
            Just(r#""\u0022\n""#.to_string()),
            "[a-z,\\[\\]{}:]{0,6}".prop_map(|s| format!("\"{s}\"")),
        ];
        let leaf = prop_oneof![
            string,
            Just("0".to_string()),
            Just("-1.5e3".to_string()),
            Just("true".to_string()),
            Just("null".to_string()),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            let space = prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r\n")];
            prop_oneof![
                (prop::collection::vec((inner.clone(), space.clone()), 0..4)).prop_map(|v| format!(
                    "[{}]",
                    v.into_iter()
                        .map(|(x, s)| format!("{s}{x}{s}"))
                        .collect::<Vec<_>>()
                        .join(",")
                )),
                (prop::collection::vec((inner, space), 0..4)).prop_map(|v| format!(
                    "{{{}}}",
                    v.into_iter()
                        .enumerate()
                        .map(|(i, (x, s))| format!("{s}\"k{i}\"{s}:{s}{x}{s}"))
                        .collect::<Vec<_>>()
                        .join(",")
                )),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn array_elements_are_the_elements_serde_json_reads(value in json_value(), space in "[ \n\t]{0,2}") {
            let text = format!("{space}{value}{space}");
            let by_serde = serde_json::from_str::<Vec<&RawValue>>(&text)
                .ok()
                .map(|elements| elements.iter().map(|e| e.get()).collect::<Vec<_>>());
            proptest::prop_assert_eq!(array_elements(&text), by_serde, "{}", text);
        }
    }
}
