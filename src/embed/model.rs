//! all-MiniLM-L6-v2 through candle: tokenise, BERT forward, mean pooling over the attention mask,
//! L2 normalisation, truncation at the manifest's `max_tokens`. Synchronous: it runs on the
//! embedding thread (see [`super::worker`]), never on the async runtime.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::files::ModelFiles;
use super::normalize;

pub struct SentenceModel {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dim: usize,
    id: String,
}

impl SentenceModel {
    pub fn load(files: &ModelFiles) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let config: Config = serde_json::from_str(&std::fs::read_to_string(&files.config)?)?;
        let mut tokenizer = Tokenizer::from_file(&files.tokenizer).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: files.manifest.max_tokens, ..Default::default() }))
            .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        tokenizer.with_padding(Some(PaddingParams { strategy: PaddingStrategy::BatchLongest, ..Default::default() }));
        // SAFETY: the weights file was just verified by checksum and is not modified while mapped.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&files.weights], DType::F32, &device)? };
        let model = BertModel::load(vb, &config)?;
        Ok(Self {
            model,
            tokenizer,
            device,
            dim: files.manifest.dims,
            id: format!("{}@{}", files.manifest.id, files.manifest.revision),
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Embeds one batch, padded to its longest text. Callers sort by length to pad little.
    pub fn embed_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let enc = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| anyhow::anyhow!("tokenize: {e}"))?;
        let len = enc[0].get_ids().len();
        let mut ids = Vec::with_capacity(texts.len() * len);
        let mut mask = Vec::with_capacity(texts.len() * len);
        for e in &enc {
            ids.extend(e.get_ids().iter().copied());
            mask.extend(e.get_attention_mask().iter().copied());
        }
        let n = texts.len();
        let ids = Tensor::from_vec(ids, (n, len), &self.device)?;
        let mask_t = Tensor::from_vec(mask, (n, len), &self.device)?;
        let types = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &types, Some(&mask_t))?; // (n, len, dim)
        let m = mask_t.to_dtype(DType::F32)?.unsqueeze(2)?; // (n, len, 1)
        let summed = hidden.broadcast_mul(&m)?.sum(1)?; // (n, dim)
        let counts = m.sum(1)?.clamp(1e-9, f64::MAX)?; // (n, 1)
        let pooled = summed.broadcast_div(&counts)?;
        let mut out: Vec<Vec<f32>> = pooled.to_vec2()?;
        out.iter_mut().for_each(|v| normalize(v));
        Ok(out)
    }

    /// Embeds any number of texts: sorted by length, cut into batches of `batch`, returned in
    /// input order.
    pub fn embed_all(&self, texts: &[&str], batch: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(batch.max(1)) {
            let batch_texts: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, v) in chunk.iter().zip(self.embed_batch(&batch_texts)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
