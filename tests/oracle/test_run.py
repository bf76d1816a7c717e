#!/usr/bin/env python3
"""`dspec run` end to end on a converted fixture model with a small byte-level BPE tokenizer:
text out, greedy output == the argmax chain of `dspec logits`, chat prompts, seeded sampling is
reproducible, and clear errors (missing file, not a model, prompt longer than the context);
`dspec bench --model`, `--spec` and `--kernels` print their tables and reject bad input; every
command refuses an output that is one of its inputs and flags it would once have ignored.
The tokenizer (built here, deterministic) also checks our ids against HF tokenizers."""
import argparse
import glob
import numpy as np
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _tinytok import make_tokenizer  # noqa: E402 (shared with test_server.py)


class R:
    passed = failed = 0

    @classmethod
    def check(cls, name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if ok:
            cls.passed += 1
        else:
            cls.failed += 1


def run(dspec, *args, ok=True):
    r = subprocess.run([dspec, *args], capture_output=True)
    if ok and r.returncode != 0:
        raise RuntimeError(f"dspec {args[0]} failed: {r.stderr.decode(errors='replace')[-400:]}")
    return r


def spec_checks(dspec, here, tmp):
    """`dspec run --draft`: speculative greedy output == plain greedy output, for every drafter
    variant (HF directory and converted GGUF), chain widths and DDTree; sampled runs work."""
    fx = os.path.join(here, "..", "fixtures", "drafter")
    hf = os.path.join(tmp, "dtarget")
    shutil.copytree(os.path.join(fx, "target"), hf)
    make_tokenizer(hf, 512)
    model = os.path.join(tmp, "dtarget.gguf")
    run(dspec, "convert", hf, model, "--type", "f32")
    prompts = ["def hello(self):\n    return self.value", "the data and the list of names"]
    for prompt in prompts:
        plain = run(dspec, "run", "-m", model, "-p", prompt, "-n", "24").stdout
        for variant in ("dflash_b4_trained", "dspark_b4_trained", "dflash2_b8",
                        "dflash_b8_yarn_bidir"):
            d = os.path.join(fx, variant)
            gguf = os.path.join(tmp, variant + ".gguf")
            if not os.path.exists(gguf):
                run(dspec, "convert", d, gguf, "--type", "f32")
            for draft, extra in ((d, ()), (gguf, ()), (gguf, ("--draft-block-size", "2")),
                                 (d, ("--ddtree-budget", "6")),
                                 (gguf, ("--ddtree-budget", "12", "--ddtree-topk", "3"))):
                r = run(dspec, "run", "-m", model, "--draft", draft, "-p", prompt, "-n", "24",
                        "--no-adaptive", *extra)
                tau = [l for l in r.stderr.decode().splitlines() if "tau" in l]
                R.check(f"spec == plain: {variant} {'gguf' if draft == gguf else 'hf'} "
                        f"{' '.join(extra)}", r.stdout == plain, tau[0] if tau else "no stats")
        dsp = os.path.join(fx, "dspark_b4_trained")
        for extra in (("--draft-conf-threshold", "0.5", "--no-adaptive"), ()):
            r = run(dspec, "run", "-m", model, "--draft", dsp, "-p", prompt, "-n", "24", *extra)
            tau = [l for l in r.stderr.decode().splitlines() if "tau" in l]
            R.check(f"spec == plain: dspark {' '.join(extra) or 'adaptive'}", r.stdout == plain,
                    tau[0] if tau else "no stats")
        r = run(dspec, "run", "-m", model, "--draft", dsp, "--no-adaptive",
                "-p", prompt, "-n", "16", "--temp", "0.8", "--seed", "3", ok=False)
        R.check("sampled speculative run", r.returncode == 0,
                r.stderr.decode(errors="replace").strip()[-160:])
    bench_checks(dspec, model, os.path.join(tmp, "dflash_b4_trained.gguf"), tmp)


def bench_checks(dspec, model, draft, tmp):
    """`dspec bench --spec` (acceptance on token-id prompt sets) and `dspec bench --kernels`: their
    tables, and clear errors on bad prompt files."""
    texts = {"code": ["def hello(self):\n    return self.value", "for i in range(10):\n"],
             "prose": ["the data and the list of names"]}
    prompts = {d: [json.loads(run(dspec, "tokenize", "-m", model, "-p", t, "--ids-only")
                              .stdout) for t in ts] for d, ts in texts.items()}
    path = os.path.join(tmp, "prompts.json")
    with open(path, "w") as f:
        json.dump(prompts, f)
    r = run(dspec, "bench", "--spec", "--model", model, "--draft", draft, "--prompts", path,
            "-n", "16", "--blocks", "2,4", "-t", "2", ok=False)
    rows = [l.split() for l in r.stdout.decode().splitlines()[1:]]
    ok = r.returncode == 0 and [(w[0], w[1]) for w in rows] == [
        ("code", "2"), ("code", "4"), ("prose", "2"), ("prose", "4")]
    for w in rows if ok else []:  # domain block tau spec plain speedup acceptance...
        tau, acc = float(w[2]), [float(x) for x in w[6:]]
        ok = ok and 1.0 <= tau <= int(w[1]) and float(w[3]) > 0 and float(w[4]) > 0
        ok = ok and len(acc) == int(w[1]) - 1 and all(0.0 <= x <= 1.0 for x in acc)
    R.check("bench --spec: a row per domain and block, tau in [1, block]", ok,
            "" if ok else (r.stdout + r.stderr).decode(errors="replace")[-300:])
    bad = {"not-object.json": ("[1, 2]", b"expected an object of domains"),
           "not-ids.json": ('{"code": [[1, 2], "x"]}', b"domain 'code', prompt 2"),
           "out-of-vocab.json": ('{"code": [[1, 999999]]}', b"not a token id of the model"),
           "broken.json": ('{"code": [[1, 2', b"line")}
    for name, (text, want) in bad.items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
        r = run(dspec, "bench", "--spec", "--model", model, "--draft", draft, "--prompts",
                os.path.join(tmp, name), "-n", "4", ok=False)
        R.check(f"bench --spec: error for {name}",
                r.returncode == 2 and want in r.stderr and not r.stdout,
                r.stderr.decode(errors="replace").strip()[-120:])
    # `bench --model --help` / `bench --spec --model --help` (as bench's usage suggests) print
    # help, not an error about a model file named "--help"
    for args, want in ((("--model", "--help"), "usage: dspec bench --model"),
                       (("--spec", "--model", "--help"), "usage: dspec bench --spec")):
        r = run(dspec, "bench", *args, ok=False)
        out = r.stdout.decode(errors="replace")
        R.check(f"bench {' '.join(args)}: usage", r.returncode == 0 and out.startswith(want),
                (out + r.stderr.decode(errors="replace"))[-160:])
    r = run(dspec, "bench", "--kernels", "--n", "256", "--rows", "64", "--time", "0.01",
            "--type", "q4_K", "-t", "1", ok=False)
    out = r.stdout.decode(errors="replace")
    row = [w for w in (l.split() for l in out.splitlines()) if w[:2] == ["q4_K", "q8_K"]]
    ok = r.returncode == 0 and len(row) == 1 and float(row[0][3]) > 0
    R.check("bench --kernels: a q4_K row with GB/s", ok, "" if ok else out[-200:])
    # (columns: type act MB scalar avx2 avx512 '4 rows' '16 rows' best xT)
    ok = (ok and "4 rows" in out and "16 rows" in out and len(row[0]) == 10
          and float(row[0][6]) > 0 and float(row[0][7]) > 0)
    R.check("bench --kernels: the 4- and 16-row columns", ok, "" if ok else out[-200:])
    r = run(dspec, "bench", "--kernels", "--n", "256", "--rows", "64", "--time", "0.01",
            "--type", "q8_0", "-t", "1", ok=False)
    out = r.stdout.decode(errors="replace")
    row = [w for w in (l.split() for l in out.splitlines()) if w[:2] == ["q8_0", "q8_0"]]
    ok = (r.returncode == 0 and len(row) == 1 and len(row[0]) == 10
          and float(row[0][6]) > 0 and float(row[0][7]) > 0)
    R.check("bench --kernels: q8_0's multi-row columns (its tile kernel on AVX-512 VNNI)", ok,
            "" if ok else out[-200:])


def write_split(base):
    """A two-shard GGUF split set written by gguf-py (two small tensors), or None without it."""
    try:
        import gguf
    except ImportError:
        return None
    w = gguf.GGUFWriter(base, "qwen35", split_max_tensors=1)
    for name in ("a", "b"):
        w.add_tensor(name, np.ones((2, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(glob.glob(base[:-len(".gguf")] + "-*-of-*.gguf"))
    return shards if len(shards) == 2 else None


def cli_checks(dspec, model, hf, tmp):
    """Flag handling of every command: an output path that is an input is refused before anything
    is read, values and combinations that were once taken silently are refused (exit 2, one line
    naming the flag), and aliases the README names work."""
    def err_line(r):
        return (r.stderr.decode(errors="replace").strip().splitlines() or [""])[0][:120]

    def refused_run(*args):  # (an option taken again would serve or read stdin: no hang)
        try:
            return subprocess.run([dspec, *args], capture_output=True, timeout=20,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, -1, b"", b"timed out: not refused")

    d = os.path.join(tmp, "cli")
    os.makedirs(d, exist_ok=True)
    victim = os.path.join(d, "victim.gguf")  # a copy of the model: a refusal must leave it whole
    shutil.copyfile(model, victim)
    with open(victim, "rb") as f:
        want = f.read()
    for name, args, needle in (
            ("logits --out the model", ["logits", "-m", victim, "--tokens", "1,2", "--out", victim],
             b"--out %s is an input file" % victim.encode()),
            ("logits --dump-hidden the model",
             ["logits", "-m", victim, "--tokens", "1,2", "--dump-hidden", victim],
             b"--dump-hidden %s is an input file" % victim.encode()),
            ("synth --draft --target the output",
             ["synth", "--draft", "dflash", "--target", victim, victim], b"(--target)"),
            ("synth --tokenizer the output",
             ["synth", "--preset", "tiny", "--tokenizer", victim, victim], b"(--tokenizer)")):
        r = refused_run(*args)
        with open(victim, "rb") as f:
            same = f.read() == want
        R.check(f"refused: {name}", r.returncode == 2 and needle in r.stderr and same,
                err_line(r))
    shards = write_split(os.path.join(d, "sp.gguf"))
    if shards:  # a later shard of a split set is an input too
        r = refused_run("logits", "-m", shards[0], "--tokens", "1", "--out", shards[1])
        R.check("refused: logits --out a later shard of -m's split set",
                r.returncode == 2 and b"is an input file" in r.stderr, err_line(r))
    else:
        R.check("gguf-py available (a split set)", False)

    long_list = ",".join(str(i) for i in range(1, 18))
    refused = [
        (["run", "-m", model, "-p", "x", "--temp", "-1"], b"--temp must be >= 0"),
        (["serve", "-m", model, "--port", "0", "--temp", "-0.5"], b"--temp must be >= 0"),
        (["run", "-m", model, "-p", "x", "--long-ctx", "-5"], b"--long-ctx must be >= 0"),
        (["logits", "-m", model, "--tokens", "1,2,"], b"--tokens must be comma-separated"),
        (["logits", "-m", model, "--tokens", "1,,2"], b"--tokens must be comma-separated"),
        (["bench", "--model", model, "--verify", "4,"], b"bad --verify list '4,'"),
        (["bench", "--model", model, "--verify", long_list], b"--verify takes at most 16 sizes"),
        (["bench", "--spec", "--model", model, "--draft", model, "--prompts", "p.json",
          "--blocks", "2,"], b"bad --blocks '2,'"),
        (["bench", "--spec", "--model", model, "--draft", model, "--prompts", "p.json",
          "--blocks", "2,3,4,5,6,7,8,9,10"], b"--blocks takes at most 8 widths"),
        (["convert", "--threads", "", hf, os.path.join(d, "c.gguf")],
         b"--threads needs an integer"),
        (["tokenize", "-m", model, "-p", "x", "--ids-only", "--detok"],
         b"--ids-only does not go with --detok"),
        (["tokenize", "-m", model, "--batch", "--ids-only"],
         b"--ids-only does not go with --batch"),
        (["tokenize", "-m", model, "--batch", "--bench", "2"], b"--bench does not go with --batch"),
        (["synth", "--preset", "tiny", "--layers", "600", os.path.join(d, "s.gguf")],
         b"--layers 600 outside 1..512"),
    ]
    for opt in ("--ddtree-budget 4", "--ddtree-topk 2", "--draft-block-size 3",
                "--draft-conf-threshold 0.5", "--proposer argmax", "--ddtree-raw"):
        needle = b"%s needs --draft" % opt.split()[0].encode()
        refused.append((["run", "-m", model, "-p", "x", *opt.split()], needle))
        refused.append((["serve", "-m", model, "--port", "0", *opt.split()], needle))
    for args, needle in refused:
        r = refused_run(*args)
        first = (r.stderr.splitlines() or [b""])[0]  # (the error line, then perhaps usage)
        R.check(f"refused: {' '.join(a if a != model else 'M' for a in args[:9])}",
                r.returncode == 2 and needle in first, err_line(r))

    # accepted: --no-spec without a drafter (harmless), bench --kernels -t 0 (all CPUs, as every
    # other command), the -m / --model aliases of bench and tokenize
    r = run(dspec, "run", "-m", model, "-p", "x", "-n", "1", "--no-spec", ok=False)
    R.check("run --no-spec without --draft: accepted", r.returncode == 0, err_line(r))
    r = run(dspec, "bench", "--kernels", "--n", "256", "--rows", "16", "--time", "0.01",
            "--type", "q8_0", "-t", "0", ok=False)
    R.check("bench --kernels -t 0: all CPUs",
            r.returncode == 0 and b"%d threads" % len(os.sched_getaffinity(0)) in r.stdout,
            err_line(r) or r.stdout.decode(errors="replace")[:120])
    r = run(dspec, "bench", "-m", model, "--prompt", "4", "--decode", "1", "--reps", "1",
            "--verify", "1", "-t", "1", ok=False)
    R.check("bench -m: the model benchmark",
            r.returncode == 0 and b"prefill 4 tokens" in r.stdout, err_line(r))
    ids = [run(dspec, "tokenize", flag, model, "-p", "hello", "--ids-only", ok=False)
           for flag in ("-m", "--model")]
    R.check("tokenize --model == -m", all(x.returncode == 0 for x in ids) and
            ids[0].stdout == ids[1].stdout and ids[0].stdout.startswith(b"["), err_line(ids[1]))
    # the help texts say so
    for args, needle in ((("logits",), "(default f32)"), (("bench", "--spec"), "-t, --threads"),
                         (("bench", "--model"), "-m, --model"), (("tokenize",), "-m, --model"),
                         (("bench",), "(default 0: all CPUs)"),
                         (("run",), "--ddtree-* and --draft-conf-threshold need")):
        h = run(dspec, *args, "--help").stdout.decode()
        R.check(f"{' '.join(args)} --help: {needle!r}", needle in h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", default=".")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..", "fixtures", "target", "dense_b", "hf_f32")
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hf")
        shutil.copytree(src, hf)
        make_tokenizer(hf, 512)
        model = os.path.join(tmp, "m.gguf")
        run(a.dspec, "convert", hf, model, "--type", "f32")
        cli_checks(a.dspec, model, hf, tmp)

        # tokenizer ids vs HF tokenizers on this vocabulary
        try:
            from tokenizers import Tokenizer
            hft = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
            text = "def hello(self):\n    return self.value  # the data, and 42 items"
            want = hft.encode(text, add_special_tokens=False).ids
            got = json.loads(run(a.dspec, "tokenize", "-m", model, "--ids-only", "-p",
                                 text).stdout)
            R.check("tokenizer ids == HF tokenizers", got == want, f"{len(want)} ids")
        except ImportError:
            R.check("tokenizers package available", False)

        prompt = "def hello(self):\n    return"
        r = run(a.dspec, "run", "-m", model, "-p", prompt, "-n", "12", "-t", "2")
        err = r.stderr.decode()
        R.check("run: exit 0 and stats", "generated tokens:" in err and "prefill" in err,
                err.strip().splitlines()[-1] if err.strip() else "")
        # greedy == argmax chain of dspec logits
        ids = json.loads(run(a.dspec, "tokenize", "-m", model, "--ids-only", "-p",
                             prompt).stdout)
        chain = []
        for _ in range(12):
            lg = os.path.join(tmp, "lg.bin")
            run(a.dspec, "logits", "-m", model, "--tokens", ",".join(map(str, ids + chain)),
                "--out", lg)
            v = np.fromfile(lg, dtype=np.float32).reshape(len(ids) + len(chain), 512)[-1]
            nxt = int(v.argmax())
            if nxt in (505, 507):  # <|endoftext|>, <|im_end|>: end of generation
                break
            chain.append(nxt)
        toks = ",".join(map(str, ids))
        lq, lv = os.path.join(tmp, "lgq.bin"), os.path.join(tmp, "lgv.bin")
        run(a.dspec, "logits", "-m", model, "--tokens", toks, "--out", lq)
        run(a.dspec, "logits", "-m", model, "--tokens", toks, "-v", "--out", lv)
        with open(lq, "rb") as f1, open(lv, "rb") as f2:
            R.check("logits -v: accepted, the same logits", f1.read() == f2.read())
        out = r.stdout
        # decode chain through the tokenizer to compare text
        hft_dec = hft.decode(chain, skip_special_tokens=False).encode()
        R.check("run: greedy text == argmax chain of dspec logits", out == hft_dec,
                f"{out[:40]!r} vs {hft_dec[:40]!r}")

        r1 = run(a.dspec, "run", "-m", model, "-p", prompt, "-n", "10", "--temp", "0.9",
                 "--seed", "5", "--top-k", "20").stdout
        r2 = run(a.dspec, "run", "-m", model, "-p", prompt, "-n", "10", "--temp", "0.9",
                 "--seed", "5", "--top-k", "20").stdout
        R.check("run: seeded sampling reproducible", r1 == r2)
        # ... with speculative decoding and the adaptive policy too (it once weighed measured step
        # times, which vary run to run, and a plain and a speculative step draw differently)
        tiny = os.path.join(here, "..", "..", "models")
        outs = {run(a.dspec, "run", "-m", os.path.join(tiny, "tiny-target-q8_0.gguf"), "--draft",
                    os.path.join(tiny, "tiny-dflash2-b8-q8_0.gguf"), "-p", "#include <stdio.h>",
                    "--temp", "0.8", "--seed", "2", "-n", "200", "-t", "1").stdout
                for _ in range(4)}
        R.check("run: seeded speculative sampling reproducible (adaptive)", len(outs) == 1,
                f"{len(outs)} different outputs of 4")
        # --no-cuda-graphs is accepted everywhere and never changes the output (CPU: no graphs)
        r = run(a.dspec, "run", "-m", model, "-p", prompt, "-n", "12", "-t", "2",
                "--no-cuda-graphs")
        R.check("run --no-cuda-graphs: same text", r.stdout == out)
        r = run(a.dspec, "run", "-m", model, "-p", "hello", "--chat", "--system", "be brief",
                "--no-think", "-n", "5")
        R.check("run --chat", r.returncode == 0)

        if os.path.exists("/dev/full"):  # output that cannot be written is a failure
            with open("/dev/full", "w") as full:
                rc = [subprocess.run([a.dspec, *args], stdout=full, stderr=subprocess.PIPE,
                                     timeout=120).returncode
                      for args in (["version"], ["run", "-m", model, "-p", prompt, "-n", "4"])]
            R.check("stdout write errors exit nonzero", all(c != 0 for c in rc), f"{rc}")
        for name, args, needle in (
                ("-f a directory", ["-f", tmp], b"Is a directory"),
                ("-f a missing file", ["-f", os.path.join(tmp, "nope.txt")], b"No such file"),
                ("--system without --chat", ["-p", "x", "--system", "s"], b"need --chat"),
                ("unknown --proposer", ["-p", "x", "--proposer", "foo"], b"--proposer"),
                ("negative --batch", ["-p", "x", "--batch", "-5"], b">= 0"),
                ("negative --draft-block-size", ["-p", "x", "--draft-block-size", "-1"],
                 b">= 0"),
                ("--draft a directory without config.json", ["-p", "x", "--draft", tmp],
                 b"without config.json")):
            r = run(a.dspec, "run", "-m", model, *args, ok=False)
            R.check(f"error: {name}", r.returncode != 0 and needle in r.stderr,
                    r.stderr.decode(errors="replace").strip()[:120])
        with open(os.path.join(tmp, "nul.txt"), "wb") as f:  # a file's NUL bytes stay in it
            f.write(b"ab\0cd")
        r = run(a.dspec, "run", "-m", model, "-f", os.path.join(tmp, "nul.txt"), "-n", "1")
        ids = json.loads(run(a.dspec, "tokenize", "-m", model, "-f", os.path.join(tmp, "nul.txt"),
                             "--ids-only").stdout)
        want = b"prompt tokens: %d," % len(ids)
        R.check("run -f: a NUL byte does not end the prompt", len(ids) >= 3 and want in r.stderr,
                f"{ids} {r.stderr.decode(errors='replace').strip()[-80:]}")
        r = run(a.dspec, "run", "-m", os.path.join(tmp, "missing.gguf"), "-p", "x", ok=False)
        R.check("error: missing file", r.returncode != 0 and b"missing.gguf" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        info = os.path.join(here, "..", "..", "models", "tiny-info.gguf")
        r = run(a.dspec, "run", "-m", info, "-p", "x", ok=False)
        R.check("error: not a model", r.returncode != 0 and b"tensor" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        r = run(a.dspec, "run", "-m", model, "-p", "hello world " * 20, "-c", "16", ok=False)
        R.check("error: prompt longer than the context",
                r.returncode != 0 and b"context" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        r = run(a.dspec, "run", "-m", model, "-p", "x", "--kv-type", "q4_0", ok=False)
        R.check("error: unknown --kv-type",
                r.returncode == 2 and b"f16, f32 or q8_0" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        # run and serve share their model / sampling / speculative / engine options (cli_gen.c)
        shared = ["--model", "--draft", "--ctx", "--max-tokens", "--temp", "--top-k", "--top-p",
                  "--min-p", "--repeat-penalty", "--repeat-last-n", "--frequency-penalty",
                  "--presence-penalty", "--seed", "--no-spec", "--draft-block-size",
                  "--proposer", "--ddtree-budget", "--ddtree-topk", "--ddtree-raw",
                  "--no-adaptive", "--draft-conf-threshold", "--long-ctx", "--long-ctx-width",
                  "--batch", "--kv-type", "--threads", "--device", "--no-cuda-graphs",
                  "--no-pipeline", "--exact-prefill", "--prefill-cache"]
        helps = [run(a.dspec, c, "--help").stdout.decode() for c in ("run", "serve")]
        missing = [(c, o) for c, h in zip(("run", "serve"), helps) for o in shared if o not in h]
        R.check("run / serve --help list the shared options", not missing, str(missing))
        r = run(a.dspec, "serve", "-m", model, "--kv-type", "q4_0", ok=False)
        R.check("serve: unknown --kv-type",
                r.returncode == 2 and b"dspec serve: --kv-type must be" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        r = run(a.dspec, "run", "-m", model, "-p", "x", "--seed", ok=False)
        R.check("run: option without its value",
                r.returncode == 2 and b"missing value for --seed" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        # option values are read strictly: a malformed number is an error, not 0
        for cmd, opt, val, want in (("run", "--temp", "0.7x", b"--temp needs a number"),
                                    ("run", "--ctx", "1e3", b"--ctx needs an integer"),
                                    ("run", "--seed", "-1", b"--seed needs a non-negative"),
                                    ("serve", "--top-k", "abc", b"--top-k needs an integer"),
                                    ("serve", "--port", "http", b"--port needs an integer in"),
                                    ("serve", "--parallel", "0", b"[1, 64]"),
                                    ("run", "--prefill-cache", "x", b"a number of GiB"),
                                    ("run", "--prefill-cache", "-1", b"a number of GiB"),
                                    ("run", "--prefill-cache", "most", b"or all")):
            args = ("-p", "x") if cmd == "run" else ()
            r = run(a.dspec, cmd, "-m", model, *args, opt, val, ok=False)
            R.check(f"{cmd}: {opt} {val} refused", r.returncode == 2 and want in r.stderr,
                    r.stderr.decode(errors="replace").strip().splitlines()[0][:120])
        r = run(a.dspec, "run", "-m", model, "-p", "x", "--device", "cuda:x", ok=False)
        R.check("run: --device cuda:x refused (not device 0)",
                r.returncode != 0 and b"expected cpu, cuda or cuda:N" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        # dspec bench --model: prefill, decode and verify lines; --accept commits rows
        r = run(a.dspec, "bench", "--model", model, "--prompt", "8", "--decode", "2",
                "--reps", "2", "--verify", "1,3", "--accept", "2", "-t", "1", ok=False)
        out = r.stdout.decode(errors="replace")
        ok = (r.returncode == 0 and "prefill 8 tokens" in out and "decode" in out and
              "commit of min(N, 2) rows), median of 2 after one warm-up" in out and
              "N =   1:" in out and "N =   3:" in out)
        R.check("bench --model: prefill, decode and verify rows", ok,
                "" if ok else (out + r.stderr.decode(errors="replace"))[-300:])
        r = run(a.dspec, "bench", "--model", model, "--prompt", "8", "--decode", "2",
                "--reps", "1", "--verify", "1", "-t", "1", "--prefill-cache", "1", ok=False)
        out = r.stdout.decode(errors="replace")
        ok = (r.returncode == 0 and "prefill 8 tokens" in out and "prefill cache (" not in out
              and b"no effect on the cpu backend" in r.stderr)
        R.check("bench --model --prefill-cache on the CPU: a warning, no cache line", ok,
                "" if ok else (out + r.stderr.decode(errors="replace"))[-300:])
        # --prefill-cache is CUDA's: on the CPU it says it has no effect, and runs as without it
        r = run(a.dspec, "run", "-m", model, "-p", "hello", "-n", "4", "--prefill-cache", "1",
                ok=False)
        r0 = run(a.dspec, "run", "-m", model, "-p", "hello", "-n", "4", ok=False)
        ok = (r.returncode == 0 and b"no effect on the cpu backend" in r.stderr and
              r.stdout == r0.stdout)
        R.check("run --prefill-cache on the CPU: a warning, the same output", ok,
                r.stderr.decode(errors="replace").strip()[-160:])
        r = run(a.dspec, "run", "-m", model, "-p", "hello", "-n", "4", "--prefill-cache",
                "1e400", ok=False)
        R.check("run: --prefill-cache 1e400 refused",
                r.returncode == 2 and b"a number of GiB" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        r = run(a.dspec, "bench", "--model", model, "--verify", "0", ok=False)
        R.check("bench --model: bad --verify list",
                r.returncode == 2 and b"bad --verify list" in r.stderr,
                r.stderr.decode(errors="replace").strip()[-120:])
        r = run(a.dspec, "bench", "--model", model, "--accept", "-1", ok=False)
        R.check("bench --model: bad --accept",
                r.returncode == 2 and b"bad or incomplete option '--accept'" in r.stderr,
                r.stderr.decode(errors="replace").strip().splitlines()[0][:120])
        spec_checks(a.dspec, here, tmp)
    print(f"{R.passed} passed, {R.failed} failed")
    return 1 if R.failed or not R.passed else 0


if __name__ == "__main__":
    sys.exit(main())
