//! Streaming detokenization: token ids in, UTF-8 text deltas out.
//!
//! Byte-level tokens may end inside a multi-byte character (an emoji is often two or
//! three tokens). The decoder holds back an incomplete tail and emits only whole
//! characters, so deltas can go straight onto the wire. Invalid sequences become
//! U+FFFD exactly where `String::from_utf8_lossy` would put them on the whole byte
//! stream: the concatenated deltas always equal the lossy decode of all ids.
//!
//! A vocabulary whose encoding adds a dummy space prefix (SentencePiece) has its first
//! space dropped, as a whole-text decode does, so the deltas concatenate to that decode.
//!
//! The decoder owns no tokenizer; each call borrows one (the same one every time).

use super::Tokenizer;

#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    /// Bytes of an incomplete character at the end of the stream so far (at most 3).
    pending: Vec<u8>,
    /// Some bytes were decoded already (the dummy-prefix space is dropped only first).
    started: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder::default()
    }

    /// Decode `ids`, appending every character completed by them to `out`.
    pub fn feed(&mut self, tokenizer: &dyn Tokenizer, ids: &[u32], out: &mut String) {
        let before = self.pending.len();
        tokenizer.decode_bytes(ids, &mut self.pending);
        if !self.started && self.pending.len() > before {
            // The stream's first byte: the dummy-prefix space, if any, is dropped here and
            // never again (a first token that is only that space must not make the next
            // token's space look like the first byte).
            self.started = true;
            if tokenizer.strips_leading_space() && self.pending[before] == b' ' {
                self.pending.remove(before);
            }
        }
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("validated prefix"));
                    match e.error_len() {
                        // An invalid sequence: replace it and go on.
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
    }

    /// The held-back bytes of an incomplete character (empty between characters).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::by_name;
    use proptest::prelude::*;

    /// A tokenizer whose token i is the single byte i: every split point is reachable.
    struct Bytes;

    impl Tokenizer for Bytes {
        fn name(&self) -> &str {
            "bytes"
        }
        fn encode(&self, text: &str, out: &mut Vec<u32>) {
            out.extend(text.bytes().map(u32::from));
        }
        fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
            Box::new(std::iter::once(text))
        }
        fn token_bytes(&self, id: u32) -> &[u8] {
            const ALL: [u8; 256] = {
                let mut all = [0u8; 256];
                let mut i = 0;
                while i < 256 {
                    all[i] = i as u8;
                    i += 1;
                }
                all
            };
            &ALL[id as usize..id as usize + 1]
        }
        fn special(&self, _: &str) -> Option<u32> {
            None
        }
        fn is_special(&self, _: u32) -> bool {
            false
        }
        fn vocab_size(&self) -> usize {
            256
        }
    }

    fn stream(tok: &dyn Tokenizer, ids: &[u32], chunk: usize) -> (Vec<String>, String) {
        let mut d = StreamDecoder::new();
        let mut deltas = Vec::new();
        for part in ids.chunks(chunk.max(1)) {
            let mut out = String::new();
            d.feed(tok, part, &mut out);
            deltas.push(out);
        }
        let mut tail = String::new();
        d.finish(&mut tail);
        deltas.push(tail);
        let whole = deltas.concat();
        (deltas, whole)
    }

    #[test]
    fn holds_back_split_characters() {
        let ids: Vec<u32> = "a🙂b".bytes().map(u32::from).collect();
        let (deltas, whole) = stream(&Bytes, &ids, 1);
        assert_eq!(whole, "a🙂b");
        assert_eq!(deltas[..6], ["a", "", "", "", "🙂", "b"]);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let bytes = [b'x', 0xFF, 0xE2, 0x82, b'y', 0xF0, 0x9F];
        let ids: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        for chunk in 1..=bytes.len() {
            let (_, whole) = stream(&Bytes, &ids, chunk);
            assert_eq!(whole, String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn real_vocabulary_round_trip() {
        let t = by_name("o200k_base").unwrap();
        let text = "Grüße, 東京! 🙂🙃 done";
        let mut ids = Vec::new();
        t.encode(text, &mut ids);
        for chunk in 1..4 {
            assert_eq!(stream(t.as_ref(), &ids, chunk).1, text);
        }
    }

    proptest! {
        #[test]
        fn deltas_equal_lossy_decode(bytes in proptest::collection::vec(any::<u8>(), 0..64), chunk in 1usize..8) {
            let ids: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
            let (_, whole) = stream(&Bytes, &ids, chunk);
            prop_assert_eq!(whole, String::from_utf8_lossy(&bytes).into_owned());
        }
    }
}
