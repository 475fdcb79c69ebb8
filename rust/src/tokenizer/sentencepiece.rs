//! SentencePiece BPE vocabularies: a serialized `ModelProto` (`tokenizer.model`, the
//! files `mistral-common` ships for its v1-v7 tokenizers) -> [`Vocabulary`], encoded as
//! the `sentencepiece` library encodes it; and the score ranking that GGUF `llama`
//! vocabularies ([`super::gguf`]) share with it.
//!
//! The protobuf is read by hand (a few fields of three messages, no schema compiler):
//! `ModelProto` field 1 `pieces` (`piece` string, `score` float, `type` enum with GGUF's
//! numbering), field 2 `trainer_spec` (`model_type` 3, `treat_whitespace_as_suffix` 24,
//! `byte_fallback` 35), field 3 `normalizer_spec` (`name` 1, `precompiled_charsmap` 2,
//! `add_dummy_prefix` 3, `remove_extra_whitespaces` 4, `escape_whitespaces` 5) and field 5
//! `denormalizer_spec`; every other field is skipped by its wire type.
//!
//! Encoding as `SentencePieceProcessor.encode`: the text's spaces become `▁`, one `▁`
//! goes before the whole text (`add_dummy_prefix`, also when the text starts with a
//! user-defined piece), user-defined pieces match in the text and never merge, and BPE
//! merges the adjacent pair whose concatenation has the highest score, leftmost first,
//! with unknown characters spelled by their `<0xNN>` byte pieces (`byte_fallback`).
//! What the BPE engine does not reproduce is refused with `invalid_vocabulary` naming it:
//! unigram (and word, char) models, a normalization rule table (`nmt_nfkc`, ...),
//! `remove_extra_whitespaces`, unescaped or suffix whitespace, `UNUSED` pieces (which
//! SentencePiece merges and then splits again).

use std::collections::HashSet;

use super::bpe_model::{Alphabet, Merges, Normalizer, Prepend, TokenKind, Vocabulary};
use super::pretokenizer::PreTokenizer;
use super::tokenizer_json::byte_token;
use crate::error::{Code, Error, Result};

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

/// A field's value, by protobuf wire type.
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The (field number, value) pairs of one protobuf message, in file order.
struct Fields<'a> {
    data: &'a [u8],
    failed: bool,
}

fn fields(data: &[u8]) -> Fields<'_> {
    Fields { data, failed: false }
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .data
                .split_first()
                .ok_or_else(|| invalid("truncated SentencePiece model (varint)"))?;
            self.data = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(invalid("SentencePiece model: varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n).ok().filter(|&n| n <= self.data.len());
        let n = n.ok_or_else(|| invalid("truncated SentencePiece model (length)"))?;
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn field(&mut self) -> Result<(u64, Wire<'a>)> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let n = self.varint()?;
                Wire::Bytes(self.take(n)?)
            }
            5 => Wire::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            other => {
                return Err(invalid(format!(
                    "SentencePiece model: protobuf wire type {other} is not supported"
                )))
            }
        };
        Ok((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Wire<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.is_empty() || self.failed {
            return None;
        }
        let field = self.field();
        self.failed = field.is_err();
        Some(field)
    }
}

fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|_| invalid("SentencePiece model: a string is not UTF-8"))
}

struct Piece<'a> {
    text: &'a str,
    score: f32,
    kind: TokenKind,
}

fn piece(data: &[u8]) -> Result<Piece<'_>> {
    let mut p = Piece {
        text: "",
        score: 0.0,
        kind: TokenKind::Normal,
    };
    for field in fields(data) {
        match field? {
            (1, Wire::Bytes(b)) => p.text = utf8(b)?,
            (2, Wire::Fixed32(b)) => p.score = f32::from_le_bytes(b),
            (3, Wire::Varint(t)) => p.kind = TokenKind::from_gguf(t as i64),
            _ => {}
        }
    }
    Ok(p)
}

/// The settings of a `ModelProto` that change encoding, with the proto's defaults.
struct Spec<'a> {
    model_type: u64,
    byte_fallback: bool,
    whitespace_as_suffix: bool,
    normalizer_name: &'a str,
    charsmap: bool,
    denormalizer_charsmap: bool,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

fn read_model(data: &[u8]) -> Result<(Vec<Piece<'_>>, Spec<'_>)> {
    let mut pieces = Vec::new();
    let mut spec = Spec {
        model_type: 1,
        byte_fallback: false,
        whitespace_as_suffix: false,
        normalizer_name: "",
        charsmap: false,
        denormalizer_charsmap: false,
        add_dummy_prefix: true,
        remove_extra_whitespaces: true,
        escape_whitespaces: true,
    };
    for field in fields(data) {
        match field? {
            (1, Wire::Bytes(b)) => pieces.push(piece(b)?),
            (2, Wire::Bytes(trainer)) => {
                for f in fields(trainer) {
                    match f? {
                        (3, Wire::Varint(v)) => spec.model_type = v,
                        (24, Wire::Varint(v)) => spec.whitespace_as_suffix = v != 0,
                        (35, Wire::Varint(v)) => spec.byte_fallback = v != 0,
                        _ => {}
                    }
                }
            }
            (3, Wire::Bytes(normalizer)) => {
                for f in fields(normalizer) {
                    match f? {
                        (1, Wire::Bytes(b)) => spec.normalizer_name = utf8(b)?,
                        (2, Wire::Bytes(b)) => spec.charsmap = !b.is_empty(),
                        (3, Wire::Varint(v)) => spec.add_dummy_prefix = v != 0,
                        (4, Wire::Varint(v)) => spec.remove_extra_whitespaces = v != 0,
                        (5, Wire::Varint(v)) => spec.escape_whitespaces = v != 0,
                        _ => {}
                    }
                }
            }
            (5, Wire::Bytes(denormalizer)) => {
                for f in fields(denormalizer) {
                    if let (2, Wire::Bytes(b)) = f? {
                        spec.denormalizer_charsmap = !b.is_empty();
                    }
                }
            }
            _ => {}
        }
    }
    Ok((pieces, spec))
}

/// Refuse what the BPE engine would only approximate.
fn check(pieces: &[Piece], spec: &Spec) -> Result<()> {
    if spec.model_type != 2 {
        let kind = match spec.model_type {
            1 => "UNIGRAM".to_owned(),
            3 => "WORD".to_owned(),
            4 => "CHAR".to_owned(),
            n => format!("#{n}"),
        };
        return Err(invalid(format!(
            "SentencePiece model type {kind} is not supported (BPE is)"
        )));
    }
    if spec.charsmap || spec.denormalizer_charsmap {
        return Err(invalid(format!(
            "SentencePiece normalizer {:?} (a precompiled character map) is not supported (identity is)",
            spec.normalizer_name
        )));
    }
    for (setting, refused) in [
        ("remove_extra_whitespaces", spec.remove_extra_whitespaces),
        ("escape_whitespaces=false", !spec.escape_whitespaces),
        ("treat_whitespace_as_suffix", spec.whitespace_as_suffix),
    ] {
        if refused {
            return Err(invalid(format!("SentencePiece {setting} is not supported")));
        }
    }
    let mut seen = HashSet::new();
    for p in pieces {
        match p.kind {
            TokenKind::Unused => {
                return Err(invalid(format!(
                    "SentencePiece UNUSED piece {:?} is not supported",
                    p.text
                )))
            }
            TokenKind::UserDefined if p.text.contains(['▁', ' ']) => {
                return Err(invalid(format!(
                    "SentencePiece user-defined piece {:?} with whitespace is not supported",
                    p.text
                )))
            }
            _ => {}
        }
        if !seen.insert(p.text) {
            return Err(invalid(format!(
                "SentencePiece piece {:?} is defined twice",
                p.text
            )));
        }
    }
    Ok(())
}

/// Ranks from SentencePiece scores: a higher score merges first; equal scores share a
/// rank (the leftmost pair then merges first, as SentencePiece and llama.cpp do).
pub(crate) fn ranks_by_score(scores: &[f64]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut ranks = vec![u32::MAX; scores.len()];
    let mut rank = 0u32;
    for (i, &id) in order.iter().enumerate() {
        if i > 0 && scores[order[i - 1]] != scores[id] {
            rank += 1;
        }
        ranks[id] = rank;
    }
    ranks
}

/// A scored SentencePiece-style vocabulary (no pre-tokenizer, spaces spelled `▁`,
/// `<0xNN>` byte pieces): from a `.model` file or GGUF `llama` metadata.
pub(crate) struct Scored<'a> {
    pub name: String,
    pub texts: Vec<&'a str>,
    pub scores: Vec<f64>,
    pub kinds: Vec<TokenKind>,
    pub prepend: Prepend,
    pub alphabet: Alphabet,
}

impl Scored<'_> {
    pub(crate) fn into_vocabulary(self) -> Vocabulary {
        let tokens = self
            .texts
            .iter()
            .zip(&self.kinds)
            .map(|(text, kind)| match kind {
                TokenKind::Byte => byte_token(text).map_or_else(|| text.as_bytes().to_vec(), |b| vec![b]),
                TokenKind::Control | TokenKind::Unknown => text.as_bytes().to_vec(),
                _ => text.replace('▁', " ").into_bytes(),
            })
            .collect();
        // User-defined pieces are matched in the text by their text.
        let added = self
            .texts
            .iter()
            .zip(&self.kinds)
            .enumerate()
            .filter(|(_, (text, kind))| {
                matches!(kind, TokenKind::UserDefined | TokenKind::Added) && !text.is_empty()
            })
            .map(|(id, (text, _))| (text.to_string(), id as u32))
            .collect();
        let unk = self
            .kinds
            .iter()
            .position(|&k| k == TokenKind::Unknown)
            .map(|i| i as u32);
        Vocabulary {
            name: self.name,
            pre: PreTokenizer::Whole,
            normalizer: Normalizer {
                nfc: false,
                metaspace: true,
                prepend: self.prepend,
            },
            alphabet: self.alphabet,
            tokens,
            merges: Merges::ByTokenRank(ranks_by_score(&self.scores)),
            kinds: self.kinds,
            ignore_merges: false,
            unk,
            strip_leading_space: self.prepend != Prepend::Never,
            added,
            added_rules: Vec::new(),
        }
    }
}

/// A serialized SentencePiece `ModelProto` as a [`Vocabulary`].
pub fn vocabulary(data: &[u8]) -> Result<Vocabulary> {
    let (pieces, spec) = read_model(data)?;
    if pieces.is_empty() {
        return Err(invalid("SentencePiece model without pieces"));
    }
    check(&pieces, &spec)?;
    Ok(Scored {
        name: "tokenizer.model".to_owned(),
        texts: pieces.iter().map(|p| p.text).collect(),
        scores: pieces.iter().map(|p| f64::from(p.score)).collect(),
        kinds: pieces.iter().map(|p| p.kind).collect(),
        prepend: if spec.add_dummy_prefix {
            Prepend::Once
        } else {
            Prepend::Never
        },
        // SentencePiece joins consecutive unknown pieces into one.
        alphabet: Alphabet::Chars {
            byte_fallback: spec.byte_fallback,
            fuse_unk: true,
        },
    }
    .into_vocabulary())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tokenizer::bpe_model::BpeModel;
    use crate::tokenizer::Tokenizer;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn bytes_field(out: &mut Vec<u8>, field: u64, data: &[u8]) {
        varint(out, field << 3 | 2);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
        varint(out, field << 3);
        varint(out, v);
    }

    /// A `ModelProto` as SentencePiece writes it: pieces (text, score, type), the
    /// trainer's model type and byte fallback, and the normalizer's settings.
    pub(crate) fn model_proto(
        pieces: &[(&str, f32, u64)],
        model_type: u64,
        normalizer: &[(u64, u64)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for (text, score, kind) in pieces {
            let mut p = Vec::new();
            bytes_field(&mut p, 1, text.as_bytes());
            varint(&mut p, 2 << 3 | 5);
            p.extend(score.to_le_bytes());
            varint_field(&mut p, 3, *kind);
            bytes_field(&mut out, 1, &p);
        }
        let mut trainer = Vec::new();
        bytes_field(&mut trainer, 2, b"dummy");
        varint_field(&mut trainer, 3, model_type);
        varint_field(&mut trainer, 35, 1);
        varint(&mut trainer, 10 << 3 | 5);
        trainer.extend(0.99f32.to_le_bytes());
        bytes_field(&mut out, 2, &trainer);
        let mut norm = Vec::new();
        bytes_field(&mut norm, 1, b"identity");
        for &(field, v) in normalizer {
            varint_field(&mut norm, field, v);
        }
        bytes_field(&mut out, 3, &norm);
        out
    }

    /// `<unk>`, `<s>`, `[INST]` (control), `[REF]` (user-defined), the 256 byte pieces,
    /// then words scored so that `▁hello` forms through `he`, `ll`, `hell`.
    pub(crate) fn tiny_model(model_type: u64, normalizer: &[(u64, u64)]) -> Vec<u8> {
        let hex: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        let mut pieces = vec![
            ("<unk>", 0.0, 2),
            ("<s>", 0.0, 3),
            ("[INST]", 0.0, 3),
            ("[REF]", 0.0, 4),
        ];
        pieces.extend(hex.iter().map(|h| (h.as_str(), 0.0, 6)));
        let words = [
            "he", "ll", "hell", "▁hell", "▁hello", "▁a", "aa", "▁", "a", "e", "h", "l", "o", "x",
        ];
        pieces.extend(words.iter().enumerate().map(|(i, w)| (*w, -(i as f32), 1)));
        model_proto(&pieces, model_type, normalizer)
    }

    fn encode(t: &BpeModel, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        t.encode(text, &mut ids);
        ids
    }

    #[test]
    fn reads_a_model_and_encodes_as_sentencepiece() {
        // remove_extra_whitespaces off, as every real BPE model has it.
        let t = BpeModel::new(vocabulary(&tiny_model(2, &[(4, 0)])).unwrap()).unwrap();
        let id = |piece: &str| {
            260 + [
                "he", "ll", "hell", "▁hell", "▁hello", "▁a", "aa", "▁", "a", "e", "h", "l", "o", "x",
            ]
            .iter()
            .position(|w| *w == piece)
            .unwrap() as u32
        };
        assert_eq!(encode(&t, "hello"), [id("▁hello")]);
        // One dummy prefix, before the whole text, even before a user-defined piece; none
        // after it. Control pieces are plain text; `é` falls back to its bytes.
        assert_eq!(encode(&t, "[REF]a"), [id("▁"), 3, id("a")]);
        assert_eq!(encode(&t, "a[REF]hello")[1..], [3, id("hell"), id("o")]);
        assert!(!encode(&t, "[INST]").contains(&2));
        assert_eq!(encode(&t, "é"), [id("▁"), 4 + 0xC3, 4 + 0xA9]);
        assert_eq!(t.special("[INST]"), Some(2));
        let mut text = Vec::new();
        t.decode_text(&encode(&t, " hello [REF] aa"), &mut text);
        assert_eq!(text, b" hello [REF] aa");
    }

    #[test]
    fn refuses_what_it_would_approximate_by_name() {
        let refused = |data: &[u8]| vocabulary(data).err().expect("refused").message;
        assert!(refused(&tiny_model(1, &[(4, 0)])).contains("UNIGRAM"));
        assert!(refused(&tiny_model(2, &[])).contains("remove_extra_whitespaces"));
        assert!(refused(&tiny_model(2, &[(4, 0), (5, 0)])).contains("escape_whitespaces"));
        let mut charsmap = tiny_model(2, &[(4, 0)]);
        let mut norm = Vec::new();
        bytes_field(&mut norm, 1, b"nmt_nfkc");
        bytes_field(&mut norm, 2, b"\x01\x02");
        bytes_field(&mut charsmap, 3, &norm);
        assert!(refused(&charsmap).contains("nmt_nfkc"));
        let unused = model_proto(&[("<unk>", 0.0, 2), ("a", 0.0, 5)], 2, &[(4, 0)]);
        assert!(refused(&unused).contains("UNUSED"));
        let twice = model_proto(&[("<unk>", 0.0, 2), ("a", 0.0, 1), ("a", -1.0, 1)], 2, &[(4, 0)]);
        assert!(refused(&twice).contains("twice"));
        let data = tiny_model(2, &[(4, 0)]);
        let err = vocabulary(&data[..data.len() - 3]).err().unwrap();
        assert_eq!(err.code, Code::InvalidVocabulary);
        assert!(vocabulary(b"").is_err());
    }
}
