//! The prompt-cache controls of a request: `prompt_cache_key` (a conversation's name for
//! routing), `prompt_cache_retention` and `prompt_cache_options` (`mode`, `ttl`,
//! `comparison_response_id`, and hotloop's `prewarm`), validated with the openai SDK's
//! values, and their echo in a Response.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::field::{self, invalid_value};
use super::path::Path;
use crate::error::Result;

#[derive(Deserialize)]
struct RawOptions<'a> {
    #[serde(borrow)]
    mode: Option<&'a RawValue>,
    #[serde(borrow)]
    ttl: Option<&'a RawValue>,
    #[serde(borrow)]
    comparison_response_id: Option<&'a RawValue>,
    #[serde(borrow)]
    prewarm: Option<&'a RawValue>,
}

/// `prompt_cache_options` as given (defaults filled in).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptCacheOptions {
    pub mode: &'static str,
    pub ttl: &'static str,
    /// The response whose prompt this one's is compared with (`prompt_cache_diagnostics`).
    pub comparison_response_id: Option<String>,
    /// Fill the engine's cache with the prompt, sampling nothing (as `generate: false`).
    pub prewarm: bool,
}

/// The prompt-cache fields of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptCache {
    pub key: Option<String>,
    /// `in_memory` or `24h` (`in-memory` is read as `in_memory`).
    pub retention: Option<&'static str>,
    pub options: Option<PromptCacheOptions>,
}

const RETENTIONS: [&str; 2] = ["in_memory", "24h"];
const MODES: [&str; 2] = ["implicit", "explicit"];
const TTLS: [&str; 2] = ["30m", "12h"];

impl PromptCache {
    pub(super) fn parse(
        key: Option<&RawValue>,
        retention: Option<&RawValue>,
        options: Option<&RawValue>,
        max: usize,
    ) -> Result<Self> {
        let retention_path = Path::root("prompt_cache_retention");
        let retention = match field::opt_string(retention, &retention_path, 64)? {
            None => None,
            Some(value) => Some(one_of(&value.replace('-', "_"), &RETENTIONS, &retention_path)?),
        };
        Ok(PromptCache {
            key: field::opt_string(key, &Path::root("prompt_cache_key"), max)?,
            retention,
            options: options.map(|raw| parse_options(raw, max)).transpose()?,
        })
    }

    /// The fields a Response echoes: `prompt_cache_key` always, the others when sent.
    pub(super) fn echo(&self) -> Vec<(&'static str, String)> {
        let json = |v: &Option<String>| serde_json::to_string(v).unwrap_or_else(|_| "null".into());
        let mut fields = vec![("prompt_cache_key", json(&self.key))];
        if let Some(retention) = self.retention {
            fields.push(("prompt_cache_retention", format!("\"{retention}\"")));
        }
        if let Some(options) = &self.options {
            fields.push((
                "prompt_cache_options",
                serde_json::json!({
                    "mode": options.mode,
                    "ttl": options.ttl,
                    "comparison_response_id": options.comparison_response_id,
                })
                .to_string(),
            ));
        }
        fields
    }
}

fn parse_options(raw: &RawValue, max: usize) -> Result<PromptCacheOptions> {
    let path = Path::root("prompt_cache_options");
    let options: RawOptions = field::object(raw, &path)?;
    let choice = |raw: Option<&RawValue>, name: &str, allowed: &[&'static str]| -> Result<&'static str> {
        let at = path.key(name);
        match field::opt_string(raw, &at, 64)? {
            None => Ok(allowed[0]),
            Some(value) => one_of(&value, allowed, &at),
        }
    };
    Ok(PromptCacheOptions {
        mode: choice(options.mode, "mode", &MODES)?,
        ttl: choice(options.ttl, "ttl", &TTLS)?,
        comparison_response_id: field::opt_string(
            options.comparison_response_id,
            &path.key("comparison_response_id"),
            max,
        )?,
        prewarm: field::opt_bool(options.prewarm, &path.key("prewarm"), false)?,
    })
}

fn one_of(value: &str, allowed: &[&'static str], path: &Path) -> Result<&'static str> {
    allowed.iter().find(|a| **a == value).copied().ok_or_else(|| {
        invalid_value(
            path,
            format!(
                "Invalid value for '{path}': '{value}'. Supported values are {}.",
                allowed
                    .iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn options_default_and_echo_as_the_sdk_reads_them() {
        let options = raw(r#"{"prewarm":true,"comparison_response_id":"resp_1"}"#);
        let cache = PromptCache::parse(None, Some(&raw(r#""in-memory""#)), Some(&options), 64).unwrap();
        let options = cache.options.clone().unwrap();
        assert_eq!(
            (options.mode, options.ttl, options.prewarm),
            ("implicit", "30m", true)
        );
        assert_eq!(cache.retention, Some("in_memory"));
        let echo = cache.echo();
        assert_eq!(echo[0], ("prompt_cache_key", "null".to_string()));
        assert_eq!(echo[1], ("prompt_cache_retention", "\"in_memory\"".to_string()));
        assert_eq!(
            echo[2].1,
            r#"{"mode":"implicit","ttl":"30m","comparison_response_id":"resp_1"}"#
        );
    }

    #[test]
    fn unknown_values_are_refused_at_their_path() {
        let bad_ttl = raw(r#"{"ttl":"1h"}"#);
        let error = PromptCache::parse(None, None, Some(&bad_ttl), 64).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("prompt_cache_options.ttl"));
        let error = PromptCache::parse(None, Some(&raw(r#""forever""#)), None, 64).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("prompt_cache_retention"));
        let error = PromptCache::parse(None, None, Some(&raw(r#"{"prewarm":1}"#)), 64).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("prompt_cache_options.prewarm"));
    }
}
