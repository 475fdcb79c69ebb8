//! Structural check of a function tool's `parameters`: a JSON Schema that parses.
//!
//! This is not a JSON Schema validator (nothing is validated against the schema); it
//! checks that the schema itself is well formed where a chat format or a constrained
//! decoder would trip over it: `type` names, `properties` maps, `required` lists,
//! nested `items`/`anyOf`/..., `enum` lists, numeric bounds, and `$ref`s that resolve
//! within the document. Keywords it does not know are annotations and pass.

use serde_json::Value;

use super::path::Path;
use crate::error::{Code, Error, Result};

const TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Check `schema`, the `parameters` of a tool at `path`.
pub fn check_schema(schema: &Value, path: &Path) -> Result<()> {
    if !schema.is_object() {
        return Err(invalid(
            path,
            format!("must be a JSON Schema object, got {}", describe(schema)),
        ));
    }
    walk(schema, schema, path)
}

fn invalid(path: &Path, problem: String) -> Error {
    Error::new(
        Code::InvalidToolSchema,
        format!("Invalid JSON Schema: '{path}' {problem}."),
    )
    .at(path.to_string())
}

fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One (sub)schema: an object, or `true`/`false`.
fn walk(root: &Value, schema: &Value, path: &Path) -> Result<()> {
    let map = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(map) => map,
        other => {
            return Err(invalid(
                path,
                format!(
                    "must be a schema (an object or a boolean), got {}",
                    describe(other)
                ),
            ))
        }
    };
    for (key, value) in map {
        let p = path.key(key);
        match key.as_str() {
            "type" => check_type(value, &p)?,
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                let Value::Object(children) = value else {
                    return Err(invalid(
                        &p,
                        format!("must be an object of schemas, got {}", describe(value)),
                    ));
                };
                for (name, child) in children {
                    walk(root, child, &p.key(name))?;
                }
            }
            // `items` may still be the tuple form (a list of schemas) of older drafts.
            "items" | "prefixItems" | "anyOf" | "oneOf" | "allOf" => match value {
                Value::Array(children) => {
                    if children.is_empty() && key != "items" && key != "prefixItems" {
                        return Err(invalid(&p, "must be a non-empty array of schemas".into()));
                    }
                    for (i, child) in children.iter().enumerate() {
                        walk(root, child, &p.index(i))?;
                    }
                }
                _ if key == "items" => walk(root, value, &p)?,
                other => {
                    return Err(invalid(
                        &p,
                        format!("must be an array of schemas, got {}", describe(other)),
                    ))
                }
            },
            "additionalProperties"
            | "additionalItems"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "not"
            | "contains"
            | "propertyNames"
            | "if"
            | "then"
            | "else" => walk(root, value, &p)?,
            "required" => {
                let Value::Array(names) = value else {
                    return Err(invalid(
                        &p,
                        format!("must be an array of strings, got {}", describe(value)),
                    ));
                };
                if let Some(i) = names.iter().position(|n| !n.is_string()) {
                    return Err(invalid(
                        &p.index(i),
                        format!("must be a string, got {}", describe(&names[i])),
                    ));
                }
            }
            "enum" => match value {
                Value::Array(values) if !values.is_empty() => {}
                _ => return Err(invalid(&p, "must be a non-empty array".into())),
            },
            "$ref" => resolve(root, value, &p)?,
            _ => {
                if let Some(expected) = value_problem(key, value) {
                    return Err(invalid(
                        &p,
                        format!("must be {expected}, got {}", describe(value)),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Keywords whose value is not a schema: what `value` should have been, if it is wrong.
/// Keywords this check does not know are annotations and always pass.
fn value_problem(key: &str, value: &Value) -> Option<&'static str> {
    let (ok, expected) = match key {
        "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties"
        | "minContains" | "maxContains" => (value.as_u64().is_some(), "a non-negative integer"),
        "minimum" | "maximum" => (value.is_number(), "a number"),
        // Draft 4 spells these as booleans beside minimum/maximum.
        "exclusiveMinimum" | "exclusiveMaximum" => (value.is_number() || value.is_boolean(), "a number"),
        "multipleOf" => (value.as_f64().is_some_and(|x| x > 0.0), "a number greater than 0"),
        "pattern" | "format" | "title" | "description" | "$id" | "$schema" | "$anchor" | "$comment" => {
            (value.is_string(), "a string")
        }
        _ => (true, ""),
    };
    (!ok).then_some(expected)
}

fn check_type(value: &Value, path: &Path) -> Result<()> {
    let known = |name: &str| TYPES.contains(&name);
    let expected = "must be one of 'object', 'array', 'string', 'number', 'integer', 'boolean', 'null' or a non-empty array of them";
    match value {
        Value::String(name) if known(name) => Ok(()),
        Value::Array(names) if !names.is_empty() => {
            for (i, name) in names.iter().enumerate() {
                match name {
                    Value::String(n) if known(n) => {}
                    _ => {
                        return Err(invalid(
                            &path.index(i),
                            format!("is not a type name ({expected})"),
                        ))
                    }
                }
                if names[..i].contains(name) {
                    return Err(invalid(&path.index(i), "repeats a type".into()));
                }
            }
            Ok(())
        }
        Value::String(name) => Err(invalid(
            path,
            format!("is '{name}', which is not a type name ({expected})"),
        )),
        other => Err(invalid(path, format!("is {} ({expected})", describe(other)))),
    }
}

/// A `$ref` must point into this document (`#` or `#/json/pointer`) at a schema.
fn resolve(root: &Value, value: &Value, path: &Path) -> Result<()> {
    let Value::String(reference) = value else {
        return Err(invalid(
            path,
            format!("must be a string, got {}", describe(value)),
        ));
    };
    let Some(fragment) = reference.strip_prefix('#') else {
        return Err(invalid(
            path,
            format!("is '{reference}': only references within the document ('#/...') are supported"),
        ));
    };
    let pointer = percent_decode(fragment).ok_or_else(|| {
        invalid(
            path,
            format!("is '{reference}', which is not a valid URI fragment"),
        )
    })?;
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(invalid(
            path,
            format!("is '{reference}': anchors are not supported, use a JSON pointer such as '#/$defs/Name'"),
        ));
    }
    match root.pointer(&pointer) {
        Some(Value::Object(_) | Value::Bool(_)) => Ok(()),
        Some(other) => Err(invalid(
            path,
            format!(
                "is '{reference}', which points at {}, not a schema",
                describe(other)
            ),
        )),
        None => Err(invalid(
            path,
            format!("is '{reference}', which does not resolve in the document"),
        )),
    }
}

/// URI fragments percent-encode characters; JSON pointers do not.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(schema: Value) -> Result<()> {
        check_schema(&schema, &Path::root("tools").index(0).key("parameters"))
    }

    fn param_of(schema: Value) -> String {
        let e = check(schema).unwrap_err();
        assert_eq!(e.code, Code::InvalidToolSchema);
        e.param.unwrap()
    }

    #[test]
    fn accepts_real_tool_schemas() {
        check(json!({
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "shell command"},
                "timeout_ms": {"type": ["integer", "null"], "minimum": 0},
                "mode": {"enum": ["a", "b"]},
                "files": {"type": "array", "items": {"$ref": "#/$defs/File"}},
                "any": true,
                "tuple": {"items": [{"type": "string"}, {"type": "number"}]},
            },
            "required": ["cmd"],
            "additionalProperties": false,
            "$defs": {"File": {"type": "object", "properties": {"path": {"type": "string"}}}},
        }))
        .unwrap();
        check(json!({})).unwrap();
        check(json!({"$ref": "#", "definitions": {"a~b": {"type": "string"}}, "items": {"$ref": "#/definitions/a~0b"}}))
            .unwrap();
        check(json!({"properties": {"x": {"$ref": "#/properties/y%20z"}, "y z": {}}})).unwrap();
    }

    #[test]
    fn rejects_malformed_schemas_at_the_keyword() {
        assert_eq!(param_of(json!([])), "tools[0].parameters");
        assert_eq!(param_of(json!({"type": "obj"})), "tools[0].parameters.type");
        assert_eq!(
            param_of(json!({"type": ["string", "string"]})),
            "tools[0].parameters.type[1]"
        );
        assert_eq!(param_of(json!({"type": []})), "tools[0].parameters.type");
        assert_eq!(
            param_of(json!({"properties": []})),
            "tools[0].parameters.properties"
        );
        assert_eq!(
            param_of(json!({"properties": {"a": {"type": 3}}})),
            "tools[0].parameters.properties.a.type"
        );
        assert_eq!(
            param_of(json!({"properties": {"a": 3}})),
            "tools[0].parameters.properties.a"
        );
        assert_eq!(
            param_of(json!({"required": ["a", 1]})),
            "tools[0].parameters.required[1]"
        );
        assert_eq!(param_of(json!({"required": "a"})), "tools[0].parameters.required");
        assert_eq!(
            param_of(json!({"items": {"items": {"type": "x"}}})),
            "tools[0].parameters.items.items.type"
        );
        assert_eq!(param_of(json!({"enum": []})), "tools[0].parameters.enum");
        assert_eq!(param_of(json!({"enum": "a"})), "tools[0].parameters.enum");
        assert_eq!(param_of(json!({"anyOf": []})), "tools[0].parameters.anyOf");
        assert_eq!(
            param_of(json!({"anyOf": [{}, 1]})),
            "tools[0].parameters.anyOf[1]"
        );
        assert_eq!(
            param_of(json!({"$ref": "#/$defs/Missing"})),
            "tools[0].parameters.$ref"
        );
        assert_eq!(
            param_of(json!({"$ref": "http://x/schema.json"})),
            "tools[0].parameters.$ref"
        );
        assert_eq!(
            param_of(json!({"$ref": "#/required", "required": ["a"]})),
            "tools[0].parameters.$ref"
        );
        assert_eq!(param_of(json!({"$ref": "#/a%zz"})), "tools[0].parameters.$ref");
        assert_eq!(
            param_of(json!({"$ref": "#/a%+1", "a\u{1}": {}})),
            "tools[0].parameters.$ref"
        );
        assert_eq!(
            param_of(json!({"minLength": -1})),
            "tools[0].parameters.minLength"
        );
        assert_eq!(
            param_of(json!({"multipleOf": 0})),
            "tools[0].parameters.multipleOf"
        );
        assert_eq!(
            param_of(json!({"description": 5})),
            "tools[0].parameters.description"
        );
    }

    #[test]
    fn values_of_non_schema_keywords_are_not_walked() {
        check(json!({"default": {"type": "bogus"}, "examples": [{"$ref": "nowhere"}], "const": {"enum": 1}}))
            .unwrap();
    }
}
