//! Hugging Face `tokenizer.json` -> [`Vocabulary`], for BPE models.
//!
//! Supported: normalizers `NFC`, `Prepend("▁")` and `Replace(" " -> "▁")` (alone or in a
//! `Sequence`); pre-tokenizers `Split` (regex or string; `Isolated` or
//! `MergedWithPrevious`), `Digits`, `ByteLevel` (with or without its GPT-2 regex), in a
//! `Sequence` or alone, `Metaspace` alone (`prepend_scheme` always / first / never, with
//! or without its split), or none (SentencePiece-style); the BPE model with
//! `byte_fallback`, `fuse_unk`, `unk_token` and `ignore_merges`; `added_tokens` (special
//! ones only by name, the others matched in text, with `lstrip`, `rstrip`, `single_word`;
//! `normalized` ones only where no normalizer changes the text). Anything else is
//! refused with `invalid_vocabulary` naming the component, never approximated.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::bpe_model::{
    gpt2_byte_decoder, AddedRule, Alphabet, Merges, Normalizer, Prepend, TokenKind, Vocabulary,
};
use super::pretokenizer::{Behavior, PreTokenizer, RegexSplit, RegexSplits, GPT2};
use crate::error::{Code, Error, Result};

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    normalizer: Option<Value>,
    #[serde(default)]
    pre_tokenizer: Option<Value>,
    #[serde(default)]
    decoder: Option<Value>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    single_word: bool,
    /// Matched in the normalized text (Hugging Face's default for non-special tokens).
    #[serde(default)]
    normalized: Option<bool>,
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type", default)]
    kind: String,
    vocab: HashMap<String, u32>,
    merges: Vec<MergeJson>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    fuse_unk: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MergeJson {
    Joined(String),
    Pair(String, String),
}

fn kind_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The components of a `Sequence` (or the component itself).
fn flatten<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
    match v.get(key).and_then(Value::as_array) {
        Some(items) if kind_of(v) == "Sequence" => items.iter().flat_map(|i| flatten(i, key)).collect(),
        _ => vec![v],
    }
}

fn normalizer(v: Option<&Value>) -> Result<Normalizer> {
    let mut n = Normalizer::NONE;
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(n);
    };
    for part in flatten(v, "normalizers") {
        match kind_of(part) {
            "Sequence" => {}
            "NFC" => n.nfc = true,
            "Prepend" if part.get("prepend").and_then(Value::as_str) == Some("▁") => {
                n.prepend = Prepend::Always
            }
            "Replace"
                if part.pointer("/pattern/String").and_then(Value::as_str) == Some(" ")
                    && part.get("content").and_then(Value::as_str) == Some("▁") =>
            {
                n.metaspace = true
            }
            other => {
                return Err(invalid(format!(
                    "tokenizer.json normalizer {other:?} ({part}) is not supported"
                )))
            }
        }
    }
    Ok(n)
}

/// The pre-tokenizer and whether the vocabulary is byte-level (`ByteLevel` present).
fn pre_tokenizer(v: Option<&Value>, metaspace: bool) -> Result<(PreTokenizer, bool)> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((PreTokenizer::Whole, false));
    };
    let parts = flatten(v, "pretokenizers");
    let flag = |p: &Value, key: &str, default: bool| p.get(key).and_then(Value::as_bool).unwrap_or(default);
    // The two shapes llama.cpp hand-codes (SmolLM2, StarCoder): its scanner, which the
    // tests hold equal to Hugging Face's regex on the corpus.
    let byte_level_regex = |p: &Value| kind_of(p) == "ByteLevel" && flag(p, "use_regex", true);
    let individual_digits = |p: &Value| kind_of(p) == "Digits" && flag(p, "individual_digits", false);
    let no_prefix = |p: &Value| !flag(p, "add_prefix_space", false);
    match parts.as_slice() {
        [b] if byte_level_regex(b) && no_prefix(b) => return Ok((PreTokenizer::Gpt2, true)),
        [d, b] if individual_digits(d) && byte_level_regex(b) && no_prefix(b) => {
            return Ok((PreTokenizer::DigitsThenGpt2, true))
        }
        _ => {}
    }
    let mut stages = Vec::new();
    let mut byte_level = false;
    for part in parts {
        match kind_of(part) {
            "ByteLevel" => {
                if !no_prefix(part) {
                    return Err(invalid(
                        "tokenizer.json ByteLevel with add_prefix_space is not supported",
                    ));
                }
                byte_level = true;
                if flag(part, "use_regex", true) {
                    stages.push(RegexSplit::new(GPT2, Behavior::Isolated)?);
                }
            }
            "Digits" => {
                let pattern = if flag(part, "individual_digits", false) {
                    r"\p{N}"
                } else {
                    r"\p{N}+"
                };
                stages.push(RegexSplit::new(pattern, Behavior::Isolated)?);
            }
            "Split" => {
                if flag(part, "invert", false) {
                    return Err(invalid("tokenizer.json Split with invert is not supported"));
                }
                let behavior = match part.get("behavior").and_then(Value::as_str) {
                    Some("Isolated") => Behavior::Isolated,
                    Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                    other => {
                        return Err(invalid(format!(
                            "tokenizer.json Split behavior {other:?} is not supported"
                        )))
                    }
                };
                if let Some(regex) = part.pointer("/pattern/Regex").and_then(Value::as_str) {
                    stages.push(RegexSplit::new(regex, behavior)?);
                } else if let Some(literal) = part.pointer("/pattern/String").and_then(Value::as_str) {
                    // After SentencePiece's space replacement the text holds no spaces, so a
                    // split on a string with a space never matches (Gemma 3's).
                    if metaspace && literal.contains(' ') {
                        continue;
                    }
                    if metaspace && literal.contains('▁') {
                        return Err(invalid(format!(
                            "tokenizer.json Split on {literal:?} is not supported"
                        )));
                    }
                    stages.push(RegexSplit::literal(literal, behavior)?);
                } else {
                    return Err(invalid("tokenizer.json Split without a pattern"));
                }
            }
            "Metaspace" => {
                return Err(invalid(
                    "tokenizer.json Metaspace inside a pre-tokenizer Sequence is not supported",
                ))
            }
            other => {
                return Err(invalid(format!(
                    "tokenizer.json pre_tokenizer {other:?} is not supported"
                )))
            }
        }
    }
    let pre = if stages.is_empty() {
        PreTokenizer::Whole
    } else {
        PreTokenizer::Regex(Arc::new(RegexSplits { stages }))
    };
    Ok((pre, byte_level))
}

/// A `Metaspace` pre-tokenizer: where it puts its `▁` prefix, and its split (a piece
/// starts at every space) or none.
fn metaspace(v: &Value) -> Result<(Prepend, PreTokenizer)> {
    if v.get("replacement").and_then(Value::as_str) != Some("▁") {
        return Err(invalid(format!(
            "tokenizer.json Metaspace replacement {} is not supported (\"▁\" is)",
            v.get("replacement").unwrap_or(&Value::Null)
        )));
    }
    // Files before `prepend_scheme` say `add_prefix_space`.
    let legacy = match v.get("add_prefix_space").and_then(Value::as_bool) {
        Some(false) => "never",
        _ => "always",
    };
    let prepend = match v.get("prepend_scheme").and_then(Value::as_str).unwrap_or(legacy) {
        "always" => Prepend::Metaspace { first_only: false },
        "first" => Prepend::Metaspace { first_only: true },
        "never" => Prepend::Never,
        other => {
            return Err(invalid(format!(
                "tokenizer.json Metaspace prepend_scheme {other:?} is not supported"
            )))
        }
    };
    let split = v.get("split").and_then(Value::as_bool).unwrap_or(true);
    Ok((
        prepend,
        if split {
            PreTokenizer::BeforeSpaces
        } else {
            PreTokenizer::Whole
        },
    ))
}

/// `<0xNN>`, SentencePiece's byte token spelling.
pub(crate) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// A `tokenizer.json` with a BPE model as a [`Vocabulary`].
pub fn vocabulary(data: &[u8]) -> Result<Vocabulary> {
    let doc: TokenizerJson =
        serde_json::from_slice(data).map_err(|e| invalid(format!("tokenizer.json: {e}")))?;
    let model = doc.model;
    if model.kind != "BPE" {
        return Err(invalid(format!(
            "tokenizer.json model {:?} is not BPE",
            model.kind
        )));
    }
    for (name, value) in [
        ("continuing_subword_prefix", &model.continuing_subword_prefix),
        ("end_of_word_suffix", &model.end_of_word_suffix),
    ] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            return Err(invalid(format!("tokenizer.json BPE {name} is not supported")));
        }
    }
    if model.dropout.is_some_and(|d| d > 0.0) {
        return Err(invalid("tokenizer.json BPE dropout is not supported"));
    }
    let mut normalizer = normalizer(doc.normalizer.as_ref())?;
    let normalizes = normalizer != Normalizer::NONE;
    let (pre, byte_level) = match doc.pre_tokenizer.as_ref().filter(|p| kind_of(p) == "Metaspace") {
        Some(m) => {
            if normalizes {
                return Err(invalid(
                    "tokenizer.json Metaspace after a normalizer is not supported",
                ));
            }
            let (prepend, pre) = metaspace(m)?;
            normalizer.metaspace = true;
            normalizer.prepend = prepend;
            (pre, false)
        }
        None => pre_tokenizer(doc.pre_tokenizer.as_ref(), normalizer.metaspace)?,
    };
    if byte_level && (normalizer.metaspace || normalizer.prepend != Prepend::Never) {
        return Err(invalid(
            "tokenizer.json mixes ByteLevel with SentencePiece normalizers",
        ));
    }
    let alphabet = if byte_level {
        Alphabet::Bytes
    } else {
        Alphabet::Chars {
            byte_fallback: model.byte_fallback,
            fuse_unk: model.fuse_unk,
        }
    };
    let decode_gpt2 = gpt2_byte_decoder();
    let spelled = |text: &str| -> (Vec<u8>, TokenKind) {
        if byte_level {
            return (decode_gpt2(text), TokenKind::Normal);
        }
        match byte_token(text) {
            Some(b) if model.byte_fallback => (vec![b], TokenKind::Byte),
            _ => (text.replace('▁', " ").into_bytes(), TokenKind::Normal),
        }
    };

    let size = model
        .vocab
        .values()
        .chain(doc.added_tokens.iter().map(|t| &t.id))
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut tokens = vec![Vec::new(); size];
    let mut kinds = vec![TokenKind::Unused; size];
    for (text, &id) in &model.vocab {
        (tokens[id as usize], kinds[id as usize]) = spelled(text);
    }
    let unk = match &model.unk_token {
        Some(text) => {
            let id = *model.vocab.get(text).ok_or_else(|| {
                invalid(format!(
                    "tokenizer.json unk_token {text:?} is not in the vocabulary"
                ))
            })?;
            kinds[id as usize] = TokenKind::Unknown;
            tokens[id as usize] = text.clone().into_bytes();
            Some(id)
        }
        None => None,
    };
    let mut added = Vec::new();
    let mut added_rules = Vec::new();
    for token in &doc.added_tokens {
        let id = token.id as usize;
        if token.special {
            tokens[id] = token.content.clone().into_bytes();
            kinds[id] = TokenKind::Control;
            continue;
        }
        // Matched in normalized text: the same as the raw text when nothing normalizes.
        if normalizes && token.normalized != Some(false) {
            return Err(invalid(format!(
                "tokenizer.json added token {:?} with normalized=true under a normalizer is not supported",
                token.content
            )));
        }
        let rule = AddedRule {
            lstrip: token.lstrip,
            rstrip: token.rstrip,
            single_word: token.single_word,
        };
        if rule != AddedRule::default() {
            added_rules.push((token.id, rule));
        }
        kinds[id] = if kinds[id] == TokenKind::Normal {
            TokenKind::UserDefined
        } else {
            tokens[id] = if normalizer.metaspace {
                token.content.replace('▁', " ").into_bytes()
            } else {
                token.content.clone().into_bytes()
            };
            TokenKind::Added
        };
        added.push((token.content.clone(), token.id));
    }

    let id_of = |text: &str| model.vocab.get(text).copied();
    let merges = model
        .merges
        .iter()
        .filter_map(|m| {
            let (left, right) = match m {
                MergeJson::Joined(s) => split_merge(s).ok()?,
                MergeJson::Pair(l, r) => (l.as_str(), r.as_str()),
            };
            Some((id_of(left)?, id_of(right)?))
        })
        .collect();
    let strip_leading_space = doc
        .decoder
        .as_ref()
        .map(|d| flatten(d, "decoders"))
        .unwrap_or_default()
        .iter()
        .any(|d| match kind_of(d) {
            "Strip" => {
                d.get("content").and_then(Value::as_str) == Some(" ")
                    && d.get("start").and_then(Value::as_u64) == Some(1)
            }
            "Metaspace" => metaspace(d).is_ok_and(|(prepend, _)| prepend != Prepend::Never),
            _ => false,
        });
    Ok(Vocabulary {
        name: "tokenizer.json".to_owned(),
        pre,
        normalizer,
        alphabet,
        tokens,
        kinds,
        merges: Merges::Ranked(merges),
        ignore_merges: model.ignore_merges,
        unk,
        strip_leading_space,
        added,
        added_rules,
    })
}

/// A merge written `"left right"`; the separator is the first space after the first
/// character (llama.cpp's rule, so a left part may itself start with a space).
pub(crate) fn split_merge(merge: &str) -> Result<(&str, &str)> {
    let first = merge.chars().next().map_or(0, char::len_utf8);
    merge[first..]
        .find(' ')
        .map(|i| (&merge[..first + i], &merge[first + i + 1..]))
        .ok_or_else(|| invalid(format!("merge {merge:?} has no separator")))
}
