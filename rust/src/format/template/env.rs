//! The Jinja environment Hugging Face renders chat templates in, rebuilt on minijinja:
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python's string and dict methods
//! (minijinja-contrib's pycompat), and the three names transformers adds: the `tojson`
//! filter (Python's `json.dumps`, not Jinja's HTML-safe one), `raise_exception` and
//! `strftime_now`. transformers' `{% generation %}` block only marks assistant text for
//! training masks; it renders its body unchanged, so it is rewritten to an always-true
//! `if` before compiling.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{escape_formatter, Environment, Error as JinjaError, ErrorKind, Output, State};

use super::pyjson::Dumps;

/// Name of the only template in an environment.
pub const TEMPLATE: &str = "chat_template";

/// An environment holding `source` as [`TEMPLATE`], configured as transformers does.
pub fn environment(source: &str) -> Result<Environment<'static>, JinjaError> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    // Python's None is not iterable (templates test `tools is iterable` before `| length`).
    env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
    env.set_formatter(python_formatter);
    env.add_template_owned(TEMPLATE, without_generation_tags(source))?;
    Ok(env)
}

/// `{{ value }}` as Jinja2 prints Python objects: `True`, `None`, `['a', 1]`, `{'k': 'v'}`.
fn python_formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), JinjaError> {
    match value.kind() {
        ValueKind::Bool | ValueKind::None | ValueKind::Seq | ValueKind::Map | ValueKind::Number => {
            let mut text = String::new();
            python_repr(value, &mut text);
            out.write_str(&text).map_err(JinjaError::from)
        }
        _ => escape_formatter(out, state, value),
    }
}

/// Python's `repr` of a template value (`str` for the top level is the caller's).
fn python_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => match value.as_i64() {
            Some(i) if value.is_integer() => out.push_str(&i.to_string()),
            _ => match f64::try_from(value.clone()) {
                Ok(f) => out.push_str(&super::pyjson::float_repr(f)),
                Err(_) => out.push_str(&value.to_string()),
            },
        },
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&key, out);
                out.push_str(": ");
                python_repr(&value.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, JinjaError> {
    let arg = |i: usize, name: &str| -> Result<Option<Value>, JinjaError> {
        match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Ok(Some(v)),
            None => Ok(args.get(i).cloned()),
        }
    };
    let mut dumps = Dumps::default();
    if let Some(v) = arg(0, "ensure_ascii")? {
        dumps.ensure_ascii = v.is_true();
    }
    if let Some(v) = arg(1, "indent")? {
        if let Some(n) = v.as_i64() {
            let n = n.max(0) as u64;
            // Paid for before it is made: `indent=10**12` must fail, not abort.
            state.consume_fuel(n / FUEL_BYTES)?;
            dumps.indent = Some(" ".repeat(n as usize));
        } else if let Some(s) = v.as_str() {
            dumps.indent = Some(s.to_owned());
        }
    }
    if let Some(v) = arg(2, "separators")? {
        if !v.is_none() {
            let item = v.get_item_by_index(0)?;
            let key = v.get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(item), Some(key)) => dumps.separators = Some((item.to_owned(), key.to_owned())),
                _ => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        "separators must be two strings",
                    ))
                }
            }
        }
    }
    if let Some(v) = arg(3, "sort_keys")? {
        dumps.sort_keys = v.is_true();
    }
    kwargs.assert_all_used()?;
    if value.is_undefined() {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            "Object of type Undefined is not JSON serializable",
        ));
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("not JSON serializable: {e}")))?;
    if let Some(indent) = &dumps.indent {
        // Every line repeats the indent once per level: pay for that before writing it.
        let (nodes, depth) = shape(&json);
        state.consume_fuel((indent.len() as u64).saturating_mul(nodes).saturating_mul(depth) / FUEL_BYTES)?;
    }
    Ok(dumps.dumps(&json))
}

/// Bytes minijinja's fuel charges one unit for.
const FUEL_BYTES: u64 = 64;

/// The number of values in `json` and its nesting depth.
fn shape(json: &serde_json::Value) -> (u64, u64) {
    let children: Vec<&serde_json::Value> = match json {
        serde_json::Value::Array(a) => a.iter().collect(),
        serde_json::Value::Object(o) => o.values().collect(),
        _ => return (1, 1),
    };
    children
        .into_iter()
        .map(shape)
        .fold((1, 1), |(n, d), (cn, cd)| (n + cn, d.max(cd + 1)))
}

fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)`, in the local time zone like Python's.
fn strftime_now(format: String) -> Result<String, JinjaError> {
    Ok(jiff::ZonedDateTime::now().strftime(&format).to_string())
}

/// `{% generation %}`/`{% endgeneration %}` (with any whitespace control) rewritten to
/// `{% if true %}`/`{% endif %}` with the same control markers.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `tag` starts with a generation tag: its length and its replacement.
fn generation_tag(tag: &str) -> Option<(usize, String)> {
    let body = &tag[2..];
    let (open, body) = match body.as_bytes().first() {
        Some(b'-' | b'+') => (&body[..1], &body[1..]),
        _ => ("", body),
    };
    let trimmed = body.trim_start();
    let (word, replacement) = if let Some(r) = trimmed.strip_prefix("endgeneration") {
        (r, "endif")
    } else if let Some(r) = trimmed.strip_prefix("generation") {
        (r, "if true")
    } else {
        return None;
    };
    // The word must end here (`{% generations %}` is another tag).
    if !word.starts_with(|c: char| c.is_whitespace() || matches!(c, '-' | '+' | '%')) {
        return None;
    }
    let after = word.trim_start();
    let (close, after) = match after.as_bytes().first() {
        Some(b'-' | b'+') => (&after[..1], &after[1..]),
        _ => ("", after),
    };
    if !after.starts_with("%}") {
        return None;
    }
    let len = tag.len() - after.len() + 2;
    Some((len, format!("{{%{open} {replacement} {close}%}}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_always_true_blocks() {
        assert_eq!(
            without_generation_tags("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
        assert_eq!(without_generation_tags("{% generations %}"), "{% generations %}");
    }
}
