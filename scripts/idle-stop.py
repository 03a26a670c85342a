#!/usr/bin/env python3
"""What `idle_stop` gives back and costs: ten stdio backends (the demo testkit) behind one
gateway, measured while running and once dormant (resident memory and CPU time of the gateway
and of its children, from /proc), then the first call after a wake against the next one.

Usage: scripts/idle-stop.py [TOOLMUX]   (default: target/release/toolmux; Linux only)
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

BACKENDS = 10
IDLE = 3  # seconds


def proc(pid: int) -> tuple[int, float]:
    """Resident KiB and CPU seconds (user + system) of one process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = []
        # Children are listed under the thread that started them.
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except OSError:
                pass
        out += kids
        todo += kids
    return out


def snapshot(gateway: int) -> str:
    g = proc(gateway)
    kids = [proc(k) for k in descendants(gateway)]
    return (f"gateway {g[0] / 1024:.1f} MiB, {g[1]:.2f} s CPU; {len(kids)} children "
            f"{sum(k[0] for k in kids) / 1024:.1f} MiB, {sum(k[1] for k in kids):.2f} s CPU")


def rpc(url: str, session: str | None, method: str, params: dict, id: int) -> tuple[dict, str | None]:
    body = json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).encode()
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session:
        headers["mcp-session-id"] = session
    with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as r:
        text = r.read().decode()
        sid = r.headers.get("mcp-session-id") or session
    for line in text.splitlines():
        if line.startswith("data:") and '"id"' in line:
            return json.loads(line[5:]), sid
    return json.loads(text), sid


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/toolmux"
    work = tempfile.mkdtemp()
    config = os.path.join(work, "idle.toml")
    with open(config, "w") as f:
        f.write('[server]\nlisten = "127.0.0.1:0"\nmode = "passthrough"\n[health]\ninterval = "1s"\n')
        for i in range(BACKENDS):
            f.write(f'[[backends]]\nname = "kit{i}"\ncommand = "{binary}"\n'
                    f'args = ["backend", "testkit", "--stdio"]\nidle_stop = "{IDLE}s"\n')
    out = open(os.path.join(work, "out"), "w+")
    gw = subprocess.Popen([binary, "serve", "--config", config], stdout=out, stderr=subprocess.DEVNULL)
    try:
        url = None
        for _ in range(300):
            out.seek(0)
            words = out.read().split()
            url = next((w for w in words if w.startswith("http://")), None)
            if url:
                break
            time.sleep(0.1)
        status = url.replace("/mcp", "/status")
        backends = lambda: json.load(urllib.request.urlopen(status))["backends"]
        while not all(b["health"] == "healthy" for b in backends()):
            time.sleep(0.2)
        print(f"running: {snapshot(gw.pid)}")
        while not all(b["health"] == "dormant" for b in backends()):
            time.sleep(0.2)
        time.sleep(1)
        print(f"dormant: {snapshot(gw.pid)}")
        _, sid = rpc(url, None, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                              "clientInfo": {"name": "idle-stop", "version": "0"}}, 0)
        args = {"name": "kit0_echo", "arguments": {"input": "x"}}
        t = time.perf_counter()
        rpc(url, sid, "tools/call", args, 1)
        woken = time.perf_counter() - t
        t = time.perf_counter()
        rpc(url, sid, "tools/call", args, 2)
        awake = time.perf_counter() - t
        print(f"first call after a wake {woken * 1000:.0f} ms; the next {awake * 1000:.1f} ms")
    finally:
        gw.terminate()
        gw.wait()


main()
