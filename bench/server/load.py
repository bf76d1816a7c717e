#!/usr/bin/env python3
"""Bounded loopback load test of `dspec serve`: N concurrent clients x M requests each (chat,
half of them streaming), every response checked (one per request, its own request id echoed back
through a unique user message, no duplicates, finish_reason set, usage consistent). Reports
throughput and p50/p99 latency, and the server's RSS after warm-up vs at the end (must stay flat).

Usage (builds nothing; needs httpx or httpx2, e.g. the CI venv that has the openai SDK):
    python bench/server/load.py --dspec build/dspec [--model M.gguf --draft D.gguf]
        [--clients 8] [--requests 25] [--max-tokens 32] [--parallel 2]
Without --model it converts the test fixture target (tests/fixtures/drafter/target) with the tiny
tokenizer of tests/oracle/_tinytok.py and the dspark_b4_trained drafter into a temp dir."""
import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import httpx
except ImportError:  # the openai SDK 3.x ships httpx as httpx2
    import httpx2 as httpx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fixture_models(dspec, tmp):
    import _tinytok
    fx = os.path.join(ROOT, "tests", "fixtures", "drafter")
    hf = os.path.join(tmp, "hf")
    shutil.copytree(os.path.join(fx, "target"), hf)
    _tinytok.make_tokenizer(hf, 512)
    model, draft = os.path.join(tmp, "m.gguf"), os.path.join(tmp, "d.gguf")
    for src, dst in ((hf, model), (os.path.join(fx, "dspark_b4_trained"), draft)):
        subprocess.run([dspec, "convert", src, dst, "--type", "f32"], check=True,
                       capture_output=True)
    return model, draft


async def one(client, cid, k, max_tokens, stream, lat, seen, errors):
    tag = f"c{cid}r{k}"
    body = {"messages": [{"role": "user", "content": f"request {tag}: the data and the list"}],
            "max_tokens": max_tokens, "ignore_eos": True, "user": tag,
            "chat_template_kwargs": {"enable_thinking": False}}
    t0 = time.perf_counter()
    try:
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            n_chunks, usage, finish, rid = 0, None, None, None
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    errors.append(f"{tag}: HTTP {r.status_code}")
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    rid = ev["id"]
                    n_chunks += 1
                    if ev.get("usage"):
                        usage = ev["usage"]
                    if ev["choices"] and ev["choices"][0].get("finish_reason"):
                        finish = ev["choices"][0]["finish_reason"]
            ok = usage and usage["completion_tokens"] == max_tokens and finish == "length"
        else:
            r = await client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                errors.append(f"{tag}: HTTP {r.status_code} {r.text[:100]}")
                return
            j = r.json()
            rid = j["id"]
            ok = (j["usage"]["completion_tokens"] == max_tokens and
                  j["choices"][0]["finish_reason"] == "length")
        if not ok:
            errors.append(f"{tag}: bad response")
        if rid in seen:
            errors.append(f"{tag}: duplicate response id {rid}")
        seen.add(rid)
        lat.append(time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{tag}: {e!r}")


async def client_loop(base, key, cid, n, max_tokens, lat, seen, errors):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
        for k in range(n):
            await one(client, cid, k, max_tokens, (cid + k) % 2 == 1, lat, seen, errors)


async def wave(base, key, clients, requests, max_tokens):
    lat, seen, errors = [], set(), []
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(base, key, c, requests, max_tokens, lat, seen, errors)
                           for c in range(clients)))
    return time.perf_counter() - t0, lat, seen, errors


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--model")
    ap.add_argument("--draft")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=25)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-ram", type=int, default=64,
                    help="prefix cache MiB (small, so that it is full after the warm-up)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    srv = None
    try:
        model, draft = (a.model, a.draft) if a.model else fixture_models(a.dspec, tmp)
        cmd = [a.dspec, "serve", "-m", model, "--port", "0", "-t", str(a.threads), "--parallel",
               str(a.parallel), "--queue", str(a.clients), "--api-key", "k", "--cache-ram",
               str(a.cache_ram)]
        if draft:
            cmd += ["--draft", draft]
        log = open(os.path.join(tmp, "server.log"), "w+b")
        srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        port = None
        for _ in range(600):
            log.seek(0)
            m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", log.read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        if not port:
            raise SystemExit("server did not start")
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.05)
        # warm-up wave, then the measured wave
        asyncio.run(wave(base, "k", a.clients, max(4, a.requests // 3), a.max_tokens))
        rss0 = rss_kb(srv.pid)
        dt, lat, seen, errors = asyncio.run(wave(base, "k", a.clients, a.requests, a.max_tokens))
        rss1 = rss_kb(srv.pid)
        n = a.clients * a.requests
        print(f"requests: {len(lat)}/{n} ok, {len(seen)} distinct responses, "
              f"{len(errors)} errors")
        for e in errors[:10]:
            print("  error:", e)
        print(f"throughput: {len(lat) / dt:.1f} req/s, {len(lat) * a.max_tokens / dt:.0f} "
              f"generated tok/s ({a.clients} clients x {a.requests} requests, "
              f"{a.max_tokens} tokens each, --parallel {a.parallel})")
        print(f"latency: p50 {pct(lat, 0.5) * 1e3:.1f} ms, p99 {pct(lat, 0.99) * 1e3:.1f} ms")
        print(f"server RSS: {rss0 / 1024:.1f} MiB after warm-up, {rss1 / 1024:.1f} MiB at the "
              f"end ({(rss1 - rss0) / 1024:+.1f} MiB)")
        flat = rss1 - rss0 < max(8 * 1024, rss0 // 10)
        ok = not errors and len(seen) == n and flat
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if srv and srv.poll() is None:
            srv.terminate()
            try:
                srv.wait(timeout=10)
            except subprocess.TimeoutExpired:
                srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
