//! The built-in content policy: an operator-configured set of patterns matched over the
//! new text of a request only (earlier turns were checked when they were new; their
//! verdict is part of the cached state and never recomputed).
//!
//! One Aho-Corasick automaton scans all patterns in a single pass, so the cost is linear
//! in the new text whatever the number of patterns. Case-insensitive matching folds
//! ASCII letters only: a non-ASCII pattern matches its exact spelling.

use aho_corasick::AhoCorasick;

use super::input::Input;
use crate::error::{Code, Error, Result};
use crate::item::Item;

#[derive(Debug, Clone)]
pub struct Policy {
    matcher: AhoCorasick,
}

impl Policy {
    pub fn new<P: AsRef<str>>(patterns: &[P], case_insensitive: bool) -> Result<Self> {
        if let Some(i) = patterns.iter().position(|p| p.as_ref().is_empty()) {
            // An empty pattern would match every text and block every request.
            return Err(Error::new(
                Code::InvalidValue,
                format!("Content policy pattern {i} is empty."),
            ));
        }
        let matcher = AhoCorasick::builder()
            .ascii_case_insensitive(case_insensitive)
            .build(patterns.iter().map(AsRef::as_ref))
            .map_err(|e| Error::new(Code::InvalidValue, format!("Content policy patterns: {e}.")))?;
        Ok(Policy { matcher })
    }

    /// Byte offset of the first pattern hit in `text`.
    pub fn find(&self, text: &str) -> Option<usize> {
        self.matcher.find(text).map(|m| m.start())
    }

    /// `content_policy_violation` at `param` if `text` contains a pattern.
    pub fn check_text(&self, text: &str, param: &str) -> Result<()> {
        match self.find(text) {
            None => Ok(()),
            Some(_) => Err(violation(param.to_string())),
        }
    }

    /// Scan the text of every input item; a hit names the offending field or part.
    pub fn check_input(&self, input: &Input) -> Result<()> {
        for (i, (item, source)) in input.items.iter().zip(&input.sources).enumerate() {
            let text = match item {
                Item::Message { text, .. } | Item::Reasoning { text } => text,
                Item::FunctionCall { arguments, .. } => arguments,
                Item::FunctionCallOutput { output, .. } => output,
            };
            if let Some(offset) = self.find(text) {
                return Err(violation(source.param(input, i, offset)));
            }
        }
        Ok(())
    }
}

fn violation(param: String) -> Error {
    Error::new(
        Code::ContentPolicyViolation,
        format!("The text at '{param}' was blocked by this server's content policy."),
    )
    .at(param)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::input::parse_input;
    use crate::validate::Limits;
    use serde_json::value::RawValue;

    fn input(json: &str) -> Input {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        parse_input(Some(raw), &Limits::default()).unwrap()
    }

    #[test]
    fn hits_name_the_offending_part() {
        let policy = Policy::new(&["forbidden", "secret-token"], true).unwrap();
        let clean = input(r#"[{"role":"user","content":"all fine"}]"#);
        policy.check_input(&clean).unwrap();
        let hit = input(
            r#"[{"role":"user","content":"ok"},
                {"role":"user","content":[{"type":"input_text","text":"fine "},{"type":"input_text","text":"a FORBIDDEN word"}]}]"#,
        );
        let e = policy.check_input(&hit).unwrap_err();
        assert_eq!(e.code, Code::ContentPolicyViolation);
        assert_eq!(e.param.as_deref(), Some("input[1].content[1].text"));
        let output = input(r#"[{"type":"function_call_output","call_id":"c","output":"leak secret-token"}]"#);
        assert_eq!(
            policy.check_input(&output).unwrap_err().param.as_deref(),
            Some("input[0].output")
        );
        let string = input(r#""Forbidden""#);
        assert_eq!(
            policy.check_input(&string).unwrap_err().param.as_deref(),
            Some("input")
        );
    }

    #[test]
    fn case_sensitivity_is_configurable() {
        let exact = Policy::new(&["Bad"], false).unwrap();
        assert!(exact.find("bad").is_none());
        assert_eq!(exact.find("so Bad"), Some(3));
        assert!(Policy::new(&[""], true).is_err());
        let none: [&str; 0] = [];
        assert!(Policy::new(&none, true).unwrap().find("anything").is_none());
    }
}
