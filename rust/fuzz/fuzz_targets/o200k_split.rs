//! o200k's split, decided without the regex where the text is ASCII
//! (`tokenizer::scanner`), finds bpe-openai's regex pieces in any text, and its ids are
//! bpe-openai's: the vocabulary's slots looked up ahead (`piece_map::WholeTokens`) and,
//! across the inputs of one run, the merged pieces the thread keeps (`with_merged`).
#![no_main]

use hotloop_core::tokenizer::openai;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &[u8]| {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let tokenizer = openai::by_name("o200k_base").expect("embedded");
    let ours: Vec<&str> = tokenizer.pieces(text).collect();
    let regex: Vec<&str> = bpe_openai::o200k_base().split(text).collect();
    assert_eq!(ours, regex, "{text:?}");
    let mut ids = Vec::new();
    tokenizer.encode(text, &mut ids);
    assert_eq!(ids, bpe_openai::o200k_base().encode(text), "{text:?}");
});
