//! Python's `json.dumps`, byte for byte: Hugging Face's `tojson` filter is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
//! so a template's JSON must have Python's separators (`", "`/`": "`, or `","` with an
//! indent), Python's float repr (`1e-07`, `1e+20`, `1.0`) and its string escapes
//! (`\uXXXX` for control characters, surrogate pairs under `ensure_ascii`).

use std::fmt::Write;

use serde_json::Value;

/// The arguments of `json.dumps` a template may pass to `tojson`.
#[derive(Debug, Clone, Default)]
pub struct Dumps {
    pub ensure_ascii: bool,
    /// `indent=` as the string repeated per level (an int n is n spaces).
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; Python's default depends on `indent`.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

impl Dumps {
    pub fn dumps(&self, value: &Value) -> String {
        let (item, key) = match &self.separators {
            Some((item, key)) => (item.as_str(), key.as_str()),
            None if self.indent.is_some() => (",", ": "),
            None => (", ", ": "),
        };
        let mut out = String::new();
        Writer {
            options: self,
            item,
            key,
            out: &mut out,
        }
        .value(value, 0);
        out
    }
}

struct Writer<'a> {
    options: &'a Dumps,
    item: &'a str,
    key: &'a str,
    out: &'a mut String,
}

impl Writer<'_> {
    fn value(&mut self, value: &Value, level: usize) {
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => write!(self.out, "{i}").expect("writing to a String"),
                (_, Some(u), _) => write!(self.out, "{u}").expect("writing to a String"),
                (_, _, Some(f)) => self.out.push_str(&float_repr(f)),
                _ => self.out.push_str(&n.to_string()),
            },
            Value::String(s) => string(s, self.options.ensure_ascii, self.out),
            Value::Array(items) => {
                if items.is_empty() {
                    self.out.push_str("[]");
                    return;
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i == 0, level + 1);
                    self.value(item, level + 1);
                }
                self.close(level);
                self.out.push(']');
            }
            Value::Object(map) => {
                if map.is_empty() {
                    self.out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.options.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                self.out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    self.separator(i == 0, level + 1);
                    string(k, self.options.ensure_ascii, self.out);
                    self.out.push_str(self.key);
                    self.value(v, level + 1);
                }
                self.close(level);
                self.out.push('}');
            }
        }
    }

    fn separator(&mut self, first: bool, level: usize) {
        if !first {
            self.out.push_str(self.item);
        }
        self.newline(level);
    }

    fn close(&mut self, level: usize) {
        self.newline(level);
    }

    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.options.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }
}

/// A JSON string literal as Python writes it.
fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `repr(float)`: the shortest digits that round-trip (Rust's and Python's agree on
/// these), laid out as Python does: positional for exponents -4..16, else `d.ddde+XX`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let mantissa = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_as_python_reprs_them() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-7, "1e-07"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.2345e20, "1.2345e+20"),
            (100.0, "100.0"),
            (0.0, "0.0"),
        ];
        for (f, repr) in cases {
            assert_eq!(float_repr(f), repr, "{f}");
        }
    }

    #[test]
    fn separators_indent_and_escapes_follow_python() {
        let v = json!({"b": [1, 2.0, null, true], "a": "é\n\u{1}\"", "c": {}, "d": []});
        assert_eq!(
            Dumps::default().dumps(&v),
            r#"{"b": [1, 2.0, null, true], "a": "é\n\u0001\"", "c": {}, "d": []}"#
        );
        let ascii = Dumps {
            ensure_ascii: true,
            ..Dumps::default()
        };
        assert_eq!(ascii.dumps(&json!("é😀")), r#""\u00e9\ud83d\ude00""#);
        let indented = Dumps {
            indent: Some("  ".into()),
            sort_keys: true,
            ..Dumps::default()
        };
        assert_eq!(
            indented.dumps(&json!({"z": [1], "a": {}})),
            "{\n  \"a\": {},\n  \"z\": [\n    1\n  ]\n}"
        );
    }
}
