//! A reader for the key/value header of a GGUF file, and the tokenizer it describes
//! (`tokenizer.ggml.*`, `general.name`) as a [`Vocabulary`]. Tensor infos and data are never read, so a
//! multi-gigabyte model costs a few megabytes of I/O.
//!
//! Format (GGUF v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count,
//! u64 key/value count, then per pair a string key, a u32 value type and the value.
//! Strings are a u64 length and UTF-8 bytes; arrays are a u32 element type, a u64
//! count and the elements.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use super::bpe_model::{gpt2_byte_decoder, Alphabet, Merges, Normalizer, Prepend, TokenKind, Vocabulary};
use super::pretokenizer::PreTokenizer;
use super::sentencepiece::Scored;
use super::tokenizer_json::split_merge;
use crate::error::{Code, Error, Result};

/// A metadata value. Integers of every width are widened; floats are kept only as f64.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The key/value metadata of one GGUF file.
#[derive(Debug, Default)]
pub struct Metadata {
    pub version: u32,
    pub values: HashMap<String, Value>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

/// A value larger than this many elements or bytes is treated as a corrupt file
/// (the largest real vocabularies have a few hundred thousand tokens).
const MAX_LEN: u64 = 1 << 26;

struct Reader<R: Read> {
    inner: R,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| invalid(format!("truncated GGUF header: {e}")))?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        if n > MAX_LEN {
            return Err(invalid(format!("GGUF length {n} is implausibly large")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let mut buf = vec![0u8; n];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| invalid(format!("truncated GGUF string: {e}")))?;
        String::from_utf8(buf).map_err(|_| invalid("GGUF string is not UTF-8"))
    }

    fn value(&mut self, kind: u32, depth: u8) -> Result<Value> {
        Ok(match kind {
            0 => Value::Int(self.bytes::<1>()?[0] as i64),
            1 => Value::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => Value::Int(u16::from_le_bytes(self.bytes()?) as i64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => Value::Int(self.u32()? as i64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            // Nested arrays are legal GGUF; bound the depth against corrupt files.
            9 if depth < 4 => {
                let elem = self.u32()?;
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Int(self.u64()? as i64),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(invalid(format!("unsupported GGUF value type {kind}"))),
        })
    }
}

/// Read the metadata of a GGUF stream, stopping before the tensor infos.
pub fn read_metadata(input: impl Read) -> Result<Metadata> {
    let mut r = Reader { inner: input };
    if &r.bytes::<4>()? != b"GGUF" {
        return Err(invalid("not a GGUF file (bad magic)"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(invalid(format!(
            "GGUF version {version} is not supported (2 or 3)"
        )));
    }
    let _tensors = r.u64()?;
    let count = r.len()?;
    let mut values = HashMap::with_capacity(count);
    for _ in 0..count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0)?;
        values.insert(key, value);
    }
    Ok(Metadata { version, values })
}

/// Read the metadata of a GGUF file.
pub fn read_metadata_file(path: &Path) -> Result<Metadata> {
    let file =
        std::fs::File::open(path).map_err(|e| invalid(format!("cannot open {}: {e}", path.display())))?;
    read_metadata(BufReader::with_capacity(1 << 20, file))
}

/// The tokenizer of a GGUF file as a [`Vocabulary`]: `tokenizer.ggml.model` `gpt2`
/// (byte-level BPE, split as llama.cpp splits its `tokenizer.ggml.pre` type) or `llama`
/// (SentencePiece BPE ranked by `tokenizer.ggml.scores`, with byte fallback).
pub fn vocabulary(meta: &Metadata) -> Result<Vocabulary> {
    let str_of = |key: &str| meta.get(key).and_then(Value::as_str);
    let model = str_of("tokenizer.ggml.model").ok_or_else(|| invalid("no tokenizer.ggml.model"))?;
    if !matches!(model, "gpt2" | "llama") {
        return Err(invalid(format!(
            "GGUF tokenizer model {model:?} is not supported (gpt2 and llama BPE are)"
        )));
    }
    let strings = |key: &str| -> Result<Vec<&str>> {
        meta.get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(format!("no {key} array")))?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| invalid(format!("{key} holds a non-string")))
            })
            .collect()
    };
    let texts = strings("tokenizer.ggml.tokens")?;
    let kinds = match meta.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(types) => types
            .iter()
            .map(|t| t.as_int().map(TokenKind::from_gguf))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid("tokenizer.ggml.token_type holds a non-integer"))?,
        None => vec![TokenKind::Normal; texts.len()],
    };
    if kinds.len() != texts.len() {
        return Err(invalid("tokenizer.ggml.token_type and tokens differ in length"));
    }
    let name = str_of("general.name").unwrap_or("gguf").to_owned();
    match model {
        "gpt2" => {
            // User-defined tokens are matched in the text by their text, as llama.cpp does.
            let added: Vec<(String, u32)> = texts
                .iter()
                .zip(&kinds)
                .enumerate()
                .filter(|(_, (text, kind))| **kind == TokenKind::UserDefined && !text.is_empty())
                .map(|(id, (text, _))| (text.to_string(), id as u32))
                .collect();
            let pre_name = str_of("tokenizer.ggml.pre").unwrap_or("default");
            let pre = PreTokenizer::from_llama_pre(pre_name)?
                .ok_or_else(|| invalid(format!("GGUF pre-tokenizer {pre_name:?} is not supported")))?;
            let decode = gpt2_byte_decoder();
            let tokens: Vec<Vec<u8>> = texts
                .iter()
                .zip(&kinds)
                .map(|(text, &kind)| {
                    if matches!(
                        kind,
                        TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined
                    ) {
                        text.as_bytes().to_vec()
                    } else {
                        decode(text)
                    }
                })
                .collect();
            // llama.cpp's text -> id map: every token by its spelling, a later id winning.
            let by_spelling: HashMap<&str, u32> =
                texts.iter().enumerate().map(|(id, t)| (*t, id as u32)).collect();
            let merges = strings("tokenizer.ggml.merges")?
                .into_iter()
                .filter_map(|m| {
                    let (l, r) = split_merge(m).ok()?;
                    Some((*by_spelling.get(l)?, *by_spelling.get(r)?))
                })
                .collect();
            let ignore_merges = matches!(
                pre_name,
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "tekken"
            );
            Ok(Vocabulary {
                name,
                pre,
                normalizer: Normalizer::NONE,
                alphabet: Alphabet::Bytes,
                tokens,
                kinds,
                merges: Merges::Ranked(merges),
                ignore_merges,
                unk: None,
                strip_leading_space: false,
                added,
                added_rules: Vec::new(),
            })
        }
        "llama" => {
            let scores = meta
                .get("tokenizer.ggml.scores")
                .and_then(Value::as_array)
                .ok_or_else(|| invalid("no tokenizer.ggml.scores array"))?;
            if scores.len() != texts.len() {
                return Err(invalid("tokenizer.ggml.scores and tokens differ in length"));
            }
            let score = |v: &Value| match v {
                Value::Float(f) => *f,
                Value::Int(i) => *i as f64,
                _ => f64::NEG_INFINITY,
            };
            let add_space_prefix = match meta.get("tokenizer.ggml.add_space_prefix") {
                Some(Value::Bool(b)) => *b,
                _ => true,
            };
            if matches!(
                meta.get("tokenizer.ggml.remove_extra_whitespaces"),
                Some(Value::Bool(true))
            ) {
                return Err(invalid("GGUF remove_extra_whitespaces is not supported"));
            }
            // A token spelled with a real space (Gemma's runs of spaces) is matched in the
            // text, but llama.cpp's merges work on `▁`-escaped text and never reach it.
            let kinds: Vec<TokenKind> = texts
                .iter()
                .zip(kinds)
                .map(|(text, kind)| match kind {
                    TokenKind::UserDefined if text.contains(' ') => TokenKind::Added,
                    other => other,
                })
                .collect();
            Ok(Scored {
                name,
                scores: scores.iter().map(score).collect(),
                texts,
                kinds,
                // llama.cpp's `add_space_prefix` also goes after each user-defined token.
                prepend: if add_space_prefix {
                    Prepend::Always
                } else {
                    Prepend::Never
                },
                alphabet: Alphabet::Chars {
                    byte_fallback: true,
                    fuse_unk: false,
                },
            }
            .into_vocabulary())
        }
        _ => unreachable!("checked above"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Serialise metadata the way a GGUF writer does (for tests of the readers above it).
    pub(crate) fn write_metadata(pairs: &[(&str, Value)]) -> Vec<u8> {
        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        fn kind(v: &Value) -> u32 {
            match v {
                Value::Int(_) => 11,
                Value::Float(_) => 12,
                Value::Bool(_) => 7,
                Value::Str(_) => 8,
                Value::Array(_) => 9,
            }
        }
        fn value(out: &mut Vec<u8>, v: &Value) {
            match v {
                Value::Int(i) => out.extend(i.to_le_bytes()),
                Value::Float(f) => out.extend(f.to_le_bytes()),
                Value::Bool(b) => out.push(*b as u8),
                Value::Str(s) => string(out, s),
                Value::Array(items) => {
                    out.extend(items.first().map_or(8, kind).to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for item in items {
                        value(out, item);
                    }
                }
            }
        }
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((pairs.len() as u64).to_le_bytes());
        for (k, v) in pairs {
            string(&mut out, k);
            out.extend(kind(v).to_le_bytes());
            value(&mut out, v);
        }
        out
    }

    #[test]
    fn round_trip() {
        let pairs = [
            ("general.name", Value::Str("tiny".into())),
            ("tokenizer.ggml.bos_token_id", Value::Int(1)),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::Str("a".into()), Value::Str("b".into())]),
            ),
        ];
        let meta = read_metadata(&write_metadata(&pairs)[..]).unwrap();
        assert_eq!(meta.version, 3);
        for (k, v) in pairs {
            assert_eq!(meta.get(k), Some(&v));
        }
    }

    #[test]
    fn corrupt_headers_are_errors() {
        assert_eq!(
            read_metadata(&b"GGML"[..]).unwrap_err().code,
            Code::InvalidVocabulary
        );
        let mut bytes = write_metadata(&[("k", Value::Str("value".into()))]);
        bytes.truncate(bytes.len() - 2);
        assert_eq!(
            read_metadata(&bytes[..]).unwrap_err().code,
            Code::InvalidVocabulary
        );
        let mut huge = b"GGUF".to_vec();
        huge.extend(3u32.to_le_bytes());
        huge.extend(0u64.to_le_bytes());
        huge.extend(u64::MAX.to_le_bytes());
        assert!(read_metadata(&huge[..]).is_err());
    }
}
