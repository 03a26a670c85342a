//! A deterministic embedder for unit tests: hashed bag of words, so texts sharing words are near.

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use super::{EmbedError, Embedder, normalize};

pub struct FakeEmbedder {
    pub dim: usize,
}

impl Default for FakeEmbedder {
    fn default() -> Self {
        Self { dim: 64 }
    }
}

impl FakeEmbedder {
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        for w in crate::catalog::text::words(text) {
            let h = Sha256::digest(w.as_bytes());
            let i = u16::from_le_bytes([h[0], h[1]]) as usize % self.dim;
            v[i] += if h[2] & 1 == 0 { 1.0 } else { -1.0 };
        }
        normalize(&mut v);
        v
    }
}

impl Embedder for FakeEmbedder {
    fn model_id(&self) -> &str {
        "fake"
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, EmbedError>> {
        let out = texts.iter().map(|t| self.vector(t)).collect();
        Box::pin(async move { Ok(out) })
    }
}
