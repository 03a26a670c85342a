//! all-MiniLM-L6-v2 on candle: tokenise (truncating at the manifest's `max_tokens`), encode with
//! the packed BERT encoder ([`super::bert`]), mean pooling over each text's tokens, L2
//! normalisation. Synchronous: it runs on the embedding thread (see [`super::worker`]), never on
//! the async runtime.

use tokenizers::{Tokenizer, TruncationParams};

use super::bert::{Config, Encoder};
use super::checkpoint::Checkpoint;
use super::files::ModelFiles;
use crate::config::Precision;

/// Tokens per forward pass. Texts are packed without padding, so this bounds the activations
/// (a few tens of MB), not the number of texts.
pub const TOKEN_BUDGET: usize = 4096;

pub struct SentenceModel {
    encoder: Encoder,
    tokenizer: Tokenizer,
    dim: usize,
    id: String,
}

impl SentenceModel {
    /// Loads the model with its dense layers in `precision` (int8 weights are quantised here).
    pub fn load(files: &ModelFiles, precision: Precision) -> anyhow::Result<Self> {
        let config: Config = serde_json::from_str(&std::fs::read_to_string(&files.config)?)?;
        let mut tokenizer = Tokenizer::from_file(&files.tokenizer).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: files.manifest.max_tokens, ..Default::default() }))
            .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        tokenizer.with_padding(None);
        let encoder = Encoder::load(&Checkpoint::open(&files.weights)?, &config, precision)?;
        anyhow::ensure!(
            encoder.hidden() == files.manifest.dims,
            "the manifest says {} dimensions, the model has {}",
            files.manifest.dims,
            encoder.hidden()
        );
        Ok(Self {
            encoder,
            tokenizer,
            dim: files.manifest.dims,
            // Vectors of one precision are not another's: the cache keys on this.
            id: match precision {
                Precision::F32 => format!("{}@{}", files.manifest.id, files.manifest.revision),
                p => format!(
                    "{}@{}+{}{}",
                    files.manifest.id,
                    files.manifest.revision,
                    p.name(),
                    p.kernel().map_or("", |k| k.weights_suffix())
                ),
            },
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Embeds any number of texts, in input order: tokenised, then encoded in passes of at most
    /// [`TOKEN_BUDGET`] tokens (a text longer than the budget gets a pass of its own).
    pub fn embed_all(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        let encodings =
            self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| anyhow::anyhow!("tokenize: {e}"))?;
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        let mut out = Vec::with_capacity(texts.len());
        let mut start = 0;
        while start < ids.len() {
            let mut end = start + 1;
            let mut tokens = ids[start].len();
            while end < ids.len() && tokens + ids[end].len() <= TOKEN_BUDGET {
                tokens += ids[end].len();
                end += 1;
            }
            out.extend(self.encoder.embed(&ids[start..end])?);
            start = end;
        }
        Ok(out)
    }
}
