#!/usr/bin/env python3
"""find_tool over HTTP under load, with the official Python MCP SDK as the client.

The gateway (optimizer mode) fronts one stdio backend of 10,000 tools (this script, run with
`--backend`, on the SDK's own server). Callers ask find_tool new requests in turn (the model runs
for every one) for a few seconds, at 1, 8 and 64 callers; the callers are spread over several
client processes (one Python process saturates a core long before the gateway does). Printed per
level: requests per second, p50 and p99 latency, the ratio to one caller, the CPU the gateway
and the clients used (in cores), and the gateway's CPU per request. On a machine with few cores
the clients take a share of them: the gateway's throughput on the cores it could have is then
its cores divided by its CPU per request, printed last.

Usage: scripts/http-load.py [TOOLMUX] [--seconds N] [--tools N] [--legacy]
       (default: $CARGO_TARGET_DIR or target, release/toolmux; Linux only)

Runs in the Python SDK environment tests/sdk/run.sh installs (re-executes itself there).
"""

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

SDK_PYTHON = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "toolmux", "sdk", "python-mcp-2.3.0", "bin", "python",
)
LEVELS = [(1, 1), (8, 2), (64, 4)]  # (callers, client processes)
VERBS = ["create", "delete", "list", "get", "update", "search", "send", "cancel", "export", "import",
         "archive", "restore", "approve", "assign", "merge", "schedule", "publish", "sync", "tag", "rename"]
THINGS = ["invoice", "ticket", "repository", "message", "calendar event", "user", "dashboard", "file",
          "payment", "order", "shipment", "campaign", "contact", "deployment", "report", "alert",
          "database backup", "pull request", "wiki page", "budget", "lead", "playlist", "job", "secret",
          "container image"]


def tool_texts(n: int) -> list[tuple[str, str]]:
    """`n` distinct (name, description) pairs: a verb, a thing, and one of many services."""
    out = []
    i = 0
    while len(out) < n:
        verb, thing = VERBS[i % len(VERBS)], THINGS[(i // len(VERBS)) % len(THINGS)]
        service = i // (len(VERBS) * len(THINGS))
        name = f"svc{service}_{verb}_{thing.replace(' ', '_')}"
        out.append((name, f"{verb.capitalize()} a {thing} in service {service}'s workspace."))
        i += 1
    return out


def backend(n: int) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("load")
    for name, description in tool_texts(n):
        def run(target: str = "") -> str:
            return "done"
        server.add_tool(run, name=name, description=description)
    server.run("stdio")


def caller_process(url: str, callers: int, seconds: float, seed: int, mode: str, out) -> None:
    from mcp import Client

    async def one(c: int) -> tuple[list[float], int]:
        times, errors = [], 0
        async with Client(url, mode=mode) as client:
            end = time.perf_counter() + seconds
            i = 0
            while time.perf_counter() < end:
                q = f"{VERBS[(c + i) % len(VERBS)]} the {THINGS[i % len(THINGS)]} number {seed}-{c}-{i}"
                t = time.perf_counter()
                r = await client.call_tool("find_tool", {"tool_description": q})
                times.append(time.perf_counter() - t)
                errors += bool(r.is_error)
                i += 1
        return times, errors

    async def all_of() -> None:
        results = await asyncio.gather(*(one(c) for c in range(callers)))
        out.send(([t for ts, _ in results for t in ts], sum(e for _, e in results)))

    asyncio.run(all_of())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def level(url: str, gateway: int, callers: int, processes: int, seconds: float, seed: int, mode: str) -> dict:
    pipes, procs = [], []
    for p in range(processes):
        share = callers // processes + (1 if p < callers % processes else 0)
        parent, child = multiprocessing.Pipe(duplex=False)
        proc = multiprocessing.Process(target=caller_process, args=(url, share, seconds, seed * 100 + p, mode, child))
        pipes.append(parent)
        procs.append(proc)
    g0, t0 = cpu_seconds(gateway), time.perf_counter()
    for proc in procs:
        proc.start()
    times, errors, client_cpu = [], 0, 0.0
    for parent, proc in zip(pipes, procs):
        ts, e = parent.recv()
        client_cpu += cpu_seconds(proc.pid)
        times += ts
        errors += e
        proc.join()
    wall = time.perf_counter() - t0
    gateway_cpu = cpu_seconds(gateway) - g0
    times.sort()
    pct = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1000
    return {"callers": callers, "processes": processes, "requests": len(times), "errors": errors,
            "rps": len(times) / wall, "p50": pct(0.5), "p99": pct(0.99),
            "gateway_cores": gateway_cpu / wall, "client_cores": client_cpu / wall}


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--backend"]:
        return backend(int(args[1]))
    try:
        import mcp  # noqa: F401
    except ImportError:
        if os.path.exists(SDK_PYTHON) and sys.executable != SDK_PYTHON:
            os.execv(SDK_PYTHON, [SDK_PYTHON, *sys.argv])
        sys.exit(f"http-load: the Python MCP SDK is not installed; run tests/sdk/run.sh first ({SDK_PYTHON})")
    seconds, tools = 8.0, 10_000
    # The SDK's default ("auto": 2026-07-28, no session), or `--legacy`: an initialize handshake
    # and a session per caller.
    mode = "legacy" if "--legacy" in args else "auto"
    if "--seconds" in args:
        seconds = float(args[args.index("--seconds") + 1])
    if "--tools" in args:
        tools = int(args[args.index("--tools") + 1])
    positional = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or not args[i - 1].startswith("--"))]
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = positional[0] if positional else os.path.join(target, "release", "toolmux")
    work = tempfile.mkdtemp()
    config = os.path.join(work, "load.toml")
    with open(config, "w") as f:
        f.write('[server]\nlisten = "127.0.0.1:0"\nmode = "optimizer"\n'
                f'[optimizer]\ncache_dir = "{os.path.join(tempfile.gettempdir(), "toolmux-http-load-cache")}"\n'
                f'[[backends]]\nname = "load"\ncommand = "{sys.executable}"\n'
                f'args = ["{os.path.abspath(__file__)}", "--backend", "{tools}"]\n')
    out = open(os.path.join(work, "out"), "w+")
    gw = subprocess.Popen([binary, "serve", "--config", config], stdout=out, stderr=subprocess.DEVNULL)
    try:
        url = None
        while url is None:
            if gw.poll() is not None:
                sys.exit(f"http-load: the gateway exited ({gw.returncode})")
            out.seek(0)
            url = next((w for w in out.read().split() if w.startswith("http://")), None)
            time.sleep(0.1)
        status = url.replace("/mcp", "/status")
        started = time.perf_counter()
        while True:
            s = json.load(urllib.request.urlopen(status))
            if s["catalog"]["tools"] >= tools and s["catalog"]["search"] == "hybrid":
                break
            time.sleep(0.5)
        e = s["embedder"]
        print(f"gateway ready in {time.perf_counter() - started:.0f} s: {s['catalog']['tools']} tools, "
              f"{e.get('precision')} ({e.get('int8_kernel') or '-'}), {os.cpu_count()} CPUs; "
              f"{seconds:.0f} s a level, new requests only, the SDK's {mode} mode")
        print("| callers | client processes | requests/s | × one caller | p50 ms | p99 ms | gateway cores | client cores | gateway CPU ms a request | errors |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        one = None
        for i, (callers, processes) in enumerate(LEVELS):
            r = level(url, gw.pid, callers, processes, seconds, i, mode)
            one = one or r["rps"]
            print(f"| {callers} | {processes} | {r['rps']:.0f} | {r['rps'] / one:.2f} | {r['p50']:.1f} | "
                  f"{r['p99']:.1f} | {r['gateway_cores']:.2f} | {r['client_cores']:.2f} | "
                  f"{r['gateway_cores'] / r['rps'] * 1000:.2f} | {r['errors']} |", flush=True)
            last = r
        cores = os.cpu_count() or 1
        capacity = cores / (last["gateway_cores"] / last["rps"])
        print(f"at {last['callers']} callers the gateway's {last['gateway_cores'] / last['rps'] * 1000:.2f} ms of CPU a request "
              f"would answer {capacity:.0f} requests/s on all {cores} cores ({capacity / one:.1f}× one caller)")
    finally:
        gw.terminate()
        gw.wait()


if __name__ == "__main__":
    main()
