"""The Python baseline for `cargo bench --bench embed`: sentence-transformers on torch (CPU).

Builds the all-MiniLM-L6-v2 pipeline (BERT, mean pooling, L2 normalisation, 256 tokens) from the
same model folder toolmux loads, then answers timing requests, one JSON object a line on stdin:

  {"op": "query", "texts": [...]}    embed each text alone; reply with each call's seconds
  {"op": "batch", "texts": [...], "batch_size": 32, "repeat": 3}
                                     embed all texts `repeat` times; reply with each pass's seconds
  {"op": "vectors", "texts": [...]}  reply with the vectors (to check both sides embed alike)
  {"op": "info"}                     versions, threads, peak RSS

The bench process drives it so that both sides run in alternating rounds on the same texts.
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
torch.set_num_threads(threads)

bert = Transformer(model_dir, max_seq_length=256)
dim = bert.get_embedding_dimension() if hasattr(bert, "get_embedding_dimension") else bert.get_word_embedding_dimension()
model = SentenceTransformer(modules=[bert, Pooling(dim, pooling_mode="mean"), Normalize()], device="cpu")
model.eval()


def embed(texts, batch_size):
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


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
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "threads": torch.get_num_threads(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    else:
        reply = {"error": f"unknown op {op}"}
    print(json.dumps(reply), flush=True)
