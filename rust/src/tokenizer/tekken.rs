//! Mistral's `tekken.json` -> [`Vocabulary`], as `mistral-common`'s `Tekkenizer` loads it.
//!
//! The file holds tiktoken-style ranked token bytes (base64), the split regex and the
//! number of special tokens. Ids are: special tokens `0..num_special` (from the file's
//! `special_tokens`, or the fixed list older files imply, padded with `<SPECIAL_n>`),
//! then the first `default_vocab_size - num_special` ranked tokens, each at
//! `rank + num_special`. Encoding is tiktoken's: BPE where any two adjacent parts merge
//! when their concatenation is a token, lowest rank first.

use base64::Engine;
use serde::Deserialize;

use super::bpe_model::{Alphabet, Merges, Normalizer, TokenKind, Vocabulary};
use super::pretokenizer::{Behavior, PreTokenizer, RegexSplit, RegexSplits};
use crate::error::{Code, Error, Result};

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

#[derive(Deserialize)]
struct TekkenJson {
    config: Config,
    vocab: Vec<Entry>,
    #[serde(default)]
    special_tokens: Option<Vec<Special>>,
}

#[derive(Deserialize)]
struct Config {
    pattern: String,
    default_vocab_size: usize,
    default_num_special_tokens: usize,
}

#[derive(Deserialize)]
struct Entry {
    rank: usize,
    token_bytes: String,
}

#[derive(Deserialize)]
struct Special {
    rank: usize,
    token_str: String,
}

/// The special tokens of files that do not list them (tekken v3 up to v7).
const IMPLIED_SPECIALS: [&str; 20] = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
];

/// A `tekken.json` as a [`Vocabulary`].
pub fn vocabulary(data: &[u8]) -> Result<Vocabulary> {
    let doc: TekkenJson = serde_json::from_slice(data).map_err(|e| invalid(format!("tekken.json: {e}")))?;
    let specials = doc.config.default_num_special_tokens;
    let size = doc.config.default_vocab_size;
    let ordinary = size
        .checked_sub(specials)
        .filter(|&n| n <= doc.vocab.len())
        .ok_or_else(|| invalid("tekken.json default_vocab_size does not fit its vocab"))?;
    let mut tokens = vec![Vec::new(); size];
    let mut kinds = vec![TokenKind::Control; size];
    let mut ranks = vec![u32::MAX; size];
    let named: Vec<(usize, String)> = match doc.special_tokens {
        Some(list) => list.into_iter().map(|s| (s.rank, s.token_str)).collect(),
        None => IMPLIED_SPECIALS
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.to_string()))
            .collect(),
    };
    for (id, token) in tokens.iter_mut().take(specials).enumerate() {
        *token = format!("<SPECIAL_{id}>").into_bytes();
    }
    for (rank, text) in named {
        if rank >= specials {
            return Err(invalid(format!(
                "tekken.json special token {text:?} has rank {rank}"
            )));
        }
        tokens[rank] = text.into_bytes();
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    for (i, entry) in doc.vocab.iter().take(ordinary).enumerate() {
        if entry.rank != i {
            return Err(invalid(format!(
                "tekken.json vocab entry {i} has rank {}",
                entry.rank
            )));
        }
        let id = specials + i;
        tokens[id] = b64
            .decode(&entry.token_bytes)
            .map_err(|e| invalid(format!("tekken.json vocab entry {i}: {e}")))?;
        kinds[id] = TokenKind::Normal;
        ranks[id] = i as u32;
    }
    let pre = PreTokenizer::Regex(std::sync::Arc::new(RegexSplits {
        stages: vec![RegexSplit::new(&doc.config.pattern, Behavior::Isolated)?],
    }));
    Ok(Vocabulary {
        name: "tekken".to_owned(),
        pre,
        normalizer: Normalizer::NONE,
        alphabet: Alphabet::Bytes,
        tokens,
        kinds,
        merges: Merges::ByTokenRank(ranks),
        // tiktoken answers a piece that is a token with that token.
        ignore_merges: true,
        unk: None,
        strip_leading_space: false,
        added: Vec::new(),
        added_rules: Vec::new(),
    })
}
