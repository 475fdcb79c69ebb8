//! JSON as chat templates write it: Hugging Face's `tojson` filter is Python's
//! `json.dumps(x, ensure_ascii=False)`, whose separators are `", "` and `": "`.
//! Key order is the request's (serde_json's `preserve_order`).

use serde_json::ser::{Formatter, Serializer};
use serde_json::Value;

struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(w, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// Python's item separator, before every array value and object key but the first.
fn separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// `value | tojson` as a Hugging Face chat template renders it.
pub fn tojson(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, PythonFormatter);
    // Serializing a Value into a Vec cannot fail, and serde_json writes UTF-8.
    serde::Serialize::serialize(value, &mut ser).expect("a JSON value serializes");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_separators_and_unescaped_unicode() {
        let v = json!({"b": [1, 2.5, null], "a": "é\n\"", "c": {}});
        assert_eq!(tojson(&v), r#"{"b": [1, 2.5, null], "a": "é\n\"", "c": {}}"#);
    }
}
