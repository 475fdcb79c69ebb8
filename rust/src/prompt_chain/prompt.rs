//! `Prompt`: the tokens of one turn, sharing the chain's chunks (taking one copies nothing).

use crate::chunks::Chunks;

#[derive(Clone, Default)]
pub struct Prompt {
    pub(crate) tokens: Chunks<u32>,
}

impl Prompt {
    /// A prompt of ids rendered elsewhere (a peer implementation fed to the same engine);
    /// it shares nothing with any conversation.
    pub fn from_tokens(ids: &[u32]) -> Prompt {
        let mut tokens = Chunks::default();
        tokens.extend_from_slice(ids);
        Prompt { tokens }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.to_vec(0, self.tokens.len())
    }

    /// The tokens from `start` on (what an engine with a warm prefix cache still needs).
    pub fn tokens_from(&self, start: usize) -> Vec<u32> {
        self.tokens.to_vec(start, self.tokens.len())
    }

    /// Length of the common prefix; O(shared chunks) when both share storage.
    pub fn common_prefix_len(&self, other: &Prompt) -> usize {
        self.tokens.common_prefix_len(&other.tokens)
    }
}
