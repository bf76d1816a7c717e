#!/usr/bin/env python3
"""`dspec serve` end to end with the official `openai` SDK and raw HTTP, on a converted fixture
target (tests/fixtures/drafter/target) + a trained DSpark drafter and the small tokenizer of
_tinytok.py: models list, chat (non-streaming / streaming, usage, timings), stop strings,
max_tokens, thinking on/off, tool round trip on the request side, greedy determinism (speculative
server output == `dspec run` plain greedy), concurrent requests, queue full (503), client
disconnect cancels, prefix reuse on a second turn (cached tokens, output == a cold server),
tokenize/detokenize, metrics, every error case (400/401/404/405/413), exit 1 when the model
cannot load; logprobs / top_logprobs on a server with the bundled tiny target and DSpark drafter
(models/, where speculation accepts): shape, greedy top-1 under speculation, values == `dspec
logits` log-softmax, streaming == non-streaming, legacy completions shape, sampled runs; forced
tool calls (tool_choice "required" / a named function) on the tiny target: a well-formed call,
streamed tool-call deltas reassemble to the body's, logprobs ride with them, no call markup in
content, tool_choice errors; idle connections neither lock clients out nor stay open past
--timeout. Servers are always killed at the end; every wait is bounded."""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _tinytok  # noqa: E402

KEY = "sk-test-key"
DEADLINE = time.monotonic() + 420  # whole test


class R:
    passed = failed = 0

    @classmethod
    def check(cls, name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail else ''}",
              flush=True)
        if ok:
            cls.passed += 1
        else:
            cls.failed += 1
        return ok


class Server:
    def __init__(self, dspec, *args, log=None):
        self.log = open(log, "w+b")
        self.p = subprocess.Popen([dspec, "serve", "--port", "0", *args], stdout=self.log,
                                  stderr=subprocess.STDOUT)
        self.port = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and self.p.poll() is None:
            self.log.seek(0)
            m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if not self.port:
            self.kill()
            raise RuntimeError("server did not start: " + self.output()[-400:])

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self):
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            st, _, _ = raw(self.port, "GET", "/health")
            if st == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("server not ready")

    def kill(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self.log.close()


def raw(port, method, path, body=None, headers=None, key=KEY, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def metrics(port):
    _, _, d = raw(port, "GET", "/metrics")
    out = {}
    for line in d.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def run_dspec(dspec, *args):
    r = subprocess.run([dspec, *args], capture_output=True, timeout=120)
    if r.returncode:
        raise RuntimeError(r.stderr.decode(errors="replace")[-400:])
    return r.stdout.decode()


def err_of(data):
    try:
        return json.loads(data)["error"]
    except Exception:  # noqa: BLE001
        return {}


def sdk_checks(client, dspec, model):
    models = client.models.list()
    R.check("models.list", [m.id for m in models] == ["m"], [m.id for m in models])
    R.check("models.retrieve", client.models.retrieve("m").id == "m")

    # greedy determinism: speculative server == plain `dspec run`
    prompt = "def hello(self):\n    return"
    want = run_dspec(dspec, "run", "-m", model, "-p", prompt, "-n", "24")
    r = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
    R.check("completions: speculative greedy == dspec run plain greedy",
            r.choices[0].text == want, f"{r.choices[0].text!r} vs {want!r}")
    _, _, d = raw(client.port, "POST", "/tokenize", {"content": prompt})
    n_prompt = len(json.loads(d)["tokens"])
    R.check("completions: usage", r.usage.completion_tokens == 24 and
            r.usage.prompt_tokens == n_prompt and r.choices[0].finish_reason == "length", r.usage)
    text = r.choices[0].text
    s = client.completions.create(model="m", prompt=prompt, max_tokens=24, stream=True)
    R.check("completions: streaming text == non-streaming",
            "".join(c.choices[0].text for c in s if c.choices) == text)

    # chat, thinking off: content == `dspec run --chat --no-think`
    msgs = [{"role": "user", "content": "the data and the list"}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    want = run_dspec(dspec, "run", "-m", model, "--chat", "--no-think", "-p",
                     "the data and the list", "-n", "24")
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=24, extra_body=off)
    m = r.choices[0].message
    R.check("chat (thinking off) == dspec run --chat --no-think", m.content == want,
            f"{m.content!r} vs {want!r}")
    R.check("chat: usage and timings", r.usage.completion_tokens == 24 and
            r.usage.total_tokens == r.usage.prompt_tokens + 24 and
            r.model_extra.get("timings", {}).get("predicted_n") == 24, r.usage)
    chunks = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=24,
                                                 stream=True, extra_body=off,
                                                 stream_options={"include_usage": True}))
    first = chunks[0].choices[0].delta
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    fin = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    R.check("chat stream: role first, content == non-streaming, finish, usage last",
            first.role == "assistant" and content == m.content and len(fin) == 1 and
            fin[0].choices[0].finish_reason == "length" and "timings" in fin[0].model_extra and
            chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24 and
            not chunks[-1].choices, f"{len(chunks)} chunks")

    # thinking on: the output goes to reasoning_content
    want = run_dspec(dspec, "run", "-m", model, "--chat", "-p", "the data and the list", "-n",
                     "24")
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=24)
    m = r.choices[0].message
    reasoning = m.model_extra.get("reasoning_content") or ""
    R.check("chat (thinking on): reasoning_content == dspec run --chat",
            "</think>" not in want and reasoning.strip("\n") == want.strip("\n") and
            not m.content, f"{reasoning!r} vs {want!r}")
    chunks = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=24,
                                                 stream=True))
    sr = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                 for c in chunks if c.choices)
    R.check("chat stream (thinking on): reasoning deltas", sr == reasoning, f"{sr!r}")

    # stop strings (also across token boundaries) and max_tokens
    stop = text[9:13]
    cut = text[:text.index(stop)]
    r = client.completions.create(model="m", prompt=prompt, max_tokens=24, stop=[stop, "\x01"])
    R.check("stop string", r.choices[0].text == cut and r.choices[0].finish_reason == "stop",
            f"{r.choices[0].text!r} vs {cut!r}")
    s = client.completions.create(model="m", prompt=prompt, max_tokens=24, stop=stop,
                                  stream=True)
    R.check("stop string (stream)", "".join(c.choices[0].text for c in s if c.choices) == cut)
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=3, extra_body=off)
    R.check("max_tokens", r.usage.completion_tokens == 3 and
            r.choices[0].finish_reason == "length")
    r = client.chat.completions.create(model="m", messages=msgs, max_completion_tokens=2,
                                       extra_body=off)
    R.check("max_completion_tokens", r.usage.completion_tokens == 2)

    # tool round trip on the request side: tools + assistant tool_calls + tool result render
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    conv = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = client.chat.completions.create(model="m", messages=conv, tools=tools, max_tokens=4,
                                       extra_body=off)
    r0 = client.chat.completions.create(model="m", messages=conv[:1], max_tokens=4,
                                        extra_body=off)
    R.check("tool round trip (request side) renders and runs",
            r.usage.prompt_tokens > r0.usage.prompt_tokens + 50 and r.choices[0].finish_reason
            in ("length", "stop", "tool_calls"), f"{r.usage.prompt_tokens} prompt tokens")
    r2 = client.chat.completions.create(model="m", messages=conv, tools=tools,
                                        tool_choice="none", max_tokens=4, extra_body=off)
    R.check("tool_choice none drops the tool schemas",
            r2.usage.prompt_tokens < r.usage.prompt_tokens)

    # seeded sampling is reproducible
    a = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0.9,
                                       seed=11, extra_body=off).choices[0].message.content
    b = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0.9,
                                       seed=11, extra_body=off).choices[0].message.content
    R.check("seeded sampling reproducible", a == b, f"{a!r}")
    # without a seed each request samples afresh (OpenAI's meaning; the server has no --seed)
    outs = {client.chat.completions.create(model="m", messages=msgs, max_tokens=16,
                                           temperature=1.0, extra_body=off
                                           ).choices[0].message.content for _ in range(4)}
    R.check("unseeded sampling differs between requests", len(outs) >= 2, f"{outs!r}")


def concurrency_checks(client, port):
    prompts = ["the data and the list", "print the name", "def hello(self):", "import data"]
    off = {"chat_template_kwargs": {"enable_thinking": False}}

    def ask(p):
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": p}], max_tokens=16,
            extra_body=off).choices[0].message.content
    seq = [ask(p) for p in prompts]
    out = [None] * 4  # 2 sessions + 2 queue places: nothing is refused
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(prompts[i])))
           for i in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=60)
    R.check("concurrent requests == sequential results", out == seq)

    # queue: 2 running + 2 waiting, the 5th gets 503 with Retry-After; then disconnects cancel
    m0 = metrics(port)
    conns = []
    for i in range(4):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": prompts[i], "max_tokens": 3500, "stream": True, "ignore_eos": True}),
            headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        conns.append(c)
    t0 = time.monotonic()
    m = metrics(port)
    while time.monotonic() - t0 < 10 and not (m.get("dspec:requests_processing") == 2 and
                                              m.get("dspec:requests_deferred") == 2):
        time.sleep(0.01)
        m = metrics(port)
    st, h, d = raw(port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    R.check("queue full: 503 + Retry-After", st == 503 and h.get("Retry-After") == "1" and
            err_of(d).get("code") == "queue_full", f"{st} {d[:120]!r}")
    for c in conns:  # client disconnect mid-stream (two are running, two still queued)
        c.close()
    t0 = time.monotonic()
    m = metrics(port)
    while time.monotonic() - t0 < 10 and (m["dspec:requests_processing"] or
                                          m["dspec:requests_deferred"]):
        time.sleep(0.02)
        m = metrics(port)
    gen = m["dspec:tokens_predicted_total"] - m0["dspec:tokens_predicted_total"]
    R.check("disconnect cancels running and queued requests",
            m["dspec:requests_canceled_total"] - m0["dspec:requests_canceled_total"] == 4 and
            m["dspec:requests_processing"] == 0 and gen < 2 * 3500,
            f"{gen:.0f} tokens generated, {time.monotonic() - t0:.2f} s")

    # disconnect after a few streamed chunks
    m0 = metrics(port)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3500, "stream": True,
         "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}),
        headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    resp = c.getresponse()
    got = resp.read1(256)
    resp.close()
    c.close()
    t0 = time.monotonic()
    m = metrics(port)
    while time.monotonic() - t0 < 10 and (m["dspec:requests_canceled_total"] ==
                                          m0["dspec:requests_canceled_total"]):
        time.sleep(0.02)
        m = metrics(port)
    R.check("disconnect mid-stream cancels at the next step",
            resp.status == 200 and got.startswith(b"data: ") and
            m["dspec:requests_canceled_total"] == m0["dspec:requests_canceled_total"] + 1 and
            m["dspec:tokens_predicted_total"] - m0["dspec:tokens_predicted_total"] < 3500,
            f"{resp.status} {got[:30]!r} canceled "
            f"{m['dspec:requests_canceled_total'] - m0['dspec:requests_canceled_total']:.0f}, "
            f"{m['dspec:tokens_predicted_total'] - m0['dspec:tokens_predicted_total']:.0f} "
            f"tokens, {time.monotonic() - t0:.2f} s")


def error_checks(port):
    post = "/v1/chat/completions"
    ok_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    cases = [
        ("malformed JSON", post, "{\"messages\": [", 400, "invalid_json", None),
        ("body not an object", post, "[1, 2]", 400, None, None),
        ("messages missing", post, {"max_tokens": 3}, 400, None, "messages"),
        ("messages wrong type", post, {"messages": "hi"}, 400, None, "messages"),
        ("max_tokens wrong type", post, dict(ok_body, max_tokens="ten"), 400, None,
         "max_tokens"),
        ("temperature out of range", post, dict(ok_body, temperature=-1), 400, None,
         "temperature"),
        ("bad role", post, {"messages": [{"role": "robot", "content": "x"}]}, 400, None,
         "messages[0]"),
        ("stream wrong type", post, dict(ok_body, stream="yes"), 400, None, "stream"),
        ("unknown model", post, dict(ok_body, model="gpt-9"), 404, "model_not_found", "model"),
        ("prompt longer than the context", "/v1/completions",
         {"prompt": "hello world " * 3000, "max_tokens": 1}, 400, "context_length_exceeded",
         "prompt"),
        ("completions prompt missing", "/v1/completions", {"max_tokens": 1}, 400, None,
         "prompt"),
        ("completions batch of prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400,
         None, "prompt"),
        ("user message without content", post, {"messages": [{"role": "user"}]}, 400, None,
         "messages[0].content"),
        ("deprecated functions", post, dict(ok_body, functions=[{"name": "f"}]), 400, None,
         "functions"),
        ("U+0000 in a string (valid JSON)", post,
         {"messages": [{"role": "user", "content": "a\u0000b"}]}, 400, "invalid_value", None),
    ]
    for name, path, body, status, code, param in cases:
        st, _, d = raw(port, "POST", path, body)
        e = err_of(d)
        R.check(f"error: {name} -> {status}", st == status and e.get("message") and
                e.get("type") and (code is None or e.get("code") == code) and
                (param is None or e.get("param") == param), f"{st} {d[:160]!r}")
    st, _, d = raw(port, "POST", post, "x" * 70000)
    R.check("error: body over the size limit -> 413", st == 413 and err_of(d).get("message"),
            f"{st}")
    # a body far larger than the socket buffers, sent without "Expect": read (and dropped) to
    # its end, then the 413 (refused at once, the client found its upload cut: EPIPE)
    try:
        st, _, d = raw(port, "POST", post, "x" * (8 << 20))
    except OSError as e:
        st = repr(e)
    R.check("error: an 8 MB body without Expect -> 413", st == 413, f"{st}")
    # "Expect: 100-continue": a body over the limit, or a request without the key, is refused
    # before the upload (no "100 Continue" first)
    for name, key, length, want in (("413", KEY, 70000, b"HTTP/1.1 413"),
                                    ("401", None, 10, b"HTTP/1.1 401")):
        sk = socket.create_connection(("127.0.0.1", port), timeout=10)
        auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
        sk.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                   % (post.encode(), auth, length))
        first = sk.recv(64)
        sk.close()
        R.check(f"error: Expect 100-continue -> {name} before the upload",
                first.startswith(want), f"{first!r}")
    st, h, d = raw(port, "POST", post, ok_body, key="wrong")
    R.check("error: bad API key -> 401", st == 401 and
            err_of(d).get("type") == "authentication_error", f"{st}")
    st, _, _ = raw(port, "GET", "/v1/models", key=None)
    R.check("error: missing API key -> 401", st == 401)
    st, _, _ = raw(port, "GET", "/health", key=None)
    R.check("health needs no key", st == 200)
    st, _, d = raw(port, "GET", "/v1/nothing")
    R.check("error: unknown route -> 404", st == 404 and err_of(d).get("message"))
    st, _, d = raw(port, "GET", post)
    R.check("error: wrong method -> 405", st == 405 and err_of(d).get("message"))
    st, _, d = raw(port, "GET", "/v1/models/other")
    R.check("error: another model id -> 404", st == 404 and
            err_of(d).get("code") == "model_not_found", f"{st} {d[:160]!r}")
    for path in ("/health", "/v1/models"):
        st, h, d = raw(port, "HEAD", path)
        R.check(f"HEAD {path} -> 200, headers only", st == 200 and d == b"" and
                h.get("Content-Type") == "application/json", f"{st} {h} {d[:60]!r}")
    for name, path, body, param in (
            ("top_logprobs 21", post, dict(ok_body, logprobs=True, top_logprobs=21),
             "top_logprobs"),
            ("top_logprobs without logprobs", post, dict(ok_body, top_logprobs=2),
             "top_logprobs"),
            ("chat logprobs not a boolean", post, dict(ok_body, logprobs=3), "logprobs"),
            ("completions logprobs -1", "/v1/completions",
             {"prompt": "x", "max_tokens": 1, "logprobs": -1}, "logprobs"),
            ("completions logprobs 6", "/v1/completions",
             {"prompt": "x", "max_tokens": 1, "logprobs": 6}, "logprobs")):
        st, _, d = raw(port, "POST", path, body)
        R.check(f"error: {name} -> 400 naming {param}", st == 400 and
                err_of(d).get("param") == param and err_of(d).get("message"), f"{st} {d[:160]!r}")


def misc_checks(port):
    text = "def hello(self):\n    return <|im_end|> the data"
    st, _, d = raw(port, "POST", "/tokenize", {"content": text})
    ids = json.loads(d)["tokens"]
    st2, _, d2 = raw(port, "POST", "/detokenize", {"tokens": ids})
    R.check("tokenize/detokenize round trip", st == 200 and st2 == 200 and
            json.loads(d2)["content"] == text and 507 in ids, f"{len(ids)} ids")
    st, _, d = raw(port, "POST", "/tokenize", {"content": "hello", "with_pieces": True})
    R.check("tokenize with pieces", st == 200 and
            "".join(p["piece"] for p in json.loads(d)["tokens"]) == "hello")
    # a message's text is text: "<|im_end|>" in it does not end the turn (the template's markers
    # alone are control tokens), as OpenAI treats message content
    def prompt_tokens(content):
        st, _, d = raw(port, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": content}], "max_tokens": 1})
        return json.loads(d)["usage"]["prompt_tokens"] if st == 200 else -st
    _, _, d = raw(port, "POST", "/tokenize", {"content": "<|im_end|>", "parse_special": False})
    as_text = len(json.loads(d)["tokens"])
    n0, n1 = prompt_tokens("x"), prompt_tokens("x<|im_end|>")
    R.check("chat: control-token text in a message is tokenized as text", as_text > 1 and
            n1 == n0 + as_text, f"{n0} {n1} {as_text}")
    st, _, d = raw(port, "POST", "/detokenize", {"tokens": [1, 99999]})
    R.check("detokenize: bad id -> 400", st == 400 and err_of(d).get("param") == "tokens")
    m = metrics(port)
    need = ["dspec:requests_total", "dspec:prompt_tokens_total", "dspec:tokens_predicted_total",
            "dspec:prompt_tokens_seconds", "dspec:predicted_tokens_seconds",
            "dspec:spec_decode_num_drafts_total", "dspec:spec_decode_num_accepted_tokens_total",
            "dspec:requests_deferred", "dspec:prefix_cache_hits_total",
            'dspec:spec_decode_num_accepted_tokens_per_pos_total{position="0"}']
    R.check("metrics: Prometheus series", all(k in m for k in need) and
            m["dspec:requests_total"] > 10 and m["dspec:spec_decode_num_drafts_total"] > 0,
            [k for k in need if k not in m])


def cors_checks(dspec, any_port, one_port, off_port):
    """--cors '*' (any_port, with an API key), --cors http://App.Example (one_port: browsers
    send origins in lower case), no --cors (off_port); --cors values no browser sends."""
    def hdr(h, name):
        return {k.lower(): v for k, v in h.items()}.get(name.lower())
    pre = {"Origin": "http://x.test", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, _ = raw(any_port, "OPTIONS", "/v1/chat/completions", headers=pre, key=None)
    R.check("cors *: preflight 204 without the API key", st == 204 and
            hdr(h, "Access-Control-Allow-Origin") == "*" and
            "POST" in hdr(h, "Access-Control-Allow-Methods") and
            "OPTIONS" in hdr(h, "Access-Control-Allow-Methods") and
            hdr(h, "Access-Control-Allow-Headers") == "authorization, content-type", (st, h))
    st, h, _ = raw(any_port, "GET", "/v1/models", headers={"Origin": "http://x.test"})
    st2, h2, _ = raw(any_port, "GET", "/v1/models", headers={"Origin": "http://x.test"},
                     key=None)
    R.check("cors *: responses and errors readable", st == 200 and st2 == 401 and
            hdr(h, "Access-Control-Allow-Origin") == "*" and
            hdr(h2, "Access-Control-Allow-Origin") == "*" and
            hdr(h2, "Access-Control-Expose-Headers") == "Retry-After", (st, st2))
    st, h, d = raw(any_port, "POST", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                    "stream": True}, headers={"Origin": "http://x.test"})
    R.check("cors *: streamed response", st == 200 and b"data: [DONE]" in d and
            hdr(h, "Access-Control-Allow-Origin") == "*", (st, h))
    app = {"Origin": "http://app.example"}
    st, h, _ = raw(one_port, "GET", "/v1/models", headers=app)
    st2, h2, _ = raw(one_port, "GET", "/v1/models", headers={"Origin": "http://evil.example"})
    R.check("cors origin: only that origin may read", st == 200 and st2 == 200 and
            hdr(h, "Access-Control-Allow-Origin") == "http://app.example" and
            hdr(h2, "Access-Control-Allow-Origin") is None and
            hdr(h, "Vary") == "Origin" and hdr(h2, "Vary") == "Origin", (h, h2))
    st, h, _ = raw(one_port, "OPTIONS", "/v1/models",
                   headers={**app, "Access-Control-Request-Method": "GET"}, key=None)
    st2, _, _ = raw(one_port, "OPTIONS", "/nope", headers=app, key=None)
    R.check("cors origin: preflight of a GET route; unknown path 404", st == 204 and
            hdr(h, "Access-Control-Allow-Methods") == "GET, OPTIONS" and
            hdr(h, "Access-Control-Allow-Origin") == "http://app.example" and st2 == 404,
            (st, st2, h))
    bad = [subprocess.run([dspec, "serve", "-m", "x.gguf", "--cors", v], capture_output=True,
                          timeout=30) for v in ("http://a.example/", "https://a.example:443",
                                                "http://user@a.example")]
    R.check("--cors refuses what is not an origin", all(
        b.returncode == 2 and b"expected * or an origin" in b.stderr for b in bad),
        [b.returncode for b in bad])
    st, h, _ = raw(off_port, "OPTIONS", "/v1/chat/completions", headers=pre, key=None)
    st2, h2, _ = raw(off_port, "GET", "/health", headers={"Origin": "http://x.test"})
    R.check("no --cors: OPTIONS 405, no CORS headers", st == 405 and st2 == 200 and
            hdr(h, "Access-Control-Allow-Origin") is None and
            hdr(h2, "Access-Control-Allow-Origin") is None, (st, st2))


def prefix_checks(client, cold, port):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    # the cold server runs with --seed 7: requests without a seed all use it
    outs = {cold.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=16, temperature=1.0, extra_body=off
                                         ).choices[0].message.content for _ in range(2)}
    R.check("--seed seeds requests without one", len(outs) == 1, f"{outs!r}")
    sys_msg = {"role": "system", "content": "You write data and list names. " * 20}
    conv = [sys_msg, {"role": "user", "content": "the data and the list"}]
    r1 = client.chat.completions.create(model="m", messages=conv, max_tokens=16, extra_body=off)
    conv += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "print the name"}]
    for label, kw in (("greedy", {}), ("seeded sampling", {"temperature": 0.8, "seed": 5})):
        m0 = metrics(port)
        warm = client.chat.completions.create(model="m", messages=conv, max_tokens=24,
                                              extra_body=off, **kw)
        m1 = metrics(port)
        ref = cold.chat.completions.create(model="m", messages=conv, max_tokens=24,
                                           extra_body=off, **kw)
        cached = warm.usage.prompt_tokens_details.cached_tokens
        R.check(f"prefix reuse on the second turn ({label}): cached tokens, output == cold",
                cached > 100 and ref.usage.prompt_tokens_details.cached_tokens == 0 and
                warm.choices[0].message.content == ref.choices[0].message.content and
                m1["dspec:prefix_cache_hits_total"] == m0["dspec:prefix_cache_hits_total"] + 1,
                f"{cached}/{warm.usage.prompt_tokens} cached; prefill "
                f"{warm.model_extra['timings']['prompt_ms']:.2f} ms vs cold "
                f"{ref.model_extra['timings']['prompt_ms']:.2f} ms")


def logprob_checks(client, port, dspec, tiny):
    """Server on the bundled tiny target + DSpark drafter (greedy speculation accepts there)."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    msgs = [{"role": "user", "content": "Write a C program that prints hello."}]
    kw = dict(model="m", messages=msgs, max_tokens=24, temperature=0, logprobs=True,
              top_logprobs=3, extra_body=off)
    r = client.chat.completions.create(**kw)
    ents = r.choices[0].logprobs.content
    lps = [e.logprob for e in ents] + [t.logprob for e in ents for t in e.top_logprobs]
    R.check("chat logprobs: one entry per generated token, 3 alternatives, logprobs <= 0",
            len(ents) == r.usage.completion_tokens == 24 and
            all(len(e.top_logprobs) == 3 for e in ents) and all(x <= 0 for x in lps) and
            b"".join(bytes(e.bytes) for e in ents).decode(errors="replace") ==
            r.choices[0].message.content, f"{len(ents)} entries")
    R.check("chat logprobs: top_logprobs sorted, the chosen token's entry agrees",
            all(all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:]))
                for e in ents) and
            all(t.logprob == e.logprob for e in ents for t in e.top_logprobs
                if t.bytes == e.bytes))
    tm = r.model_extra["timings"]
    R.check("greedy speculative: the emitted token is the top-1 at every position",
            all(e.bytes == e.top_logprobs[0].bytes and e.logprob == e.top_logprobs[0].logprob
                for e in ents) and tm.get("draft_n_accepted", 0) > 0,
            f"accepted {tm.get('draft_n_accepted')} of {tm.get('draft_n')}")
    chunks = list(client.chat.completions.create(**kw, stream=True))
    sents = [e for c in chunks if c.choices and c.choices[0].logprobs
             for e in c.choices[0].logprobs.content]
    R.check("streaming logprobs == non-streaming",
            [e.model_dump() for e in sents] == [e.model_dump() for e in ents],
            f"{len(sents)} vs {len(ents)} entries")

    # values == log-softmax of `dspec logits` rows for the same prefix (token ids: the vLLM
    # return_tokens_as_token_ids extension)
    prompt = "#include <stdio.h>\n#include <"
    _, _, d = raw(port, "POST", "/tokenize", {"content": prompt})
    ids = json.loads(d)["tokens"]
    c = client.completions.create(model="m", prompt=ids, max_tokens=16, temperature=0,
                                  logprobs=5, extra_body={"return_tokens_as_token_ids": True})
    lp = c.choices[0].logprobs
    gen = [int(t.split(":")[1]) for t in lp.tokens]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.bin")
        run_dspec(dspec, "logits", "-m", tiny, "--tokens", ",".join(map(str, ids + gen[:-1])),
                  "--out", out, "--kv-type", "f16", "-t", "2")
        rows = np.fromfile(out, dtype=np.float32).astype(np.float64)
    rows = rows.reshape(len(ids) + len(gen) - 1, -1)[len(ids) - 1:]
    ls = rows - rows.max(axis=1, keepdims=True)
    ls -= np.log(np.exp(ls).sum(axis=1, keepdims=True))
    err = 0.0
    top_ok = len(gen) == 16
    for j, (g, top) in enumerate(zip(gen, lp.top_logprobs)):
        err = max(err, abs(lp.token_logprobs[j] - ls[j, g]))
        tids = [int(k.split(":")[1]) for k in top]
        err = max([err] + [abs(v - ls[j, int(k.split(":")[1])]) for k, v in top.items()])
        want = set(np.argsort(-ls[j], kind="stable")[:5].tolist())
        top_ok &= len(top) in (5, 6) and want <= set(tids) and g in tids
    R.check("completions logprobs == log-softmax of `dspec logits` (1e-4), top-5 == its top 5",
            err < 1e-4 and top_ok and c.model_extra["timings"].get("draft_n_accepted", 0) > 0,
            f"max error {err:.2e}")

    # legacy completions shape, logprobs=2, streaming == non-streaming
    c = client.completions.create(model="m", prompt=prompt, max_tokens=12, logprobs=2)
    lp = c.choices[0].logprobs
    n = c.usage.completion_tokens
    R.check("completions logprobs=2: tokens, token_logprobs, top_logprobs, text_offset",
            len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) ==
            len(lp.text_offset) == n == 12 and
            all(len(t) in (2, 3) and lp.tokens[i] in t and t[lp.tokens[i]] == lp.token_logprobs[i]
                for i, t in enumerate(lp.top_logprobs)) and
            lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)] and
            "".join(lp.tokens) == c.choices[0].text, lp.tokens)
    s = client.completions.create(model="m", prompt=prompt, max_tokens=12, logprobs=2,
                                  stream=True)
    parts = [ch.choices[0].logprobs for ch in s if ch.choices and ch.choices[0].logprobs]
    R.check("completions streaming logprobs == non-streaming",
            [t for p in parts for t in p.tokens] == lp.tokens and
            [x for p in parts for x in p.token_logprobs] == lp.token_logprobs and
            [x for p in parts for x in p.text_offset] == lp.text_offset)

    # sampled speculative verification reports logprobs too (seeded: reproducible)
    kw = dict(kw, temperature=0.8, seed=3, max_tokens=16)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    ea = a.choices[0].logprobs.content
    R.check("sampled: one entry per token, reproducible, chosen entry agrees",
            len(ea) == a.usage.completion_tokens and
            [e.model_dump() for e in ea] ==
            [e.model_dump() for e in b.choices[0].logprobs.content] and
            all(t.logprob == e.logprob for e in ea for t in e.top_logprobs
                if t.bytes == e.bytes) and all(e.logprob <= 0 for e in ea))


def reassemble(chunks):
    """Tool calls of a streamed chat response, checking the OpenAI delta shapes: the first delta
    of a call (new index, in order) has id, type, name and arguments ""; later ones only
    arguments fragments. Returns (calls, content, logprob entries, finish reasons, problems)."""
    calls, content, ents, fins, bad = [], "", [], [], []
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        content += ch.delta.content or ""
        if ch.logprobs and ch.logprobs.content:
            ents += ch.logprobs.content
        if ch.finish_reason:
            fins.append(ch.finish_reason)
        for t in ch.delta.tool_calls or []:
            if t.index == len(calls):
                if not (t.id and t.type == "function" and t.function.name is not None and
                        t.function.arguments == ""):
                    bad.append(f"first delta {t}")
                calls.append({"id": t.id, "name": t.function.name, "arguments": ""})
            elif 0 <= t.index < len(calls) and t.id is None and t.function.name is None and \
                    t.function.arguments:
                calls[t.index]["arguments"] += t.function.arguments
            else:
                bad.append(f"delta {t}")
    return calls, content, ents, fins, bad


def tool_checks(client, port):
    """tool_choice "required" / a named function on the tiny target (which does not call tools
    on its own): the response must hold a well-formed call; streamed deltas == the body."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "search", "parameters": {"type": "object", "properties": {
                "q": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    named = {"type": "function", "function": {"name": "search"}}

    def calls_of(m):
        return [{"name": t.function.name, "arguments": t.function.arguments,
                 "id": t.id, "type": t.type} for t in m.tool_calls or []]

    def well_formed(cs):
        try:
            return len(cs) >= 1 and all(
                c["type"] == "function" and c["id"].startswith("call_") and
                isinstance(c["name"], str) and isinstance(json.loads(c["arguments"]), dict)
                for c in cs) and len({c["id"] for c in cs}) == len(cs)
        except (ValueError, TypeError):
            return False

    for label, choice, extra in (("required", "required", {}),  # thinking on by default
                                 ("named function", named, {"logprobs": True, "top_logprobs": 1}),
                                 ("required, no parallel calls", "required",
                                  {"parallel_tool_calls": False})):
        kw = dict(model="m", messages=msgs, tools=tools, tool_choice=choice, max_tokens=16,
                  temperature=0, **extra)
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        cs = calls_of(m)
        R.check(f"tool_choice {label}: finish tool_calls, a well-formed call, no call text in "
                f"content, no reasoning", r.choices[0].finish_reason == "tool_calls" and
                well_formed(cs) and (choice == "required" or
                                     [c["name"] for c in cs] == ["search"]) and
                (len(cs) == 1 or (choice == "required" and "parallel_tool_calls" not in extra)) and
                m.content is None and not (m.model_extra or {}).get("reasoning_content"),
                f"{cs} content {m.content!r}")
        chunks = list(client.chat.completions.create(**kw, stream=True))
        scs, content, ents, fins, bad = reassemble(chunks)
        R.check(f"tool_choice {label} streamed: deltas reassemble to the body's calls",
                not bad and fins == ["tool_calls"] and content == "" and
                [(c["name"], c["arguments"]) for c in scs] ==
                [(c["name"], c["arguments"]) for c in cs] and
                all(c["id"].startswith("call_") for c in scs),
                f"{bad[:2]} {fins} {scs} vs {cs}")
        if extra.get("logprobs"):
            R.check("tool_choice named + logprobs: entries ride with the tool-call chunks, "
                    "stream == body", len(ents) == r.usage.completion_tokens and
                    [e.model_dump() for e in ents] ==
                    [e.model_dump() for e in r.choices[0].logprobs.content],
                    f"{len(ents)} entries, {r.usage.completion_tokens} tokens")
        if label == "required":  # a few-token budget still ends in a call
            r = client.chat.completions.create(**dict(kw, max_tokens=1))
            R.check("tool_choice required, max_tokens 1: still a well-formed call",
                    r.choices[0].finish_reason == "tool_calls" and
                    well_formed(calls_of(r.choices[0].message)), calls_of(r.choices[0].message))
    # raw SSE: no tool-call markup in any content delta
    st, _, d = raw(port, "POST", "/v1/chat/completions", {
        "messages": msgs, "tools": tools, "tool_choice": named, "max_tokens": 12,
        "stream": True}, key=None)
    R.check("tool_choice named (raw SSE): no <tool_call>/<function= text in the stream",
            st == 200 and b"<tool_call>" not in d and b"<function=" not in d and
            b'"finish_reason":"tool_calls"' in d, d[-200:])
    for name, body in (
            ("named function not in tools", {"tools": tools, "tool_choice": {
                "type": "function", "function": {"name": "nope"}}}),
            ("required without tools", {"tool_choice": "required"}),
            ("tool_choice object without function.name",
             {"tools": tools, "tool_choice": {"type": "function"}})):
        st, _, d = raw(port, "POST", "/v1/chat/completions",
                       dict(body, messages=msgs, max_tokens=1), key=None)
        R.check(f"error: {name} -> 400 naming tool_choice", st == 400 and
                err_of(d).get("param") == "tool_choice", f"{st} {d[:160]!r}")


def idle_checks(dspec, tiny, log):
    """Idle connections do not lock clients out: with --queue 1 the server holds 258
    connections (it once held 65, and clients past them waited for the 600 s timeout), so 200
    sockets that never send a request leave /health answering at once; --timeout then closes
    them."""
    srv = Server(dspec, "-m", tiny, "-t", "1", "--parallel", "1", "--queue", "1",
                 "--timeout", "5", log=log)
    socks = []
    try:
        srv.wait_ready()
        for _ in range(200):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=20))
        t0 = time.monotonic()
        st, _, _ = raw(srv.port, "GET", "/health", timeout=20)
        dt = time.monotonic() - t0
        R.check("200 idle connections: /health answers before they time out", st == 200 and
                dt < 2.5, f"{st} after {dt:.1f} s")
        closed = 0
        for sk in socks:
            try:
                closed += sk.recv(1) == b""
            except OSError:
                pass
        R.check("idle connections closed after --timeout", closed == 200, f"{closed} of 200")
    finally:
        for sk in socks:
            sk.close()
        srv.kill()


def shutdown_checks(dspec, tiny, log):
    """SIGTERM with one stream running and a stream and a plain request queued: the running
    stream ends with an SSE error event and the chunked terminator, the queued ones with 503
    (the sockets once closed before those bytes went out)."""
    srv = Server(dspec, "-m", tiny, "-t", "1", "--parallel", "1", log=log)
    try:
        srv.wait_ready()
        out = {}

        def go(i, stream):
            b = json.dumps({"prompt": "def main():", "max_tokens": 100000, "ignore_eos": True,
                            "stream": stream}).encode()
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                      % len(b) + b)
            buf = b""
            try:
                while True:
                    d = s.recv(65536)
                    if not d:
                        break
                    buf += d
            except OSError as e:
                buf += repr(e).encode()
            s.close()
            out[i] = buf

        ths = [threading.Thread(target=go, args=(i, i < 2)) for i in range(3)]
        for t in ths:
            t.start()
            time.sleep(0.3)
        srv.p.send_signal(signal.SIGTERM)
        for t in ths:
            t.join(timeout=40)
        srv.p.wait(timeout=20)
        b0, b1, b2 = out.get(0, b""), out.get(1, b""), out.get(2, b"")
        R.check("SIGTERM: the running stream ends with an error event and its last chunk",
                b0.startswith(b"HTTP/1.1 200") and b"server is shutting down" in b0[-400:] and
                b0.endswith(b"\r\n0\r\n\r\n"), b0[-200:])
        R.check("SIGTERM: queued stream and plain requests get 503",
                b1.startswith(b"HTTP/1.1 503") and b2.startswith(b"HTTP/1.1 503"),
                f"{b1[:60]!r} {b2[:60]!r}")
    finally:
        srv.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", default=".")
    a = ap.parse_args()
    try:
        import openai
    except ImportError:
        R.check("openai SDK available", False)
        print(f"{R.passed} passed, {R.failed} failed")
        return 1
    here = os.path.dirname(os.path.abspath(__file__))
    fx = os.path.join(here, "..", "fixtures", "drafter")
    servers = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            hf = os.path.join(tmp, "hf")
            shutil.copytree(os.path.join(fx, "target"), hf)
            _tinytok.make_tokenizer(hf, 512)
            model = os.path.join(tmp, "m.gguf")
            draft = os.path.join(tmp, "d.gguf")
            run_dspec(a.dspec, "convert", hf, model, "--type", "f32")
            run_dspec(a.dspec, "convert", os.path.join(fx, "dspark_b4_trained"), draft, "--type",
                      "f32")
            # a model that cannot load ends the server with the error (it once stayed up,
            # answering every request with 503)
            bad = Server(a.dspec, "-m", os.path.join(tmp, "missing.gguf"),
                         log=os.path.join(tmp, "bad.log"))
            servers.append(bad)
            try:
                rc = bad.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            R.check("a model that cannot load: the server exits 1 naming it", rc == 1 and
                    "did not load" in bad.output() and "missing.gguf" in bad.output(),
                    f"rc {rc}: {bad.output()[-200:]}")
            bad.kill()
            common = ["-m", model, "--draft", draft, "-t", "2", "--no-adaptive"]
            srv = Server(a.dspec, *common, "--api-key", KEY, "--alias", "m", "--parallel", "2",
                         "--queue", "2", "--max-body", "65536", "--cors", "*",
                         log=os.path.join(tmp, "s.log"))
            servers.append(srv)
            cold = Server(a.dspec, *common, "--alias", "m", "--cache-ram", "0", "--seed", "7",
                          "--cors", "http://App.Example", log=os.path.join(tmp, "c.log"))
            servers.append(cold)
            tiny = os.path.join(here, "..", "..", "models", "tiny-target-q8_0.gguf")
            lps = Server(a.dspec, "-m", tiny, "--draft",
                         os.path.join(here, "..", "..", "models", "tiny-dspark-g7-q8_0.gguf"),
                         "-t", "2", "--no-adaptive", "--alias", "m", "--cache-ram", "0",
                         log=os.path.join(tmp, "lp.log"))
            servers.append(lps)
            srv.wait_ready()
            cold.wait_ready()
            lps.wait_ready()
            lp_client = openai.OpenAI(base_url=f"http://127.0.0.1:{lps.port}/v1",
                                      api_key="none", timeout=60, max_retries=0)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=KEY,
                                   timeout=60, max_retries=0)
            client.port = srv.port
            cold_client = openai.OpenAI(base_url=f"http://127.0.0.1:{cold.port}/v1",
                                        api_key="none", timeout=60, max_retries=0)
            for fn, args in ((sdk_checks, (client, a.dspec, model)),
                             (prefix_checks, (client, cold_client, srv.port)),
                             (concurrency_checks, (client, srv.port)),
                             (error_checks, (srv.port,)), (misc_checks, (srv.port,)),
                             (cors_checks, (a.dspec, srv.port, cold.port, lps.port)),
                             (logprob_checks, (lp_client, lps.port, a.dspec, tiny)),
                             (tool_checks, (lp_client, lps.port)),
                             (idle_checks, (a.dspec, tiny, os.path.join(tmp, "idle.log"))),
                             (shutdown_checks, (a.dspec, tiny, os.path.join(tmp, "sd.log")))):
                if time.monotonic() > DEADLINE:
                    R.check("time budget", False, f"{fn.__name__} not run")
                    break
                t_fn = time.monotonic()
                try:
                    fn(*args)
                except Exception as e:  # noqa: BLE001
                    R.check(f"{fn.__name__} raised", False, repr(e)[:300])
                print(f"     {fn.__name__}: {time.monotonic() - t_fn:.2f} s", flush=True)
            R.check("server alive after the suite", srv.p.poll() is None,
                    srv.output()[-300:] if srv.p.poll() is not None else "")
        except Exception as e:  # noqa: BLE001
            R.check("setup", False, repr(e)[:400])
        finally:
            for s in servers:
                s.kill()
    print(f"{R.passed} passed, {R.failed} failed")
    return 1 if R.failed or not R.passed else 0


if __name__ == "__main__":
    sys.exit(main())
