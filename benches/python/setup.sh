#!/usr/bin/env bash
# Installs the Python baselines that `cargo bench --bench embed` compares candle with:
# sentence-transformers on torch (CPU), and ONNX Runtime (the model exported with torch and
# quantised to int8 by ONNX Runtime), in a virtual environment under the user cache folder.
# Prints the environment's python. Large on x86_64 Linux, where PyPI's torch wheel brings its
# CUDA libraries (about 6 GB installed; only the CPU is used); small on arm64 and macOS.
set -euo pipefail
venv="${XDG_CACHE_HOME:-$HOME/.cache}/toolmux/python-baseline"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sentence_transformers, onnxruntime, onnx" 2>/dev/null; then
    echo "setting up $venv (torch, sentence-transformers, onnxruntime; one time) ..." >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "torch==2.15.0" "sentence-transformers==6.3.0" \
        "onnxruntime==1.32.0" "onnx==1.23.2" "onnxscript==0.7.2"
fi
echo "$venv/bin/python"
