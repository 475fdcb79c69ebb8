//! JSON Schema to the TypeScript-like signatures harmony puts in the developer message
//! (`type get_weather = (_: { location: string, ... }) => any;`).
//!
//! gpt-oss was trained on exactly what openai-harmony renders, quirks included (the
//! `default:` comment quotes a string default only when the schema is not an enum; a
//! `oneOf` property lists its variants on ` | ` lines), so this reproduces its output
//! byte for byte rather than producing "nicer" TypeScript.

use foldhash::HashSet;
use serde_json::Value;

fn is_enum(schema: &Value) -> bool {
    schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn str_field<'a>(schema: &'a Value, key: &str) -> Option<&'a str> {
    schema.get(key).and_then(Value::as_str)
}

/// `default: ...` as harmony writes it; `quote_enum_default` is its one inconsistency:
/// a top-level `oneOf` variant prints an enum's string default as JSON (quoted).
fn default_comment(schema: &Value, default: &Value, quote_enum_default: bool) -> String {
    match default.as_str() {
        Some(s) if !is_enum(schema) => format!("default: \"{s}\""),
        Some(s) if !quote_enum_default => format!("default: {s}"),
        _ => format!("default: {default}"),
    }
}

/// `T | null` for `nullable: true`, unless the type already mentions null.
fn with_nullable(schema: &Value, ty: String) -> String {
    let nullable = schema.get("nullable").and_then(Value::as_bool).unwrap_or(false);
    if nullable && !ty.contains("null") {
        format!("{ty} | null")
    } else {
        ty
    }
}

/// The TypeScript type of `schema`; nested lines start with `indent`.
pub fn typescript(schema: &Value, indent: &str) -> String {
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        return one_of(variants, indent);
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, indent),
        Some("string") => {
            let literals: Vec<String> = schema
                .get("enum")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(|s| format!("\"{s}\""))
                        .collect()
                })
                .unwrap_or_default();
            if literals.is_empty() {
                "string".to_owned()
            } else {
                literals.join(" | ")
            }
        }
        Some("number" | "integer") => "number".to_owned(),
        Some("boolean") => "boolean".to_owned(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", typescript(items, indent)),
            None => "Array<any>".to_owned(),
        },
        _ => "any".to_owned(),
    }
}

/// A top-level `oneOf`: one ` | variant // comments` line per variant.
fn one_of(variants: &[Value], indent: &str) -> String {
    let mut out = String::new();
    let inner = format!("{indent}   ");
    for variant in variants {
        out.push_str(&format!("\n{indent} | "));
        out.push_str(&with_nullable(variant, typescript(variant, &inner)));
        let mut comments = Vec::new();
        if let Some(desc) = str_field(variant, "description") {
            comments.push(desc.to_owned());
        }
        if let Some(default) = variant.get("default") {
            comments.push(default_comment(variant, default, true));
        }
        if !comments.is_empty() {
            out.push_str(&format!(" // {}", comments.join(" ")));
        }
    }
    out
}

fn object(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(desc) = str_field(schema, "description") {
        out.push_str(&format!("{indent}// {desc}\n"));
    }
    out.push_str("{\n");
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        // A set, not a list: a schema may require every one of thousands of properties,
        // and a list lookup per property made rendering quadratic in their number.
        let required: HashSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (key, prop) in props {
            let optional = if required.contains(&key.as_str()) { "" } else { "?" };
            property(key, optional, prop, indent, &mut out);
        }
    }
    out.push_str(&format!("{indent}}}"));
    out
}

fn property(key: &str, optional: &str, prop: &Value, indent: &str, out: &mut String) {
    if let Some(title) = str_field(prop, "title") {
        out.push_str(&format!("{indent}// {title}\n{indent}//\n"));
    }
    let has_one_of = prop.get("oneOf").is_some();
    if !has_one_of {
        if let Some(desc) = str_field(prop, "description") {
            out.push_str(&format!("{indent}// {desc}\n"));
        }
    }
    if let Some(examples) = prop.get("examples").and_then(Value::as_array) {
        if !examples.is_empty() {
            out.push_str(&format!("{indent}// Examples:\n"));
            for example in examples.iter().filter_map(Value::as_str) {
                out.push_str(&format!("{indent}// - \"{example}\"\n"));
            }
        }
    }
    if let Some(variants) = prop.get("oneOf").and_then(Value::as_array) {
        one_of_property(key, optional, prop, variants, indent, out);
        return;
    }
    let ty = with_nullable(prop, typescript(prop, &format!("{indent}    ")));
    out.push_str(&format!("{indent}{key}{optional}: {ty},"));
    if !has_one_of {
        if let Some(default) = prop.get("default") {
            out.push_str(&format!(" // {}", default_comment(prop, default, false)));
        }
    }
    out.push('\n');
}

/// A property whose schema is a `oneOf`: comments above, then one line per variant.
fn one_of_property(
    key: &str,
    optional: &str,
    prop: &Value,
    variants: &[Value],
    indent: &str,
    out: &mut String,
) {
    let property_desc = str_field(prop, "description");
    // A description repeated by the first variant is written once, above the property.
    let repeated = property_desc.is_some()
        && variants.first().and_then(|v| str_field(v, "description")) == property_desc;
    let desc_above = match property_desc {
        Some(desc) if !repeated => {
            out.push_str(&format!("{indent}// {desc}\n"));
            true
        }
        _ => false,
    };
    if let Some(default) = prop.get("default") {
        out.push_str(&format!("{indent}// {}\n", default_comment(prop, default, false)));
    }
    out.push_str(&format!("{indent}{key}{optional}:\n"));
    let inner = format!("{indent}   ");
    for (i, variant) in variants.iter().enumerate() {
        out.push_str(&format!("{indent} | "));
        out.push_str(&with_nullable(variant, typescript(variant, &inner)));
        let mut comments = Vec::new();
        if !(i == 0 && desc_above) {
            if let Some(desc) = str_field(variant, "description") {
                if Some(desc) != property_desc {
                    comments.push(desc.to_owned());
                }
            }
        }
        if let Some(default) = variant.get("default") {
            comments.push(default_comment(variant, default, false));
        }
        if !comments.is_empty() {
            out.push_str(&format!(" // {}", comments.join(" ")));
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent},\n"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn object_with_enum_default_and_optional_field() {
        let schema = json!({
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}
            },
            "required": ["location"]
        });
        assert_eq!(
            typescript(&schema, ""),
            "{\n// The city and state, e.g. San Francisco, CA\nlocation: string,\nformat?: \"celsius\" | \"fahrenheit\", // default: celsius\n}"
        );
    }

    #[test]
    fn one_of_property_lists_variants() {
        let schema = json!({
            "type": "object",
            "properties": {
                "x": {
                    "oneOf": [{"type": "string", "default": "d"}, {"type": "number", "description": "n"}],
                    "description": "a oneof",
                    "default": 20
                }
            }
        });
        assert_eq!(
            typescript(&schema, ""),
            "{\n// a oneof\n// default: 20\nx?:\n | string // default: \"d\"\n | number // n\n,\n}"
        );
    }

    #[test]
    fn nested_objects_indent_and_arrays() {
        let schema = json!({
            "type": "object",
            "properties": {"o": {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}, "a": {"type": "array"}},
            "required": ["o"]
        });
        assert_eq!(
            typescript(&schema, ""),
            "{\no: {\n    n?: number | null,\n    },\na?: Array<any>,\n}"
        );
    }
}
