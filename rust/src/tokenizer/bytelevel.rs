//! Byte-level BPE for open models (GPT-2 style vocabularies: SmolLM, Qwen, StarCoder, ...),
//! loaded from GGUF metadata or a Hugging Face `tokenizer.json`, and token-exact
//! against llama.cpp's tokenizer for the same vocabulary.
//!
//! A vocabulary spells each byte as one printable character (GPT-2's byte<->unicode
//! map) and ranks merges of adjacent symbols. Encoding one pre-tokenizer piece starts
//! from one symbol per byte and repeatedly merges the adjacent pair of lowest rank
//! (leftmost first on ties), as llama.cpp's `llm_tokenizer_bpe_session` does. Symbols
//! sit in a linked list and candidate pairs in a binary heap, so a piece of n bytes
//! costs O(n log n): `"A" * 100_000` or 100k spaces stay linear-ish, never quadratic.
//!
//! Token kinds follow GGUF `token_type`: control tokens (`<|im_start|>`, ...) are
//! reachable only through [`Tokenizer::special`]; user-defined tokens are matched in
//! text, as llama.cpp does even with `special=false`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;
use std::path::Path;

use foldhash::HashMap as FastMap;
use serde::Deserialize;

use super::gguf::{self, Metadata, Value};
use super::pretokenizer::PreTokenizer;
use super::Tokenizer;
use crate::error::{Code, Error, Result};

/// GGUF `token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(t: i64) -> TokenKind {
        match t {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Kinds whose text is literal (not spelled with GPT-2's byte characters).
    fn is_literal(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// GPT-2's map from a byte to the printable character that spells it in vocabularies:
/// printable Latin-1 bytes stand for themselves, the other 68 take 256, 257, ...
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("256..324 are chars")
        };
    }
    map
}

/// The bytes a vocabulary string spells. Characters outside the map (malformed
/// vocabularies) keep their UTF-8 bytes.
fn spelled_bytes(text: &str, char_to_byte: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// Everything needed to build a [`ByteLevelBpe`], whatever the source format.
pub struct Vocabulary {
    pub name: String,
    pub pre: PreTokenizer,
    /// Token strings as the vocabulary spells them, by id.
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    /// Merges in rank order: (left, right) token strings.
    pub merges: Vec<(String, String)>,
}

const NONE: u32 = u32::MAX;
/// The id of a byte the vocabulary cannot spell: dropped from the output.
const MISSING: u32 = u32::MAX - 1;

pub struct ByteLevelBpe {
    name: String,
    pre: PreTokenizer,
    /// Token bytes, concatenated; token i is `bytes[starts[i]..starts[i + 1]]`.
    bytes: Vec<u8>,
    starts: Vec<u32>,
    kinds: Vec<TokenKind>,
    /// The token of each single byte: the symbols a piece starts from.
    byte_ids: [u32; 256],
    /// (left id << 32 | right id) -> (rank, merged id).
    merges: FastMap<u64, (u32, u32)>,
    /// Control, unknown and user-defined tokens by their literal text.
    specials: HashMap<String, u32>,
    /// User-defined tokens, longest first: matched in text before pre-tokenization.
    user_defined: Vec<(String, u32)>,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

impl ByteLevelBpe {
    pub fn new(v: Vocabulary) -> Result<Self> {
        if v.tokens.len() != v.kinds.len() {
            return Err(invalid(format!(
                "{} tokens but {} token types",
                v.tokens.len(),
                v.kinds.len()
            )));
        }
        if v.tokens.len() >= NONE as usize {
            return Err(invalid("vocabulary too large"));
        }
        let chars = byte_chars();
        let char_to_byte: HashMap<char, u8> = chars.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();

        // llama.cpp's text -> id map: every token by its spelling, a later id winning.
        let mut by_spelling: HashMap<&str, u32> = HashMap::with_capacity(v.tokens.len());
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(v.tokens.len() + 1);
        starts.push(0u32);
        let mut specials = HashMap::new();
        let mut user_defined = Vec::new();
        for (id, (text, kind)) in v.tokens.iter().zip(&v.kinds).enumerate() {
            let id = id as u32;
            if text.is_empty() {
                starts.push(bytes.len() as u32);
                continue;
            }
            by_spelling.insert(text, id);
            if kind.is_literal() {
                bytes.extend_from_slice(text.as_bytes());
                specials.insert(text.clone(), id);
                if *kind == TokenKind::UserDefined {
                    user_defined.push((text.clone(), id));
                }
            } else {
                bytes.extend(spelled_bytes(text, &char_to_byte));
            }
            starts.push(bytes.len() as u32);
        }
        user_defined.sort_by_key(|(text, _)| Reverse(text.len()));

        // Some vocabularies lack a few control bytes (SmolLM2 has no 0x04): llama.cpp then
        // finds no token for that symbol, nor for its UTF-8 bytes, and drops the byte.
        let mut byte_ids = [MISSING; 256];
        for (b, c) in chars.iter().enumerate() {
            let spelled = c.encode_utf8(&mut [0; 4]).to_string();
            if let Some(&id) = by_spelling.get(spelled.as_str()) {
                byte_ids[b] = id;
            }
        }

        // A merge whose parts or result are not tokens can never apply to symbols that
        // are tokens; such merges only occur in damaged vocabularies and are skipped.
        let mut merges = FastMap::default();
        merges.reserve(v.merges.len());
        for (rank, (left, right)) in v.merges.iter().enumerate() {
            let joined = format!("{left}{right}");
            if let (Some(&l), Some(&r), Some(&m)) = (
                by_spelling.get(left.as_str()),
                by_spelling.get(right.as_str()),
                by_spelling.get(joined.as_str()),
            ) {
                merges.entry(pair_key(l, r)).or_insert((rank as u32, m));
            }
        }

        Ok(ByteLevelBpe {
            name: v.name,
            pre: v.pre,
            bytes,
            starts,
            kinds: v.kinds,
            byte_ids,
            merges,
            specials,
            user_defined,
        })
    }

    /// Build from the tokenizer metadata of a GGUF file (`tokenizer.ggml.model` = `gpt2`).
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::from_metadata(&gguf::read_metadata_file(path)?)
    }

    pub fn from_metadata(meta: &Metadata) -> Result<Self> {
        let str_of = |key: &str| meta.get(key).and_then(Value::as_str);
        let model = str_of("tokenizer.ggml.model").ok_or_else(|| invalid("no tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(invalid(format!(
                "tokenizer model {model:?} is not byte-level BPE (gpt2)"
            )));
        }
        let pre_name = str_of("tokenizer.ggml.pre").unwrap_or("default");
        let pre = PreTokenizer::from_llama_pre(pre_name)
            .ok_or_else(|| invalid(format!("pre-tokenizer {pre_name:?} is not supported")))?;
        let strings = |key: &str| -> Result<Vec<String>> {
            let items = meta
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| invalid(format!("no {key} array")))?;
            items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| invalid(format!("{key} holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let kinds = match meta.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(types) => types
                .iter()
                .map(|t| t.as_int().map(TokenKind::from_gguf))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| invalid("tokenizer.ggml.token_type holds a non-integer"))?,
            None => vec![TokenKind::Normal; tokens.len()],
        };
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| split_merge(&m))
            .collect::<Result<Vec<_>>>()?;
        let name = str_of("general.name").unwrap_or("gguf").to_owned();
        Self::new(Vocabulary {
            name,
            pre,
            tokens,
            kinds,
            merges,
        })
    }

    /// Build from a Hugging Face `tokenizer.json` with a byte-level BPE model.
    pub fn from_tokenizer_json(data: &[u8]) -> Result<Self> {
        let doc: TokenizerJson =
            serde_json::from_slice(data).map_err(|e| invalid(format!("tokenizer.json: {e}")))?;
        if doc.model.kind != "BPE" {
            return Err(invalid(format!(
                "tokenizer.json model {:?} is not BPE",
                doc.model.kind
            )));
        }
        if doc.normalizer.as_ref().is_some_and(|n| !n.is_null()) {
            return Err(invalid("tokenizer.json normalizers are not supported"));
        }
        let pre = doc
            .pre_tokenizer
            .as_ref()
            .and_then(pre_from_json)
            .ok_or_else(|| invalid("tokenizer.json pre_tokenizer is not a supported byte-level split"))?;
        let size = doc
            .model
            .vocab
            .values()
            .chain(doc.added_tokens.iter().map(|t| &t.id))
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut tokens = vec![String::new(); size];
        let mut kinds = vec![TokenKind::Unused; size];
        for (text, &id) in &doc.model.vocab {
            tokens[id as usize] = text.clone();
            kinds[id as usize] = TokenKind::Normal;
        }
        for added in &doc.added_tokens {
            tokens[added.id as usize] = added.content.clone();
            kinds[added.id as usize] = if added.special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            };
        }
        let merges = doc
            .model
            .merges
            .into_iter()
            .map(|m| match m {
                MergeJson::Joined(s) => split_merge(&s),
                MergeJson::Pair(l, r) => Ok((l, r)),
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(Vocabulary {
            name: "tokenizer.json".to_owned(),
            pre,
            tokens,
            kinds,
            merges,
        })
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Call `f` with each piece of `text`: its byte range and, for a user-defined
    /// token matched in the text, that token's id.
    fn for_each_piece(&self, text: &str, mut f: impl FnMut(Range<usize>, Option<u32>)) {
        let mut ranges = Vec::new();
        if self.user_defined.is_empty() {
            self.pre.split(text, 0..text.len(), &mut ranges);
            ranges.into_iter().for_each(|r| f(r, None));
            return;
        }
        for (range, token) in self.partition(text) {
            match token {
                Some(id) => f(range, Some(id)),
                None => {
                    ranges.clear();
                    self.pre.split(text, range, &mut ranges);
                    ranges.drain(..).for_each(|r| f(r, None));
                }
            }
        }
    }

    /// llama.cpp's `tokenizer_st_partition` for user-defined tokens: longest token first,
    /// each splits every remaining text fragment at its occurrences.
    fn partition(&self, text: &str) -> Vec<(Range<usize>, Option<u32>)> {
        let mut fragments = vec![(0..text.len(), None)];
        for (literal, id) in &self.user_defined {
            let mut next = Vec::with_capacity(fragments.len());
            for (range, token) in fragments {
                if token.is_some() {
                    next.push((range, token));
                    continue;
                }
                let mut at = range.start;
                for (i, _) in text[range.clone()].match_indices(literal.as_str()) {
                    let hit = range.start + i;
                    if hit > at {
                        next.push((at..hit, None));
                    }
                    next.push((hit..hit + literal.len(), Some(*id)));
                    at = hit + literal.len();
                }
                if at < range.end {
                    next.push((at..range.end, None));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// BPE on one piece, appending its ids.
    fn encode_piece(&self, piece: &[u8], work: &mut Work, out: &mut Vec<u32>) {
        if piece.len() == 1 {
            let id = self.byte_ids[piece[0] as usize];
            if id != MISSING {
                out.push(id);
            }
            return;
        }
        let n = piece.len() as u32;
        work.syms.clear();
        work.heap.clear();
        work.syms.extend(piece.iter().enumerate().map(|(i, &b)| Sym {
            id: self.byte_ids[b as usize],
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i as u32 + 1 == n { NONE } else { i as u32 + 1 },
        }));
        for i in 0..n - 1 {
            self.push_pair(work, i);
        }
        while let Some(Reverse(cand)) = work.heap.pop() {
            let left = &work.syms[cand.left as usize];
            // Skip pairs made stale by an earlier merge (either side changed).
            if left.id != cand.left_id
                || left.next == NONE
                || work.syms[left.next as usize].id != cand.right_id
            {
                continue;
            }
            let right = left.next;
            let after = work.syms[right as usize].next;
            work.syms[cand.left as usize].id = cand.merged;
            work.syms[cand.left as usize].next = after;
            work.syms[right as usize].id = NONE;
            if after != NONE {
                work.syms[after as usize].prev = cand.left;
            }
            let prev = work.syms[cand.left as usize].prev;
            if prev != NONE {
                self.push_pair(work, prev);
            }
            self.push_pair(work, cand.left);
        }
        let mut i = 0;
        while i != NONE {
            let sym = work.syms[i as usize];
            if sym.id != MISSING {
                out.push(sym.id);
            }
            i = sym.next;
        }
    }

    /// Queue the merge of symbol `left` with its right neighbour, if the vocabulary has one.
    fn push_pair(&self, work: &mut Work, left: u32) {
        let l = work.syms[left as usize];
        if l.next == NONE {
            return;
        }
        let r = work.syms[l.next as usize].id;
        if let Some(&(rank, merged)) = self.merges.get(&pair_key(l.id, r)) {
            work.heap.push(Reverse(Candidate {
                rank,
                left,
                left_id: l.id,
                right_id: r,
                merged,
            }));
        }
    }
}

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

/// A merge written `"left right"`; the separator is the first space after the first
/// character (llama.cpp's rule, so a left part may itself start with a space).
fn split_merge(merge: &str) -> Result<(String, String)> {
    let first = merge.chars().next().map_or(0, char::len_utf8);
    merge[first..]
        .find(' ')
        .map(|i| (merge[..first + i].to_owned(), merge[first + i + 1..].to_owned()))
        .ok_or_else(|| invalid(format!("merge {merge:?} has no separator")))
}

#[derive(Clone, Copy)]
struct Sym {
    /// Token id, or NONE once merged into its left neighbour.
    id: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge; the heap pops the lowest rank, then the leftmost.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

/// Scratch buffers reused across the pieces of one `encode` call.
#[derive(Default)]
struct Work {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Candidate>>,
}

impl Tokenizer for ByteLevelBpe {
    fn name(&self) -> &str {
        &self.name
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut work = Work::default();
        out.reserve(text.len() / 3);
        self.for_each_piece(text, |range, token| match token {
            Some(id) => out.push(id),
            None => self.encode_piece(&text.as_bytes()[range], &mut work, out),
        });
    }

    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        let mut ranges = Vec::new();
        self.for_each_piece(text, |range, _| ranges.push(range));
        Box::new(ranges.into_iter().map(move |r| &text[r]))
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        match self.starts.get(id as usize..id as usize + 2) {
            Some(&[start, end]) => &self.bytes[start as usize..end as usize],
            _ => &[],
        }
    }

    fn special(&self, name: &str) -> Option<u32> {
        self.specials.get(name).copied()
    }

    fn is_special(&self, id: u32) -> bool {
        self.kind(id).is_some_and(TokenKind::is_literal)
    }

    fn vocab_size(&self) -> usize {
        self.kinds.len()
    }
}

// ---------------------------------------------------------------- tokenizer.json

#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    normalizer: Option<serde_json::Value>,
    #[serde(default)]
    pre_tokenizer: Option<serde_json::Value>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type", default)]
    kind: String,
    vocab: HashMap<String, u32>,
    merges: Vec<MergeJson>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MergeJson {
    Joined(String),
    Pair(String, String),
}

/// The pre-tokenizers of `tokenizer.json` that match one of ours: `ByteLevel` with its
/// GPT-2 regex and no prefix space, optionally after `Digits` with individual digits.
fn pre_from_json(pre: &serde_json::Value) -> Option<PreTokenizer> {
    let kind = |v: &serde_json::Value| v.get("type").and_then(|t| t.as_str()).map(str::to_owned);
    let byte_level = |v: &serde_json::Value| {
        kind(v).as_deref() == Some("ByteLevel")
            && v.get("use_regex").and_then(|b| b.as_bool()).unwrap_or(true)
            && !v
                .get("add_prefix_space")
                .and_then(|b| b.as_bool())
                .unwrap_or(false)
    };
    let digits = |v: &serde_json::Value| {
        kind(v).as_deref() == Some("Digits")
            && v.get("individual_digits")
                .and_then(|b| b.as_bool())
                .unwrap_or(false)
    };
    if byte_level(pre) {
        return Some(PreTokenizer::Gpt2);
    }
    match pre
        .get("pretokenizers")
        .and_then(|p| p.as_array())
        .map(Vec::as_slice)
    {
        Some([only]) if byte_level(only) => Some(PreTokenizer::Gpt2),
        Some([first, second]) if digits(first) && byte_level(second) => Some(PreTokenizer::DigitsThenGpt2),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny vocabulary: all bytes, then merges building "hello", " world", "aa".
    pub(crate) fn tiny() -> ByteLevelBpe {
        ByteLevelBpe::new(tiny_vocabulary()).unwrap()
    }

    fn tiny_vocabulary() -> Vocabulary {
        let chars = byte_chars();
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<tool>".into()];
        tokens.extend(chars.iter().map(|c| c.to_string()));
        let merges: Vec<(String, String)> = [
            ("h", "e"),
            ("l", "l"),
            ("he", "ll"),
            ("hell", "o"),
            ("Ġ", "w"),
            ("o", "r"),
            ("Ġw", "or"),
            ("l", "d"),
            ("Ġwor", "ld"),
            ("a", "a"),
        ]
        .iter()
        .map(|(l, r)| (l.to_string(), r.to_string()))
        .collect();
        for (l, r) in &merges {
            tokens.push(format!("{l}{r}"));
        }
        let mut kinds = vec![TokenKind::Normal; tokens.len()];
        kinds[0] = TokenKind::Control;
        kinds[1] = TokenKind::UserDefined;
        Vocabulary {
            name: "tiny".into(),
            pre: PreTokenizer::DigitsThenGpt2,
            tokens,
            kinds,
            merges,
        }
    }

    fn encode(t: &dyn Tokenizer, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        t.encode(text, &mut out);
        out
    }

    fn decode(t: &dyn Tokenizer, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        t.decode_bytes(ids, &mut out);
        out
    }

    #[test]
    fn byte_map_is_gpt2s() {
        let chars = byte_chars();
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[b'A' as usize], 'A');
        assert_eq!(chars[0xAD], '\u{143}');
    }

    #[test]
    fn merges_by_rank() {
        let t = tiny();
        let ids = encode(&t, "hello world");
        assert_eq!(ids.len(), 2);
        assert_eq!(t.token_bytes(ids[0]), b"hello");
        assert_eq!(t.token_bytes(ids[1]), b" world");
        // "aaa": the leftmost pair merges first.
        let ids = encode(&t, "aaa");
        assert_eq!(decode(&t, &ids[..1]), b"aa");
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn control_tokens_stay_text_user_tokens_match() {
        let t = tiny();
        let ids = encode(&t, "<|endoftext|>");
        assert!(ids.len() > 1 && !ids.contains(&0));
        assert_eq!(t.special("<|endoftext|>"), Some(0));
        assert!(t.is_special(0));
        assert_eq!(
            encode(&t, "a<tool>b"),
            vec![t.byte_ids[b'a' as usize], 1, t.byte_ids[b'b' as usize]]
        );
        assert_eq!(t.pieces("a<tool>b").collect::<Vec<_>>(), ["a", "<tool>", "b"]);
    }

    #[test]
    fn round_trips_any_text() {
        let t = tiny();
        for text in [
            "",
            "hello",
            "Größe 10€ 東京 🙂\r\n\t x",
            "  leading",
            "trailing  ",
        ] {
            assert_eq!(decode(&t, &encode(&t, text)), text.as_bytes());
        }
    }

    #[test]
    fn long_runs_are_not_quadratic() {
        // Correctness at size; speed is measured in benches/.
        let t = tiny();
        let text = "a".repeat(100_001);
        let ids = encode(&t, &text);
        assert_eq!(ids.len(), 50_001);
        assert_eq!(decode(&t, &ids), text.as_bytes());
        let spaces = " ".repeat(100_000);
        assert_eq!(decode(&t, &encode(&t, &spaces)), spaces.as_bytes());
    }

    #[test]
    fn bytes_without_tokens_are_dropped() {
        let mut v = tiny_vocabulary();
        let missing = v.tokens.iter().position(|t| t == "Ą").unwrap();
        v.tokens[missing] = String::new();
        let t = ByteLevelBpe::new(v).unwrap();
        assert_eq!(decode(&t, &encode(&t, "a\u{4}b")), b"ab");
        assert_eq!(decode(&t, &encode(&t, "\u{4}")), b"");
    }

    #[test]
    fn merges_split_after_first_char() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert_eq!(split_merge("  x").unwrap(), (" ".into(), "x".into()));
        assert!(split_merge("abc").is_err());
    }

    #[test]
    fn tokenizer_json_round_trip() {
        let t = tiny();
        let vocab: HashMap<String, u32> = (2..t.vocab_size() as u32)
            .map(|id| {
                let spelled: String = t
                    .token_bytes(id)
                    .iter()
                    .map(|&b| byte_chars()[b as usize])
                    .collect();
                (spelled, id)
            })
            .collect();
        let json = serde_json::json!({
            "added_tokens": [
                {"id": 0, "content": "<|endoftext|>", "special": true},
                {"id": 1, "content": "<tool>", "special": false},
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            ]},
            "model": {"type": "BPE", "vocab": vocab, "merges": [
                "h e", "l l", ["he", "ll"], "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "a a"
            ]},
        });
        let from_json = ByteLevelBpe::from_tokenizer_json(json.to_string().as_bytes()).unwrap();
        for text in ["hello world", "aaaa <tool> 12", "<|endoftext|>"] {
            assert_eq!(encode(&from_json, text), encode(&t, text));
        }
        assert_eq!(from_json.special("<|endoftext|>"), Some(0));
    }

    #[test]
    fn gguf_metadata_round_trip() {
        let t = tiny();
        let spelled: Vec<Value> = (0..t.vocab_size() as u32)
            .map(|id| match t.kind(id) {
                Some(k) if k.is_literal() => {
                    Value::Str(String::from_utf8(t.token_bytes(id).to_vec()).unwrap())
                }
                _ => Value::Str(
                    t.token_bytes(id)
                        .iter()
                        .map(|&b| byte_chars()[b as usize])
                        .collect(),
                ),
            })
            .collect();
        let types: Vec<Value> = (0..t.vocab_size() as u32)
            .map(|id| {
                Value::Int(match t.kind(id) {
                    Some(TokenKind::Control) => 3,
                    Some(TokenKind::UserDefined) => 4,
                    _ => 1,
                })
            })
            .collect();
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "a a",
        ]
        .iter()
        .map(|m| Value::Str(m.to_string()))
        .collect();
        let bytes = gguf::tests::write_metadata(&[
            ("general.name", Value::Str("tiny".into())),
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.pre", Value::Str("smollm".into())),
            ("tokenizer.ggml.tokens", Value::Array(spelled)),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.merges", Value::Array(merges)),
        ]);
        let from_gguf = ByteLevelBpe::from_metadata(&gguf::read_metadata(&bytes[..]).unwrap()).unwrap();
        assert_eq!(from_gguf.name(), "tiny");
        for text in ["hello world", "aaaa <tool> 12"] {
            assert_eq!(encode(&from_gguf, text), encode(&t, text));
        }
    }

    #[test]
    fn unsupported_sources_are_errors() {
        let bytes = gguf::tests::write_metadata(&[("tokenizer.ggml.model", Value::Str("llama".into()))]);
        let result = ByteLevelBpe::from_metadata(&gguf::read_metadata(&bytes[..]).unwrap());
        assert_eq!(result.err().map(|e| e.code), Some(Code::InvalidVocabulary));
        assert!(ByteLevelBpe::from_tokenizer_json(b"{}").is_err());
    }
}
