//! A text cut at a line start (`pretokenizer::line_cut`) splits, part by part, into the
//! pieces of the whole, for every split that claims it (`cuts_at_lines`: the cut that
//! parallel encoding makes); the first byte picks the split.
#![no_main]

use std::sync::LazyLock;

use hotloop_core::tokenizer::openai;
use hotloop_core::tokenizer::pretokenizer::{assert_line_cuts_exact, PreTokenizer};
use libfuzzer_sys::fuzz_target;

static SPLITS: LazyLock<Vec<PreTokenizer>> = LazyLock::new(|| {
    ["llama-bpe", "qwen2", "deepseek-v3", "tekken"]
        .iter()
        .map(|name| PreTokenizer::from_llama_pre(name).expect("known").expect("known"))
        .collect()
});

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match SPLITS.get(which as usize % (SPLITS.len() + 1)) {
        Some(split) => assert_line_cuts_exact(
            |t| {
                let mut out = Vec::new();
                split.split(t, 0..t.len(), &mut |r| out.push(&t[r]));
                out
            },
            text,
        ),
        None => {
            let o200k = openai::by_name("o200k_base").expect("embedded");
            assert_line_cuts_exact(|t| o200k.pieces(t).collect(), text);
        }
    }
});
