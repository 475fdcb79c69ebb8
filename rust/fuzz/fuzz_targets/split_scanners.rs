//! Each split pattern with an ASCII scanner (`tokenizer::scanner`) finds the pieces the
//! regex alone finds, in any text; the first byte picks the pattern.
#![no_main]

use std::sync::LazyLock;

use hotloop_core::tokenizer::pretokenizer::PreTokenizer;
use hotloop_core::tokenizer::scanner::checked_splits;
use libfuzzer_sys::fuzz_target;

static SPLITS: LazyLock<Vec<(&str, PreTokenizer, PreTokenizer)>> = LazyLock::new(checked_splits);

fn pieces<'a>(pre: &PreTokenizer, text: &'a str) -> Vec<&'a str> {
    let mut out = Vec::new();
    pre.split(text, 0..text.len(), &mut |r| out.push(&text[r]));
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (pattern, scanned, regex) = &SPLITS[which as usize % SPLITS.len()];
    assert_eq!(pieces(scanned, text), pieces(regex, text), "{pattern} {text:?}");
});
