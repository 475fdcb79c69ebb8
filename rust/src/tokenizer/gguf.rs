//! A reader for the key/value header of a GGUF file: just enough to build a tokenizer
//! (`tokenizer.ggml.*`, `general.name`). Tensor infos and data are never read, so a
//! multi-gigabyte model costs a few megabytes of I/O.
//!
//! Format (GGUF v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count,
//! u64 key/value count, then per pair a string key, a u32 value type and the value.
//! Strings are a u64 length and UTF-8 bytes; arrays are a u32 element type, a u64
//! count and the elements.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

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
