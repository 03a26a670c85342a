"""The Python baselines for `cargo bench --bench embed`, on the CPU: sentence-transformers on
torch (engine `torch`), or ONNX Runtime running the model quantised to int8 by ONNX Runtime's
own dynamic quantisation (engine `ort-int8`, the usual way to serve MiniLM in int8 on a CPU).

Builds the all-MiniLM-L6-v2 pipeline (BERT, mean pooling, L2 normalisation, 256 tokens) from the
same model folder toolmux loads, then answers timing requests, one JSON object a line on stdin:

  {"op": "query", "texts": [...]}    embed each text alone; reply with each call's seconds
  {"op": "batch", "texts": [...], "batch_size": 32, "repeat": 3}
                                     embed all texts `repeat` times; reply with each pass's seconds
  {"op": "vectors", "texts": [...]}  reply with the vectors (to check both sides embed alike)
  {"op": "info"}                     versions, threads, peak RSS

The bench process drives it so that every side runs in alternating rounds on the same texts.

Usage: st_worker.py MODEL_DIR [THREADS] [torch|ort-int8]. For `ort-int8` the model is exported
to ONNX with torch and quantised once, into a folder beside this environment's python.
"""

import json
import resource
import sys
import time

import torch
from sentence_transformers import SentenceTransformer

try:  # sentence-transformers 6 moved the module classes
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
except ImportError:
    from sentence_transformers.models import Normalize, Pooling, Transformer

model_dir = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads()
engine = sys.argv[3] if len(sys.argv) > 3 else "torch"
torch.set_num_threads(threads)

bert = Transformer(model_dir, max_seq_length=256)
dim = bert.get_embedding_dimension() if hasattr(bert, "get_embedding_dimension") else bert.get_word_embedding_dimension()
model = SentenceTransformer(modules=[bert, Pooling(dim, pooling_mode="mean"), Normalize()], device="cpu")
model.eval()


def embed_torch(texts, batch_size):
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def ort_int8_session():
    """The model exported to ONNX (opset 17, dynamic batch and length), its graph fused by ONNX
    Runtime's transformer optimizer (attention, LayerNorm, GELU), then quantised by
    `quantize_dynamic` (int8 weights per channel, activations quantised at run time): ONNX
    Runtime's own recipe for BERT models on a CPU. Cached by the model folder's name."""
    import os

    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cache = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "onnx", os.path.basename(model_dir.rstrip("/")))
    os.makedirs(cache, exist_ok=True)
    fp32, fused, int8 = (os.path.join(cache, f) for f in ("model.onnx", "model.fused.onnx", "model.int8.onnx"))
    sample = bert.tokenize(["an example text"])
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]
    if not os.path.exists(int8):
        hf = bert.auto_model if hasattr(bert, "auto_model") else bert.model
        hf.eval()
        axes = {n: {0: "batch", 1: "tokens"} for n in names}
        axes["hidden"] = {0: "batch", 1: "tokens"}

        class Hidden(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return self.inner(**dict(zip(names, args))).last_hidden_state

        torch.onnx.export(Hidden(hf), tuple(sample[n] for n in names), fp32, input_names=names,
                          output_names=["hidden"], dynamic_axes=axes, opset_version=17, dynamo=False)
        from onnxruntime.transformers import optimizer

        optimizer.optimize_model(fp32, model_type="bert", num_heads=0, hidden_size=0).save_model_to_file(fused)
        # The fused operators are ONNX Runtime's own, which ONNX shape inference cannot type.
        float32 = {"DefaultTensorType": 1}
        quantize_dynamic(fused, int8, weight_type=QuantType.QInt8, per_channel=True, extra_options=float32)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(int8, options, providers=["CPUExecutionProvider"])
    return session, names, onnxruntime.__version__


if engine == "ort-int8":
    import numpy

    session, input_names, ort_version = ort_int8_session()

    def embed(texts, batch_size):
        out = []
        for i in range(0, len(texts), batch_size):
            features = bert.tokenize(texts[i : i + batch_size])
            feeds = {n: features[n].numpy().astype(numpy.int64) for n in input_names}
            hidden = session.run(["hidden"], feeds)[0]
            mask = feeds["attention_mask"][..., None].astype(numpy.float32)
            pooled = (hidden * mask).sum(axis=1) / numpy.maximum(mask.sum(axis=1), 1e-9)
            out.append(pooled / numpy.maximum(numpy.linalg.norm(pooled, axis=1, keepdims=True), 1e-12))
        return numpy.concatenate(out) if out else numpy.zeros((0, dim), numpy.float32)
elif engine == "torch":
    embed = embed_torch
else:
    sys.exit(f"unknown engine {engine}")


embed(["warm up the model once"], 1)
print(json.dumps({"ready": True}), flush=True)

for line in sys.stdin:
    req = json.loads(line)
    op = req["op"]
    if op == "query":
        out = []
        for t in req["texts"]:
            start = time.perf_counter()
            embed([t], 1)
            out.append(time.perf_counter() - start)
        reply = {"seconds": out}
    elif op == "batch":
        out = []
        for _ in range(req.get("repeat", 1)):
            start = time.perf_counter()
            embed(req["texts"], req.get("batch_size", 32))
            out.append(time.perf_counter() - start)
        reply = {"seconds": out}
    elif op == "vectors":
        reply = {"vectors": embed(req["texts"], 32).tolist()}
    elif op == "info":
        import sentence_transformers

        reply = {
            "engine": engine,
            "runtime": f"onnxruntime {ort_version}" if engine == "ort-int8" else f"torch {torch.__version__}",
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "threads": torch.get_num_threads(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    else:
        reply = {"error": f"unknown op {op}"}
    print(json.dumps(reply), flush=True)
