//! A function call written as a JSON object, `{"name": "NAME", "arguments": {...}}` (the
//! ChatML template's and Hermes/Qwen's shape), read as it streams: the head up to the
//! arguments (`call_head`), then where the arguments object ends (`ObjectScan`), so the
//! call starts once its name is read and its arguments go out as they are sampled.

/// A call head (`{"name": "...", "arguments": `) longer than this is not in the
/// template's shape: the call is parsed whole instead of re-matched on every token.
pub(crate) const MAX_CALL_HEAD: usize = 1024;

/// Where a JSON object ends, one character at a time (strings and escapes aware).
#[derive(Debug, Default)]
pub(crate) struct ObjectScan {
    depth: u32,
    in_string: bool,
    escape: bool,
}

enum Scan {
    /// Whitespace before the object.
    Skip,
    Take,
    /// The object's closing brace.
    Last,
    /// The value is not an object.
    NotObject,
}

/// How the arguments value ended within a scanned chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Its closing brace was read: the arguments are out.
    Object,
    /// It is not an object (left for the whole-call parse).
    NotObject,
}

impl ObjectScan {
    /// A scan that starts inside an object (its opening brace read): it ends at the
    /// brace that closes it.
    pub(crate) fn inside() -> ObjectScan {
        ObjectScan {
            depth: 1,
            ..ObjectScan::default()
        }
    }

    fn push(&mut self, c: char) -> Scan {
        if self.depth == 0 {
            return match c {
                '{' => {
                    self.depth = 1;
                    Scan::Take
                }
                c if c.is_whitespace() => Scan::Skip,
                _ => Scan::NotObject,
            };
        }
        if self.in_string {
            match (self.escape, c) {
                (true, _) => self.escape = false,
                (false, '\\') => self.escape = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            return Scan::Take;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    return Scan::Last;
                }
            }
            _ => {}
        }
        Scan::Take
    }

    /// Read `text` until the object ends: the object's text in it (the whitespace before
    /// the object skipped), the bytes consumed (its closing brace included; not the first
    /// character of a value that is not an object), and how it ended, if it did.
    pub(crate) fn scan(&mut self, text: &str) -> (String, usize, Option<End>) {
        let mut delta = String::new();
        let mut taken = 0;
        for c in text.chars() {
            match self.push(c) {
                Scan::Skip => {}
                Scan::Take => delta.push(c),
                Scan::Last => {
                    delta.push(c);
                    return (delta, taken + c.len_utf8(), Some(End::Object));
                }
                Scan::NotObject => return (delta, taken, Some(End::NotObject)),
            }
            taken += c.len_utf8();
        }
        (delta, taken, None)
    }
}

pub(crate) enum Head {
    /// The text so far is a prefix of the template's shape.
    Incomplete,
    Mismatch,
    /// The name, and the length of `{"name": "...", "arguments": ` with its whitespace.
    Matched(String, usize),
}

/// Match the start of a call in the template's shape: `{"name": "NAME", "arguments": `.
pub(crate) fn call_head(text: &str) -> Head {
    call_head_with(text, &["\"arguments\""])
}

/// `call_head` with the arguments under one of `keys` (quoted): Llama 3 writes
/// `"parameters"`.
pub(crate) fn call_head_with(text: &str, keys: &[&str]) -> Head {
    let rest = match literals(text, &["{", "\"name\"", ":", "\""]) {
        Ok(rest) => rest,
        Err(head) => return head,
    };
    // Names are identifiers: one with an escape is left to the whole-call parse.
    let Some(end) = rest.find(['"', '\\']) else {
        return Head::Incomplete;
    };
    if rest.as_bytes()[end] == b'\\' {
        return Head::Mismatch;
    }
    let name = &rest[..end];
    let mut incomplete = false;
    for key in keys {
        match literals(&rest[end + 1..], &[",", key, ":"]) {
            Ok(rest) => return Head::Matched(name.to_owned(), text.len() - rest.len()),
            Err(Head::Incomplete) => incomplete = true,
            Err(_) => {}
        }
    }
    if incomplete {
        Head::Incomplete
    } else {
        Head::Mismatch
    }
}

/// `text` after `expected`, each literal after optional whitespace; or why not: the
/// text ends inside them (Incomplete) or differs (Mismatch).
fn literals<'a>(text: &'a str, expected: &[&str]) -> Result<&'a str, Head> {
    let mut rest = text;
    for literal in expected {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(literal) {
            rest = after;
        } else if literal.starts_with(rest) {
            return Err(Head::Incomplete);
        } else {
            return Err(Head::Mismatch);
        }
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> String {
        match call_head(text) {
            Head::Incomplete => "incomplete".into(),
            Head::Mismatch => "mismatch".into(),
            Head::Matched(name, len) => format!("{name} {len}"),
        }
    }

    #[test]
    fn call_heads_match_with_any_whitespace_and_wait_for_more() {
        let full = r#"{"name": "exec", "arguments": {"cmd": "ls"}}"#;
        assert_eq!(head(full), "exec 29");
        assert_eq!(head(r#" { "name" :"exec" ,"arguments":{}"#), "exec 31");
        // Every prefix of the head is incomplete, never a mismatch.
        for end in 0..29 {
            assert_eq!(head(&full[..end]), "incomplete", "{:?}", &full[..end]);
        }
        assert_eq!(head(r#"{"nam": "exec""#), "mismatch");
        assert_eq!(head(r#"{"name": "ex\u0041", "#), "mismatch");
        assert_eq!(head(r#"{"name": "exec", "args": {}"#), "mismatch");
    }
}
