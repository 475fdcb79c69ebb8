//! OpenAI encodings, embedded by the `bpe-openai` crate (no download at run time).
//! `o200k_harmony` is `o200k_base` plus the harmony special tokens gpt-oss uses.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use super::Tokenizer;

pub struct OpenAiTokenizer {
    name: &'static str,
    inner: &'static bpe_openai::Tokenizer,
    /// id -> literal text, for special and reserved tokens (ids above the ordinary vocabulary).
    specials: HashMap<u32, String>,
    by_text: HashMap<String, u32>,
    vocab_size: usize,
}

impl OpenAiTokenizer {
    fn new(name: &'static str, inner: &'static bpe_openai::Tokenizer, specials: Vec<(String, u32)>) -> Self {
        let ordinary = inner.bpe.num_tokens();
        let top = specials.iter().map(|(_, id)| *id as usize + 1).max().unwrap_or(0);
        OpenAiTokenizer {
            name,
            inner,
            by_text: specials.iter().cloned().collect(),
            specials: specials.into_iter().map(|(t, id)| (id, t)).collect(),
            vocab_size: ordinary.max(top),
        }
    }
}

fn o200k_specials() -> Vec<(String, u32)> {
    vec![
        ("<|endoftext|>".into(), 199_999),
        ("<|endofprompt|>".into(), 200_018),
    ]
}

/// The harmony vocabulary: o200k_base ids 0..199998, then specials and a reserved range
/// up to 201087 (tiktoken's `o200k_harmony`).
fn o200k_harmony_specials() -> Vec<(String, u32)> {
    let named: &[(&str, u32)] = &[
        ("<|startoftext|>", 199_998),
        ("<|endoftext|>", 199_999),
        ("<|return|>", 200_002),
        ("<|constrain|>", 200_003),
        ("<|channel|>", 200_005),
        ("<|start|>", 200_006),
        ("<|end|>", 200_007),
        ("<|message|>", 200_008),
        ("<|call|>", 200_012),
        ("<|endofprompt|>", 200_018),
    ];
    let mut out: Vec<(String, u32)> = named.iter().map(|(t, id)| (t.to_string(), *id)).collect();
    for id in 200_000..201_088u32 {
        if !named.iter().any(|(_, n)| *n == id) {
            out.push((format!("<|reserved_{id}|>"), id));
        }
    }
    out
}

fn cl100k_specials() -> Vec<(String, u32)> {
    vec![
        ("<|endoftext|>".into(), 100_257),
        ("<|fim_prefix|>".into(), 100_258),
        ("<|fim_middle|>".into(), 100_259),
        ("<|fim_suffix|>".into(), 100_260),
        ("<|endofprompt|>".into(), 100_276),
    ]
}

static O200K_BASE: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "o200k_base",
        bpe_openai::o200k_base(),
        o200k_specials(),
    ))
});
static O200K_HARMONY: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "o200k_harmony",
        bpe_openai::o200k_base(),
        o200k_harmony_specials(),
    ))
});
static CL100K_BASE: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "cl100k_base",
        bpe_openai::cl100k_base(),
        cl100k_specials(),
    ))
});

pub fn by_name(name: &str) -> Option<Arc<dyn Tokenizer>> {
    let t: Arc<OpenAiTokenizer> = match name {
        "o200k_base" => O200K_BASE.clone(),
        "o200k_harmony" => O200K_HARMONY.clone(),
        "cl100k_base" => CL100K_BASE.clone(),
        _ => return None,
    };
    Some(t)
}

impl Tokenizer for OpenAiTokenizer {
    fn name(&self) -> &str {
        self.name
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        for piece in self.inner.split(text) {
            out.extend(self.inner.bpe.encode_via_backtracking(piece.as_bytes()));
        }
    }

    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        Box::new(self.inner.split(text))
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        match self.specials.get(&id) {
            Some(text) => text.as_bytes(),
            None => self.inner.bpe.token_bytes(id),
        }
    }

    fn special(&self, name: &str) -> Option<u32> {
        self.by_text.get(name).copied()
    }

    fn is_special(&self, id: u32) -> bool {
        self.specials.contains_key(&id)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_strings_in_text_stay_plain() {
        let t = by_name("o200k_harmony").unwrap();
        let mut ids = Vec::new();
        t.encode("<|end|>", &mut ids);
        assert!(ids.len() > 1);
        assert!(ids.iter().all(|&id| !t.is_special(id)));
        assert_eq!(t.special("<|end|>"), Some(200_007));
    }
}
