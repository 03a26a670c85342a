//! A BERT encoder over packed sequences, on candle tensors.
//!
//! The texts of a batch are laid end to end, one row per real token, with no padding: the dense
//! layers (the fused query-key-value projection, the attention output, the feed-forward pair)
//! are each one matrix product over every token of the batch, and attention runs per sequence
//! ([`kernels::attention`]), so no work is spent on padding and no mask is needed. GELU is
//! [`kernels::gelu`]. Mean pooling and L2 normalisation follow, per sequence.
//!
//! candle-transformers' `BertModel` pads each batch to its longest text and runs candle's
//! generic softmax and exact-erf GELU; on mixed-length tool texts it embedded less than half
//! as many texts a second as sentence-transformers (docs/performance.md).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Device, Layout, Shape, Tensor};
use serde::Deserialize;

use std::sync::Arc;

use super::checkpoint::{Checkpoint, Scope};
use super::kernels;
use crate::config::Precision;

/// The fields of a BERT `config.json` the encoder uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

struct Dense {
    weights: Weights,
    /// Added in the product's own op (no pass of candle's over the output).
    bias: Arc<Vec<f32>>,
}

enum Weights {
    /// `Wᵀ`, `(in, out)` and contiguous: gemm's kernels run faster on a row-major right-hand
    /// side than on the transposed view of the stored `(out, in)` matrix (3× at 20 tokens).
    F32(Tensor),
    /// Signed bytes per output channel ([`kernels::QWeights`]); the f32 copy is not kept.
    Int8(Arc<kernels::QWeights>),
}

impl Dense {
    fn load(at: Scope, out: usize, inp: usize, precision: Precision) -> anyhow::Result<Self> {
        Self::new(at.get("weight", &[out, inp])?, at.get("bias", &[out])?, inp, precision)
    }

    /// `weight` is `(out, inp)`, row-major (PyTorch's layout); `bias` has `out` values.
    fn new(weight: Vec<f32>, bias: Vec<f32>, inp: usize, precision: Precision) -> anyhow::Result<Self> {
        let out = bias.len();
        let weights = match precision {
            Precision::F32 => Weights::F32(Tensor::from_vec(weight, (out, inp), &Device::Cpu)?.t()?.contiguous()?),
            Precision::Int8(kernel) => Weights::Int8(Arc::new(kernels::QWeights::new(&weight, out, inp, kernel))),
        };
        Ok(Self { weights, bias: Arc::new(bias) })
    }

    /// `x Wᵀ + b` for `x` of shape `(tokens, in)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.weights {
            Weights::F32(weight_t) => x.apply_op2_no_bwd(weight_t, &MatMul(self.bias.clone())),
            Weights::Int8(q) => x.apply_op1_no_bwd(&QMatMul(q.clone(), self.bias.clone())),
        }
    }
}

struct Layer {
    /// Query, key and value projections stacked into one `(3·hidden, hidden)` product.
    qkv: Dense,
    attention_out: Dense,
    attention_norm: Norm,
    intermediate: Dense,
    output: Dense,
    output_norm: Norm,
}

pub struct Encoder {
    /// Embedding tables, `hidden` floats a row; token type 0's row only (every token has it).
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    eps: f32,
    max_positions: usize,
}

fn norm(at: Scope, size: usize) -> anyhow::Result<Norm> {
    // Older checkpoints name the LayerNorm parameters gamma and beta.
    let (weight, bias) = if at.contains("gamma") { ("gamma", "beta") } else { ("weight", "bias") };
    Ok(Norm { weight: at.get(weight, &[size])?, bias: at.get(bias, &[size])? })
}

impl Encoder {
    /// The encoder of `checkpoint`, its dense layers in `precision`, read tensor by tensor.
    pub fn load(checkpoint: &Checkpoint, config: &Config, precision: Precision) -> anyhow::Result<Self> {
        anyhow::ensure!(config.hidden_act == "gelu", "hidden_act `{}` is not supported (gelu only)", config.hidden_act);
        anyhow::ensure!(
            config.hidden_size.is_multiple_of(config.num_attention_heads),
            "hidden_size {} is not a multiple of num_attention_heads {}",
            config.hidden_size,
            config.num_attention_heads
        );
        // Checkpoints saved from BertForX carry a `bert.` prefix.
        let root = if checkpoint.contains("embeddings.word_embeddings.weight") { "" } else { "bert" };
        let root = checkpoint.at(root);
        let h = config.hidden_size;
        let e = root.at("embeddings");
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = root.at(&format!("encoder.layer.{i}"));
                let a = l.at("attention");
                let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * h * h), Vec::with_capacity(3 * h));
                for part in ["query", "key", "value"] {
                    let v = a.at("self").at(part);
                    qkv_w.extend(v.get("weight", &[h, h])?);
                    qkv_b.extend(v.get("bias", &[h])?);
                }
                Ok(Layer {
                    qkv: Dense::new(qkv_w, qkv_b, h, precision)?,
                    attention_out: Dense::load(a.at("output.dense"), h, h, precision)?,
                    attention_norm: norm(a.at("output.LayerNorm"), h)?,
                    intermediate: Dense::load(l.at("intermediate.dense"), config.intermediate_size, h, precision)?,
                    output: Dense::load(l.at("output.dense"), h, config.intermediate_size, precision)?,
                    output_norm: norm(l.at("output.LayerNorm"), h)?,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut token_type = e.get("token_type_embeddings.weight", &[config.type_vocab_size, h])?;
        token_type.truncate(h);
        Ok(Self {
            word: e.get("word_embeddings.weight", &[config.vocab_size, h])?,
            position: e.get("position_embeddings.weight", &[config.max_position_embeddings, h])?,
            token_type,
            embedding_norm: norm(e.at("LayerNorm"), h)?,
            layers,
            heads: config.num_attention_heads,
            head_dim: h / config.num_attention_heads,
            eps: config.layer_norm_eps as f32,
            max_positions: config.max_position_embeddings,
        })
    }

    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Mean-pooled, L2-normalised embeddings of token-id sequences (each non-empty and no longer
    /// than the position table), in order.
    pub fn embed(&self, sequences: &[&[u32]]) -> anyhow::Result<Vec<Vec<f32>>> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let lens: Vec<usize> = sequences.iter().map(|s| s.len()).collect();
        anyhow::ensure!(
            lens.iter().all(|&l| l > 0 && l <= self.max_positions),
            "sequences must hold 1..={} tokens",
            self.max_positions
        );
        let device = Device::Cpu;
        // Each token's row: its word's, its position's and token type 0's, summed.
        let hidden = self.hidden();
        let tokens: usize = lens.iter().sum();
        let mut rows = Vec::with_capacity(tokens * hidden);
        for sequence in sequences {
            for (position, &id) in sequence.iter().enumerate() {
                let word = self.word.get(id as usize * hidden..(id as usize + 1) * hidden);
                let word = word.ok_or_else(|| anyhow::anyhow!("token id {id} is outside the vocabulary"))?;
                let at = &self.position[position * hidden..(position + 1) * hidden];
                rows.extend(word.iter().zip(at).zip(&self.token_type).map(|((w, p), t)| w + p + t));
            }
        }
        let mut x = Tensor::from_vec(rows, (tokens, hidden), &device)?;
        x = x.apply_op1_no_bwd(&AddNorm { norm: &self.embedding_norm, eps: self.eps })?;
        let attention = PackedAttention { lens: lens.clone(), heads: self.heads, head_dim: self.head_dim };
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x)?;
            let context = qkv.apply_op1_no_bwd(&attention)?;
            let attended = layer.attention_out.forward(&context)?;
            x = attended.apply_op2_no_bwd(&x, &AddNorm { norm: &layer.attention_norm, eps: self.eps })?;
            let inner = layer.intermediate.forward(&x)?.apply_op1_no_bwd(&Gelu)?;
            let out = layer.output.forward(&inner)?;
            x = out.apply_op2_no_bwd(&x, &AddNorm { norm: &layer.output_norm, eps: self.eps })?;
        }
        let rows = x.flatten_all()?.to_vec1::<f32>()?;
        Ok(pool(&rows, &lens, self.hidden()))
    }
}

/// The mean of each sequence's token rows, scaled to unit length.
fn pool(rows: &[f32], lens: &[usize], hidden: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let mut v = vec![0f32; hidden];
        for row in rows[start * hidden..(start + len) * hidden].chunks_exact(hidden) {
            v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
        // The mean's scale vanishes in the normalisation; divide anyway so `v` is the mean.
        v.iter_mut().for_each(|a| *a /= len as f32);
        super::normalize(&mut v);
        out.push(v);
        start += len;
    }
    out
}

/// Contiguous f32 data of a CPU tensor, or an error naming the op.
fn f32_data<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op} needs a contiguous input"),
    }
}

/// [`kernels::attention`] as a candle op: `(tokens, 3·hidden)` → `(tokens, hidden)`.
struct PackedAttention {
    lens: Vec<usize>,
    heads: usize,
    head_dim: usize,
}

impl CustomOp1 for PackedAttention {
    fn name(&self) -> &'static str {
        "packed-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = f32_data(self.name(), storage, layout)?;
        let (tokens, hidden) = (self.lens.iter().sum::<usize>(), self.heads * self.head_dim);
        if layout.shape().dims() != [tokens, 3 * hidden] {
            candle_core::bail!("packed-attention: input {:?}, expected ({tokens}, {})", layout.shape(), 3 * hidden);
        }
        let mut out = vec![0f32; tokens * hidden];
        kernels::attention(qkv, &self.lens, self.heads, self.head_dim, &mut out);
        Ok((CpuStorage::F32(out), Shape::from((tokens, hidden))))
    }
}

/// [`kernels::add_layer_norm`] as a candle op: `x` (with the residual as a second input)
/// layer-normalised by `norm`.
struct AddNorm<'a> {
    norm: &'a Norm,
    eps: f32,
}

impl AddNorm<'_> {
    fn run(&self, x: &[f32], residual: Option<&[f32]>, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let width = self.norm.weight.len();
        if layout.shape().dims().last() != Some(&width) {
            candle_core::bail!("layer-norm: input {:?}, rows of {width} expected", layout.shape());
        }
        let mut out = x.to_vec();
        kernels::add_layer_norm(&mut out, residual, &self.norm.weight, &self.norm.bias, self.eps);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

impl CustomOp1 for AddNorm<'_> {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        self.run(f32_data("layer-norm", storage, layout)?, None, layout)
    }
}

impl CustomOp2 for AddNorm<'_> {
    fn name(&self) -> &'static str {
        "add-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!("add-layer-norm: {:?} plus {:?}", l1.shape(), l2.shape());
        }
        self.run(f32_data("add-layer-norm", s1, l1)?, Some(f32_data("add-layer-norm", s2, l2)?), l1)
    }
}

/// [`kernels::matmul`] as a candle op: `(rows, inner)` · `(inner, cols)`, plus a bias per column.
struct MatMul(Arc<Vec<f32>>);

impl CustomOp2 for MatMul {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w) = (f32_data(self.name(), s1, l1)?, f32_data(self.name(), s2, l2)?);
        let ((rows, inner), (inner_w, cols)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        if inner != inner_w {
            candle_core::bail!("matmul: ({rows}, {inner}) by ({inner_w}, {cols})");
        }
        let mut out = vec![0f32; rows * cols];
        kernels::matmul(x, w, rows, inner, cols, &mut out);
        kernels::add_bias(&mut out, &self.0);
        Ok((CpuStorage::F32(out), Shape::from((rows, cols))))
    }
}

/// [`kernels::qmatmul`] as a candle op: `(rows, inner)` · int8 `Wᵀ`, plus a bias per column.
struct QMatMul(Arc<kernels::QWeights>, Arc<Vec<f32>>);

impl CustomOp1 for QMatMul {
    fn name(&self) -> &'static str {
        "qmatmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_data(self.name(), storage, layout)?;
        let (rows, inner) = layout.shape().dims2()?;
        if inner != self.0.inner() {
            candle_core::bail!("qmatmul: ({rows}, {inner}) by int8 ({}, {})", self.0.inner(), self.0.cols());
        }
        let mut out = vec![0f32; rows * self.0.cols()];
        kernels::qmatmul(x, rows, &self.0, &mut out);
        kernels::add_bias(&mut out, &self.1);
        Ok((CpuStorage::F32(out), Shape::from((rows, self.0.cols()))))
    }
}

/// [`kernels::gelu`] as a candle op.
struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let mut out = f32_data(self.name(), storage, layout)?.to_vec();
        kernels::gelu(&mut out);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_averages_each_sequence_and_normalises() {
        let rows = [1.0, 0.0, 3.0, 0.0, /* next */ 0.0, 2.0];
        let v = pool(&rows, &[2, 1], 2);
        assert_eq!(v, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    }
}
