//! Typed reads of raw JSON values (`&RawValue` slices of the frame) with errors that
//! name the value's path and say what was expected and what came instead.
//!
//! A request's top-level fields and its tools are deserialized into structs of raw
//! slices first, so fields nobody reads (Codex's `include`, `client_metadata`, ...) are
//! skipped without being materialised; only the fields validated here are decoded. The
//! input items, the bulk of the bytes, are read with `shape` instead.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::path::Path;
use crate::error::{Code, Error, Result};

/// What kind of JSON value this is, for messages ("an object", "a string", ...).
pub fn kind(raw: &RawValue) -> &'static str {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

pub fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

pub fn is_string(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('"')
}

/// Where `inner` starts in `outer` when it is a slice of it (a raw value borrowed from the
/// frame), by address; None when it is not (a value made elsewhere).
pub fn offset_in(outer: &str, inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

/// `found` is the kind of value that came instead ([`kind`]).
pub fn type_error(path: &Path, expected: &str, found: &str) -> Error {
    Error::new(
        Code::InvalidType,
        format!("Invalid type for '{path}': expected {expected}, but got {found} instead."),
    )
    .at(path.to_string())
}

pub fn string_above_max_length(path: &Path, len: usize, max_bytes: usize) -> Error {
    Error::new(
        Code::StringAboveMaxLength,
        format!("'{path}' is {len} bytes long, above the limit of {max_bytes} bytes."),
    )
    .at(path.to_string())
}

pub fn missing(path: &Path) -> Error {
    Error::new(
        Code::MissingRequiredParameter,
        format!("Missing required parameter: '{path}'."),
    )
    .at(path.to_string())
}

pub fn invalid_value(path: &Path, message: impl Into<String>) -> Error {
    Error::new(Code::InvalidValue, message).at(path.to_string())
}

/// A required field: present and not null.
pub fn required<'a>(raw: Option<&'a RawValue>, path: &Path) -> Result<&'a RawValue> {
    raw.ok_or_else(|| missing(path))
}

pub fn string(raw: &RawValue, path: &Path) -> Result<String> {
    if !is_string(raw) {
        return Err(type_error(path, "a string", kind(raw)));
    }
    // The frame was already parsed once, so this cannot fail on syntax.
    serde_json::from_str(raw.get()).map_err(|e| invalid_value(path, e.to_string()))
}

/// A string bounded in bytes (`Limits.max_text_bytes` or a protocol limit).
pub fn bounded_string(raw: &RawValue, path: &Path, max_bytes: usize) -> Result<String> {
    let s = string(raw, path)?;
    if s.len() > max_bytes {
        return Err(string_above_max_length(path, s.len(), max_bytes));
    }
    Ok(s)
}

pub fn opt_string(raw: Option<&RawValue>, path: &Path, max_bytes: usize) -> Result<Option<String>> {
    raw.map(|r| bounded_string(r, path, max_bytes)).transpose()
}

pub fn boolean(raw: &RawValue, path: &Path) -> Result<bool> {
    match raw.get().trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(type_error(path, "a boolean", kind(raw))),
    }
}

pub fn opt_bool(raw: Option<&RawValue>, path: &Path, default: bool) -> Result<bool> {
    raw.map_or(Ok(default), |r| boolean(r, path))
}

/// A number within `[min, max]`.
pub fn number_in(raw: &RawValue, path: &Path, min: f64, max: f64) -> Result<f64> {
    if kind(raw) != "a number" {
        return Err(type_error(path, "a number", kind(raw)));
    }
    let x: f64 = serde_json::from_str(raw.get()).map_err(|e| invalid_value(path, e.to_string()))?;
    if !(min..=max).contains(&x) {
        return Err(invalid_value(
            path,
            format!("Invalid '{path}': {x} is out of range; it must be between {min} and {max}."),
        ));
    }
    Ok(x)
}

/// A positive integer (`1`, not `1.0`).
pub fn positive_int(raw: &RawValue, path: &Path) -> Result<u64> {
    let text = raw.get().trim();
    if kind(raw) != "a number" {
        return Err(type_error(path, "an integer", kind(raw)));
    }
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err(invalid_value(
            path,
            format!("Invalid '{path}': {text}; it must be a positive integer."),
        )),
        Err(_) if text.starts_with('-') || text == "0" => Err(invalid_value(
            path,
            format!("Invalid '{path}': {text}; it must be a positive integer."),
        )),
        Err(_) if text.bytes().all(|b| b.is_ascii_digit()) => Err(invalid_value(
            path,
            format!("Invalid '{path}': {text} is too large."),
        )),
        Err(_) => Err(type_error(path, "an integer", kind(raw))),
    }
}

/// The elements of an array, as raw slices.
pub fn array<'a>(raw: &'a RawValue, path: &Path) -> Result<Vec<&'a RawValue>> {
    if !raw.get().trim_start().starts_with('[') {
        return Err(type_error(path, "an array", kind(raw)));
    }
    serde_json::from_str(raw.get()).map_err(|e| invalid_value(path, e.to_string()))
}

/// An array with at most `max` elements (`code` array_above_max_length otherwise).
pub fn bounded_array<'a>(raw: &'a RawValue, path: &Path, max: usize) -> Result<Vec<&'a RawValue>> {
    let items = array(raw, path)?;
    if items.len() > max {
        return Err(array_above_max_length(path, items.len(), max));
    }
    Ok(items)
}

pub fn array_above_max_length(path: &Path, len: usize, max: usize) -> Error {
    Error::new(
        Code::ArrayAboveMaxLength,
        format!("'{path}' has {len} elements, above the limit of {max}."),
    )
    .at(path.to_string())
}

/// An object read into a struct of raw fields. Only objects are accepted (serde would
/// also take an array for a struct, positionally).
pub fn object<'a, T: Deserialize<'a>>(raw: &'a RawValue, path: &Path) -> Result<T> {
    if !is_object(raw) {
        return Err(type_error(path, "an object", kind(raw)));
    }
    serde_json::from_str(raw.get()).map_err(|e| invalid_value(path, format!("Invalid '{path}': {e}.")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn strings_and_types() {
        let p = Path::root("model");
        assert_eq!(string(raw(r#""a\nb""#), &p).unwrap(), "a\nb");
        let e = string(raw("3"), &p).unwrap_err();
        assert_eq!(e.code, Code::InvalidType);
        assert_eq!(e.param.as_deref(), Some("model"));
        assert!(e.message.contains("got a number"), "{}", e.message);
        let e = bounded_string(raw(r#""abcd""#), &p, 3).unwrap_err();
        assert_eq!(e.code, Code::StringAboveMaxLength);
    }

    #[test]
    fn integers() {
        let p = Path::root("max_output_tokens");
        assert_eq!(positive_int(raw("42"), &p).unwrap(), 42);
        for bad in ["0", "-3", "1.5", "1e3", "99999999999999999999999"] {
            let e = positive_int(raw(bad), &p).unwrap_err();
            assert!(matches!(e.code, Code::InvalidValue | Code::InvalidType), "{bad}");
        }
        assert_eq!(
            positive_int(raw(r#""5""#), &p).unwrap_err().code,
            Code::InvalidType
        );
    }

    #[test]
    fn numbers_in_range() {
        let p = Path::root("temperature");
        assert_eq!(number_in(raw("0.5"), &p, 0.0, 2.0).unwrap(), 0.5);
        assert_eq!(
            number_in(raw("2.5"), &p, 0.0, 2.0).unwrap_err().code,
            Code::InvalidValue
        );
        assert_eq!(
            number_in(raw("true"), &p, 0.0, 2.0).unwrap_err().code,
            Code::InvalidType
        );
    }

    #[test]
    fn objects_only() {
        #[derive(Deserialize)]
        struct Pair<'a> {
            #[serde(borrow)]
            a: Option<&'a RawValue>,
        }
        let p = Path::root("reasoning");
        let pair: Pair = object(raw(r#"{"a": 1, "b": 2}"#), &p).unwrap();
        assert_eq!(pair.a.unwrap().get(), "1");
        assert_eq!(
            object::<Pair>(raw("[1]"), &p).err().unwrap().code,
            Code::InvalidType
        );
    }
}
