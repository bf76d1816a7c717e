#!/usr/bin/env python3
"""pipeline.py: trains the bundled tiny model family (issue #6, DESIGN.md §8) in one resumable
script with a fixed seed: a byte-level BPE tokenizer (qwen35 pre-tokenizer, Qwen3.5 special tokens
+ <|MASK|>), a Qwen3.5-architecture target (transformers' own Qwen3_5ForCausalLM: 3 Gated DeltaNet
: 1 gated attention, H_v != H_k, untied head), and its drafters distilled from the frozen target
(DFlash B8, DFlash2 B8 with convs + selector, DSpark gamma 7 with Markov + confidence heads,
DFlash B16), then evaluates them and packs everything for transfer.

Stages (run in this order by --stage all; a comma list runs a subset, skipping finished ones
unless --force):
  tokenizer   train the BPE on a sample of the training split           -> WORK/tokenizer/
  data        tokenize the corpus (cheap; redone when missing)          -> WORK/data/
  target      train the target (time-budgeted)                          -> WORK/target/ (HF, bf16)
  evaltarget  held-out loss / perplexity / bits per byte per domain     -> WORK/eval/target.json
  gen         the target's greedy continuations of training prompts    -> WORK/gen/
  dflash dflash2 dspark dflash_b16   distil each drafter (time-budgeted)  -> WORK/drafters/NAME/
  evalspec    tau and per-position acceptance, domains x block sizes    -> WORK/eval/spec.json
  pack        tar.gz per model (split <= 15 MB) + meta into --out       -> OUT/*.tgz*
Utility stages (not in 'all'):
  unpack      restore WORK from packed files (--from DIR): resume on a fresh machine, or unpack
              the device's results here
  crosscheck  (CPU, slow) compare evalspec's batched loop with the reference greedy speculative
              loop dflash_reference.spec_generate on one prompt per domain and drafter
  checks      self-checks: chat template vs tests/fixtures/chat/goldens.json, batched drafter
              forward vs dflash_reference.Drafter.draft_block, checkpoint reload (smoke runs these)

Time budget: --budget-s covers this invocation. Non-training stages reserve fixed estimates
(Sizes.reserve); the training stages share the rest (target 5/9, each of the 4 drafters 1/9),
each computing its step count from its measured step time (or fixed by --target-steps /
--drafter-steps, for an exact re-run). Every training step count is logged.

Usage (device):  python3 tools/tinymodel/pipeline.py --data .tinydata --work .tinywork \
                     --out $OUT --stage all --budget-s 480
       (CPU smoke, < 3 min on 2 cores):  python3 tools/tinymodel/pipeline.py --smoke
See tools/tinymodel/README.md.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import math
import os
import random
import shutil
import sys
import tarfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import tm_common as C  # noqa: E402
import tm_text as TX  # noqa: E402

TRAINING = ("target", "dflash", "dflash2", "dspark", "dflash_b16")
ALL = ("tokenizer", "data", "target", "evaltarget", "gen", "dflash", "dflash2", "dspark", "dflash_b16",
       "evalspec", "pack")
UTIL = ("unpack", "crosscheck", "checks")
PART_BYTES = 15 * 1024 * 1024
OUT_LIMIT = 63 * 1024 * 1024


def dev() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast():
    if dev().type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


# ---------------------------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------------------------

class Plan:
    def __init__(self, run: C.Run, stages: list[str]):
        self.run = run
        self.stages = stages

    def seconds_for(self, stage: str) -> float:
        """Seconds for training stage `stage`: the budget left after the reserves of the
        non-training stages still to run, shared by weight among the training stages to run."""
        rest = self.stages[self.stages.index(stage):] if stage in self.stages else [stage]
        reserve = sum(self.run.sizes.reserve.get(s, 0) for s in rest if s not in TRAINING)
        left = self.run.budget_s - self.run.elapsed() - reserve
        weights = {"target": 5.0}
        wsum = sum(weights.get(s, 1.0) for s in rest if s in TRAINING)
        return max(5.0, left * weights.get(stage, 1.0) / wsum)


def plan_steps(measure_fn, seconds: float, fixed: int | None, min_steps: int = 20) -> int:
    if fixed:
        return fixed
    dt = measure_fn()
    return max(min_steps, int(seconds / max(dt, 1e-4)))


# ---------------------------------------------------------------------------------------------
# Target model helpers
# ---------------------------------------------------------------------------------------------

def load_target(run: C.Run, dtype=torch.float32):
    from transformers import Qwen3_5ForCausalLM
    path = run.path("target")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        raise SystemExit(f"{path}: no target checkpoint (run --stage target, or unpack one)")
    m = Qwen3_5ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return m.to(dev()).eval()


class Taps:
    """Forward hooks capturing the OUTPUT of the tapped decoder layers (spec §1.1)."""

    def __init__(self, model, ids):
        self.ids = list(ids)
        self.caps = {}
        self.hooks = [model.model.layers[l].register_forward_hook(self._fn(l)) for l in self.ids]

    def _fn(self, l):
        def fn(mod, inp, out):
            self.caps[l] = out[0] if isinstance(out, tuple) else out
        return fn

    def get(self):
        return torch.cat([self.caps[l] for l in self.ids], dim=-1)

    def remove(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def target_pass(model, tokens: torch.Tensor, taps: list, batch: int, want_hidden: bool = False,
                feat_dtype=torch.bfloat16):
    """Full forward (no cache) over tokens [S,T] -> (taps [S,T,F], greedy labels [S,T+1] with
    labels[:,p] = argmax logits[:,p-1] (labels[:,0] = -1), final hidden [S,T,H] or None)."""
    S, T = tokens.shape
    tp = Taps(model, taps)
    feats, labels, hid = [], [], []
    try:
        for i in range(0, S, batch):
            x = tokens[i:i + batch].to(dev())
            with autocast():
                h = model.model(input_ids=x, use_cache=False).last_hidden_state
                logits = model.lm_head(h)
            feats.append(tp.get().to(feat_dtype))
            lab = torch.full((x.shape[0], T + 1), -1, dtype=torch.long, device=dev())
            lab[:, 1:] = logits.float().argmax(-1)
            labels.append(lab)
            if want_hidden:
                hid.append(h.to(feat_dtype))
    finally:
        tp.remove()
    return torch.cat(feats), torch.cat(labels), (torch.cat(hid) if want_hidden else None)


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------

def st_tokenizer(run: C.Run, a):
    t = time.time()
    info = TX.train_tokenizer(a.data, run.path("tokenizer"), run.sizes.vocab_size,
                              sample_bytes=30_000_000 if run.sizes.name == "full" else 2_000_000, seed=C.SEED)
    run.finish("tokenizer", dict(info, wall_s=time.time() - t))


def data_ready(run: C.Run) -> bool:
    return os.path.exists(run.path("data", "eval_prompts.json"))


def st_data(run: C.Run, a):
    t = time.time()
    info = TX.build_token_data(a.data, run.path("tokenizer"), run.path("data"), run.sizes, C.SEED)
    run.finish("data", {"splits": info, "wall_s": time.time() - t})


def load_stream(run: C.Run, name: str) -> np.ndarray:
    return np.load(run.path("data", f"{name}.npy"))


def special_ids(run: C.Run) -> dict:
    return TX.load_tokenizer(run.path("tokenizer"))[1]


def st_target(run: C.Run, a, plan: Plan):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    s = run.sizes
    sp = special_ids(run)
    torch.manual_seed(C.SEED)
    cfg = Qwen3_5TextConfig(**C.target_hf_config(s, sp))
    model = Qwen3_5ForCausalLM(cfg).to(dev())
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    run.say(f"target: {n_params / 1e6:.2f} M parameters, layers {cfg.layer_types}")
    streams = {d: torch.from_numpy(load_stream(run, f"{d}.train").astype(np.int64)).to(dev()) for d in TX.DOMAINS}
    wts = {"code": 1.0, "prose": 1.0, "chat": 1.5}
    sizes = torch.tensor([streams[d].numel() * wts[d] for d in TX.DOMAINS], dtype=torch.float64)
    probs = sizes / sizes.sum()
    g = torch.Generator().manual_seed(C.SEED + 10)
    L = s.seq_len

    def batch():
        dom = torch.multinomial(probs, s.batch, replacement=True, generator=g)
        rows = []
        for i, d in enumerate(TX.DOMAINS):
            k = int((dom == i).sum())
            if k:
                st = streams[d]
                off = torch.randint(0, st.numel() - L - 1, (k,), generator=g).to(dev())
                rows.append(st[off[:, None] + torch.arange(L + 1, device=dev())])
        b = torch.cat(rows)
        return b[:, :-1], b[:, 1:]

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    fused = dev().type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    seconds = plan.seconds_for("target")
    t_start = time.time()
    state = {"total": a.target_steps or 10 ** 9}

    def step(i):
        x, y = batch()
        lr = C.cosine_lr(i, state["total"], s.lr, s.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        with autocast():
            h = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(h)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss, gn, lr

    losses = []
    i = 0
    n_probe = 8 if s.name == "full" else 3
    while i < state["total"]:
        loss, gn, lr = step(i)
        i += 1
        if i == n_probe and not a.target_steps:
            # step time measured over the first steps (warm-up excluded by a second probe below)
            if dev().type == "cuda":
                torch.cuda.synchronize()
            t_probe = time.time()
        if i == 2 * n_probe and not a.target_steps:
            if dev().type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - t_probe) / n_probe
            state["total"] = max(2 * n_probe + 1, int((seconds - (time.time() - t_start)) / dt) + i)
            run.say(f"target: {dt * 1000:.1f} ms/step, {seconds:.0f} s -> {state['total']} steps "
                    f"({state['total'] * s.batch * s.seq_len / 1e6:.1f} M tokens)")
        if i % 10 == 0 or i == state["total"] or i <= 2:
            lv = float(loss.detach())
            losses.append(lv)
            run.log(stage="target", step=i, loss=round(lv, 4), lr=lr, gnorm=round(float(gn), 3),
                    tokens=i * s.batch * s.seq_len)
            if i % 100 == 0 or i == state["total"]:
                run.say(f"target step {i}/{state['total']} loss {lv:.4f} lr {lr:.2e}")
    wall = time.time() - t_start
    # save in bf16 (the shipped precision); everything downstream uses these rounded weights
    model.eval()
    model.to(torch.bfloat16)          # save_pretrained records "dtype": "bfloat16"
    model.generation_config.eos_token_id = [sp[C.IM_END], sp[C.EOT]]
    model.generation_config.pad_token_id = sp[C.EOT]
    model.generation_config.bos_token_id = None
    path = run.path("target")
    if os.path.exists(path):
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(run.path("tokenizer", f), os.path.join(path, f))
    last = losses[-5:] if losses else [float("nan")]
    run.finish("target", {"params": n_params, "steps": i, "tokens": i * s.batch * s.seq_len,
                          "final_loss": round(sum(last) / len(last), 4), "wall_s": wall,
                          "config": C.as_dict(s.target)})


@torch.no_grad()
def greedy_full(model, prompts: list[list[int]], new: int, pad: int):
    """Greedy continuation of prompts of different lengths by full recompute (no cache): exact
    w.r.t. the no-cache forward the reference loop uses. Right-padded; causality makes the pad
    invisible to the real positions. -> (tokens [N, maxP+new] long, prompt lens [N])."""
    N = len(prompts)
    P = torch.tensor([len(p) for p in prompts], device=dev())
    T = int(P.max()) + new
    x = torch.full((N, T), pad, dtype=torch.long, device=dev())
    for i, p in enumerate(prompts):
        x[i, :len(p)] = torch.tensor(p, device=dev())
    rows = torch.arange(N, device=dev())
    for t in range(new):
        cur = int(P.max()) + t
        h = model.model(input_ids=x[:, :cur], use_cache=False).last_hidden_state
        hp = h[rows, P + t - 1]
        nxt = model.lm_head(hp).float().argmax(-1)
        x[rows, P + t] = nxt
    return x, P


def st_evaltarget(run: C.Run, a):
    s = run.sizes
    t0 = time.time()
    model = load_target(run)
    tok, sp = TX.load_tokenizer(run.path("tokenizer"))
    tb = torch.from_numpy(TX.token_bytes(tok, s.vocab_size)).to(dev())
    res = {}
    L = s.seq_len
    for d in TX.DOMAINS:
        st = torch.from_numpy(load_stream(run, f"{d}.heldout").astype(np.int64))
        nwin = min(s.eval_windows, (st.numel() - 1) // L)
        xs = st[:nwin * L + 1]
        x = xs[:-1].view(nwin, L)
        y = xs[1:].view(nwin, L)
        tot, nb, n = 0.0, 0, 0
        for i in range(0, nwin, 16):
            xb, yb = x[i:i + 16].to(dev()), y[i:i + 16].to(dev())
            with torch.no_grad(), autocast():
                h = model.model(input_ids=xb, use_cache=False).last_hidden_state
                logits = model.lm_head(h)
            ce = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum")
            tot += float(ce)
            nb += int(tb[yb].sum())
            n += yb.numel()
        res[d] = {"tokens": n, "loss": round(tot / n, 4), "ppl": round(math.exp(tot / n), 3),
                  "bits_per_byte": round(tot / math.log(2) / max(1, nb), 4), "bytes_per_token": round(nb / n, 3)}
        run.say(f"evaltarget {d}: {res[d]}")
    # greedy samples for the README (full recompute, fp32)
    demo = [("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
            ("code", "import os\nimport sys\n\n\ndef main():\n"),
            ("prose", "The ls command lists"),
            ("chat", C.render_chat([{"role": "user", "content": "Write a Python function `is_prime(n)`. "
                                     "Return True if n is a prime number."}], True, False))]
    prompts = [tok.encode(t, add_special_tokens=False).ids for _, t in demo]
    new = 96 if s.name == "full" else 24
    x, P = greedy_full(model, prompts, new, sp[C.EOT])
    samples = []
    for (d, t), row, p in zip(demo, x.tolist(), P.tolist()):
        samples.append({"domain": d, "prompt": t, "greedy": tok.decode(row[p:p + new], skip_special_tokens=False)})
    os.makedirs(run.path("eval"), exist_ok=True)
    with open(run.path("eval", "target.json"), "w") as f:
        json.dump({"heldout": res, "samples": samples}, f, indent=1, ensure_ascii=False)
    with open(run.path("eval", "samples.txt"), "w") as f:
        for smp in samples:
            f.write(f"=== {smp['domain']} | prompt ===\n{smp['prompt']}\n=== greedy ===\n{smp['greedy']}\n\n")
    run.finish("evaltarget", {"heldout": res, "wall_s": time.time() - t0})


def st_gen(run: C.Run, a):
    """Drafter training data: greedy continuations (with the KV/recurrent cache) of gen_new tokens
    after prompts of gen_prompt_len tokens drawn from the TRAINING streams (code 40 %, prose 30 %,
    chat 30 %; chat prompts end at an answer start, i.e. after the generation prompt)."""
    s = run.sizes
    t0 = time.time()
    model = load_target(run)
    rng = np.random.default_rng(C.SEED + 20)
    P, G = s.gen_prompt_len, s.gen_new
    n = {"code": int(s.gen_seqs * 0.4), "prose": int(s.gen_seqs * 0.3)}
    n["chat"] = s.gen_seqs - n["code"] - n["prose"]
    prompts = []
    for d in TX.DOMAINS:
        st = load_stream(run, f"{d}.train")
        if d == "chat":
            starts = np.load(run.path("data", "chat.train.starts.npy"))
            starts = starts[starts >= P]
            ends = rng.choice(starts, size=n[d], replace=len(starts) < n[d])
        else:
            ends = rng.integers(P, st.size - 1, size=n[d])
        prompts += [st[e - P:e].astype(np.int64) for e in ends]
    order = rng.permutation(len(prompts))
    prompts = torch.from_numpy(np.stack([prompts[i] for i in order]))
    out = []
    for i in range(0, prompts.shape[0], s.gen_batch):
        x = prompts[i:i + s.gen_batch].to(dev())
        with torch.no_grad(), autocast():
            o = model(input_ids=x, use_cache=True)
            past = o.past_key_values
            nxt = o.logits[:, -1].float().argmax(-1)
            toks = [nxt]
            for _ in range(G - 1):
                o = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
                past = o.past_key_values
                nxt = o.logits[:, -1].float().argmax(-1)
                toks.append(nxt)
        out.append(torch.cat([x, torch.stack(toks, 1)], 1).cpu())
        run.say(f"gen: {min(i + s.gen_batch, prompts.shape[0])}/{prompts.shape[0]} sequences")
    seqs = torch.cat(out).numpy().astype(np.uint16)
    os.makedirs(run.path("gen"), exist_ok=True)
    np.save(run.path("gen", "tokens.npy"), seqs)
    run.finish("gen", {"seqs": int(seqs.shape[0]), "prompt_len": P, "new": G, "wall_s": time.time() - t0})


_DISTILL = {}


def distill_data(run: C.Run):
    """Target pass over the generated sequences, computed once per invocation and shared by the
    drafter stages: tokens [S,T], taps [S,T,F] bf16, greedy labels [S,T+1], final hidden [S,T,H]
    (for DSpark's TV term)."""
    if "d" in _DISTILL:
        return _DISTILL["d"]
    t0 = time.time()
    model = load_target(run)
    toks = torch.from_numpy(np.load(run.path("gen", "tokens.npy")).astype(np.int64))
    feats, labels, hid = target_pass(model, toks, run.sizes.taps, batch=256 if dev().type == "cuda" else 16,
                                     want_hidden=True)
    toks = toks.to(dev())
    P = run.sizes.gen_prompt_len
    cons = float((labels[:, P + 1:-1] == toks[:, P + 1:]).float().mean())
    run.say(f"distill data: {toks.shape[0]} x {toks.shape[1]} tokens, features {tuple(feats.shape)}, "
            f"greedy self-consistency {cons:.4f} ({time.time() - t0:.1f} s)")
    d = {"tokens": toks, "feats": feats, "labels": labels, "hidden": hid,
         "embed": model.get_input_embeddings().weight.detach().float(),
         "head": model.lm_head.weight.detach().float(), "consistency": cons}
    _DISTILL["d"] = d
    return d


def make_drafter(run: C.Run, dcfg: C.DrafterCfg):
    import dflash_reference as R
    sp = special_ids(run)
    cfg = C.drafter_hf_config(run.sizes, dcfg, sp)
    dc = R.DrafterConfig.from_dict(cfg)
    return R.Drafter(dc), cfg


def save_drafter_bf16(model, cfg: dict, path: str):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def st_drafter(run: C.Run, a, plan: Plan, name: str):
    import tm_draft as D
    s = run.sizes
    dcfg = next(d for d in s.drafters if d.name == name)
    model, cfg = make_drafter(run, dcfg)
    dd = distill_data(run)
    D.init_drafter(model, dd["embed"].cpu(), dd["head"].cpu(), C.SEED + zlib.crc32(name.encode()) % 1000)
    model.to(dev()).train()
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    _, n_prop = D.proposal_slots(model, dcfg.block_size)
    S, T = dd["tokens"].shape
    P = s.gen_prompt_len
    n_val = max(2, S // 50)
    g = torch.Generator().manual_seed(C.SEED + 30 + len(name))
    hi = T - n_prop                        # anchors a in [P, hi]: labels up to a+n_prop <= T

    def sample(rows_from, rows_to, N):
        rows = torch.randint(rows_from, rows_to, (N,), generator=g)
        anc = torch.randint(P, hi + 1, (N, s.d_anchors), generator=g)
        rows, anc = rows.to(dev()), anc.to(dev())
        return (dd["feats"][rows], dd["tokens"][rows], dd["labels"][rows], anc,
                dd["hidden"][rows] if dd["hidden"] is not None else None)

    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.d_lr, betas=(0.9, 0.95), fused=dev().type == "cuda")
    seconds = plan.seconds_for(name)
    total = a.drafter_steps or 10 ** 9
    t_start = time.time()

    def lossfn(batch):
        f, tk, lb, anc, hid = batch
        with autocast():
            return D.drafter_loss(model, f.float() if dev().type != "cuda" else f, tk, lb, anc, dcfg.block_size,
                                  dcfg.decay_gamma, dd["embed"], dd["head"], hid)

    i = 0
    n_probe = 5 if s.name == "full" else 2
    run.say(f"{name}: {n_params / 1e6:.2f} M parameters ({n_train / 1e6:.2f} M trained), {seconds:.0f} s")
    while i < total:
        lr = C.cosine_lr(i, total, s.d_lr, s.d_warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, m = lossfn(sample(n_val, S, s.d_seqs_per_step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        i += 1
        if i == n_probe and not a.drafter_steps:
            if dev().type == "cuda":
                torch.cuda.synchronize()
            t_probe = time.time()
        if i == 2 * n_probe and not a.drafter_steps:
            if dev().type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - t_probe) / n_probe
            total = max(2 * n_probe + 1, int((seconds - (time.time() - t_start)) / dt) + i)
            run.say(f"{name}: {dt * 1000:.1f} ms/step -> {total} steps")
        if i % 10 == 0 or i == total or i <= 2:
            rec = {k: (round(float(v), 4) if v.dim() == 0 else [round(x, 3) for x in v.tolist()]) for k, v in m.items()}
            lv = float(loss.detach())
            run.log(stage=name, step=i, loss=round(lv, 4), lr=lr, gnorm=round(float(gn), 3), **rec)
            if i % 100 == 0 or i == total:
                run.say(f"{name} step {i}/{total} loss {lv:.4f} acc {rec['acc'][:4]}")
    wall = time.time() - t_start
    model.eval()
    with torch.no_grad():
        _, mv = lossfn(sample(0, n_val, min(n_val, 64)))
    val = {k: (round(float(v), 4) if v.dim() == 0 else [round(x, 3) for x in v.tolist()]) for k, v in mv.items()}
    save_drafter_bf16(model, cfg, run.path("drafters", name))
    run.finish(name, {"params": n_params, "trained_params": n_train, "steps": i, "wall_s": wall,
                      "val_teacher_forced": val, "block_size": dcfg.block_size})


def eval_trajectories(run: C.Run, model):
    """Greedy fp32 trajectories of the held-out spec-decoding prompts, and their taps."""
    s = run.sizes
    sp = special_ids(run)
    with open(run.path("data", "eval_prompts.json")) as f:
        prompts = json.load(f)
    allp, dom = [], []
    for d in TX.DOMAINS:
        allp += prompts[d][:s.eval_prompts]
        dom += [d] * len(prompts[d][:s.eval_prompts])
    traj, P = greedy_full(model, allp, s.eval_new, sp[C.EOT])
    L = P + s.eval_new
    feats, labels, _ = target_pass(model, traj, s.taps, batch=64 if dev().type == "cuda" else 8,
                                   feat_dtype=torch.float32)
    ok = tot = 0
    for i in range(traj.shape[0]):
        p, l = int(P[i]), int(L[i])
        ok += int((labels[i, p + 1:l] == traj[i, p + 1:l]).sum())
        tot += l - p - 1
    return traj, P, L, feats, dom, ok / max(1, tot)


def st_evalspec(run: C.Run, a):
    import dflash_reference as R
    import tm_draft as D
    s = run.sizes
    t0 = time.time()
    model = load_target(run)
    traj, P, L, feats, dom, cons = eval_trajectories(run, model)
    run.say(f"evalspec: {traj.shape[0]} trajectories, greedy self-consistency {cons:.5f}")
    embed = model.get_input_embeddings().weight.detach().float()
    head = model.lm_head.weight.detach().float()
    res = {"greedy_consistency": round(cons, 6), "prompts_per_domain": s.eval_prompts, "new_tokens": s.eval_new,
           "drafters": {}}
    dom_idx = {d: [i for i, x in enumerate(dom) if x == d] for d in TX.DOMAINS}
    for dcfg in s.drafters:
        path = run.path("drafters", dcfg.name)
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            continue
        dr = R.load_drafter(path).to(dev())
        blocks = sorted(set(s.eval_blocks) | {dcfg.block_size})
        out = {"arch": dcfg.arch, "trained_block_size": dcfg.block_size, "blocks": {}}
        for B in blocks:
            acc, confs = D.spec_eval(dr, feats, traj, P, L, B, embed, head)
            _, n_prop = D.proposal_slots(dr, B)
            per = {}
            for d in TX.DOMAINS:
                per[d] = D.summarize_acceptance([acc[i] for i in dom_idx[d]], n_prop)
            per["all"] = D.summarize_acceptance(acc, n_prop)
            if confs is not None:
                cm = torch.tensor([c for row in confs for c in row], dtype=torch.float64)
                per["all"]["mean_confidence"] = [round(x, 4) for x in cm.mean(0).tolist()] if cm.numel() else []
            out["blocks"][str(B)] = per
            run.say(f"evalspec {dcfg.name} B={B}: tau " + ", ".join(f"{d} {per[d].get('tau')}" for d in per))
        res["drafters"][dcfg.name] = out
    with open(run.path("eval", "spec.json"), "w") as f:
        json.dump(res, f, indent=1)
    run.finish("evalspec", {"tau_b8": {k: v["blocks"].get("8", {}).get("all", {}).get("tau")
                                       for k, v in res["drafters"].items()}, "wall_s": time.time() - t0})


# ---------------------------------------------------------------------------------------------
# Pack / unpack
# ---------------------------------------------------------------------------------------------

SHARED = ("embed_tokens.weight", "lm_head.weight")


def _tar_bytes(files: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tf:
        for name, data in files:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 0
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _dir_files(path: str, prefix: str) -> list[tuple[str, bytes]]:
    out = []
    for f in sorted(os.listdir(path)):
        fp = os.path.join(path, f)
        if os.path.isfile(fp):
            with open(fp, "rb") as fh:
                out.append((f"{prefix}/{f}", fh.read()))
    return out


def st_pack(run: C.Run, a):
    """One .tgz per model (the target split into <= 15 MB parts) and tinymodel-meta.tgz (tokenizer,
    state, logs, eval results, the generated drafter-training sequences). DSpark's embed_tokens / lm_head (frozen copies of the target's) travel as
    a reference and are restored by 'unpack', which checks their sha256."""
    from safetensors.torch import load_file, save
    t0 = time.time()
    if not a.out:
        raise SystemExit("pack needs --out DIR")
    os.makedirs(a.out, exist_ok=True)
    written = []

    def put(name: str, data: bytes):
        if len(data) <= PART_BYTES:
            with open(os.path.join(a.out, name), "wb") as f:
                f.write(data)
            written.append((name, len(data)))
            return
        for k in range(0, len(data), PART_BYTES):
            pn = f"{name}.part{k // PART_BYTES}"
            with open(os.path.join(a.out, pn), "wb") as f:
                f.write(data[k:k + PART_BYTES])
            written.append((pn, len(data[k:k + PART_BYTES])))

    meta = []
    for sub in ("tokenizer", "eval", "gen"):
        if os.path.isdir(run.path(sub)):
            meta += _dir_files(run.path(sub), sub)
    for f in ("state.json", "log.jsonl", "run.log"):
        if os.path.exists(run.path(f)):
            meta.append((f, open(run.path(f), "rb").read()))
    put("tinymodel-meta.tgz", _tar_bytes(meta))
    if os.path.isdir(run.path("target")):
        put("tinymodel-target.tgz", _tar_bytes(_dir_files(run.path("target"), "target")))
    for d in run.sizes.drafters:
        p = run.path("drafters", d.name)
        if not os.path.isdir(p):
            continue
        files = _dir_files(p, f"drafters/{d.name}")
        if d.arch == "Qwen3DSparkModel":
            sd = load_file(os.path.join(p, "model.safetensors"))
            ref = {k: hashlib.sha256(sd[k].contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                   for k in SHARED}
            for k in SHARED:
                del sd[k]
            files = [(n, b) for n, b in files if not n.endswith("model.safetensors")]
            files.append((f"drafters/{d.name}/model.safetensors.partial", save(sd, metadata={"format": "pt"})))
            files.append((f"drafters/{d.name}/shared_from_target.json",
                          json.dumps({"tensors": {"embed_tokens.weight": "model.embed_tokens.weight",
                                                  "lm_head.weight": "lm_head.weight"}, "sha256": ref}).encode()))
        put(f"tinymodel-{d.name}.tgz", _tar_bytes(files))
    total = sum(n for _, n in written)
    for n, b in written:
        run.say(f"pack: {n} {b / 1e6:.2f} MB")
    warn = []
    if len(written) > 8:
        warn.append(f"{len(written)} files (> 8 come back)")
    if total > OUT_LIMIT:
        warn.append(f"{total / 1e6:.1f} MB in all (> 63 MB)")
    if warn:
        run.say("pack WARNING: " + "; ".join(warn) + ": pack fewer models per call")
    run.finish("pack", {"files": {n: b for n, b in written}, "total_mb": round(total / 1e6, 2),
                        "warnings": warn, "wall_s": time.time() - t0})


def st_unpack(run: C.Run, a):
    from safetensors.torch import load_file, save_file
    if not a.src:
        raise SystemExit("unpack needs --from DIR")
    names = sorted(os.listdir(a.src))
    blobs = {}
    for n in names:
        base = n.split(".part")[0] if ".tgz.part" in n else n
        if not base.endswith(".tgz"):
            continue
        blobs.setdefault(base, []).append(n)
    meta_state = None
    for base, parts in sorted(blobs.items()):
        parts.sort(key=lambda x: int(x.rsplit("part", 1)[1]) if ".part" in x else -1)
        data = b"".join(open(os.path.join(a.src, p), "rb").read() for p in parts)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            for m in tf.getmembers():
                if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/"):
                    raise SystemExit(f"{base}: unexpected member {m.name!r}")
                dst = run.path(m.name)
                if m.name == "state.json":
                    meta_state = json.load(tf.extractfile(m))
                    continue
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(dst, "wb") as f:
                    f.write(tf.extractfile(m).read())
        print(f"unpack: {base} ({len(parts)} file(s))")
    for d in run.sizes.drafters:
        p = run.path("drafters", d.name)
        ref_path = os.path.join(p, "shared_from_target.json")
        if os.path.exists(ref_path):
            ref = json.load(open(ref_path))
            sd = load_file(os.path.join(p, "model.safetensors.partial"))
            tsd = load_file(os.path.join(run.path("target"), "model.safetensors"))
            for k, tk in ref["tensors"].items():
                t = tsd[tk].contiguous()
                h = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
                if h != ref["sha256"][k]:
                    raise SystemExit(f"unpack: {d.name}.{k} does not match the target's {tk}")
                sd[k] = t
            save_file(sd, os.path.join(p, "model.safetensors"), metadata={"format": "pt"})
            os.remove(os.path.join(p, "model.safetensors.partial"))
            os.remove(ref_path)
    if meta_state is not None:
        merged = dict(meta_state["stages"])
        merged.update(run.state["stages"])
        run.state["stages"] = merged
        run.save()
    print(f"unpack: restored into {run.work}; finished stages: {sorted(run.state['stages'])}")


# ---------------------------------------------------------------------------------------------
# Checks (smoke) and the reference cross-check
# ---------------------------------------------------------------------------------------------

class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"CHECK FAILED: {what}", flush=True)


def st_checks(run: C.Run, a):
    import dflash_reference as R
    import tm_draft as D
    ck = Checks()
    # 1. chat template (jinja and the python twin) vs the engine's goldens
    gpath = os.path.join(ROOT, "tests", "fixtures", "chat", "goldens.json")
    if os.path.exists(gpath):
        from transformers.utils.chat_template_utils import render_jinja_template
        n = 0
        for c in json.load(open(gpath))["cases"]:
            o = c.get("options", {})
            if (c["flavor"] != "qwen35" or c.get("tools") or "expected" not in c
                    or set(o) - {"add_generation_prompt", "enable_thinking"}
                    or any(m.get("tool_calls") or not isinstance(m.get("content"), str) for m in c["messages"])):
                continue
            kw = {k: v for k, v in o.items()}
            py = C.render_chat(c["messages"], o.get("add_generation_prompt", False), o.get("enable_thinking", True))
            jj = render_jinja_template(conversations=[c["messages"]], chat_template=C.CHAT_TEMPLATE, **kw)[0][0]
            ck.ok(py == c["expected"] and jj == c["expected"], f"chat template golden {c['name']}")
            n += 1
        ck.ok(n >= 40, f"chat goldens checked: {n}")
    # 2. tokenizer: round trip and special tokens
    tok, sp = TX.load_tokenizer(run.path("tokenizer"))
    txt = C.render_chat([{"role": "user", "content": "def f(x):\n    return x  # ok"},
                         {"role": "assistant", "content": "Sure."}])
    ids = tok.encode(txt, add_special_tokens=False).ids
    ck.ok(tok.decode(ids, skip_special_tokens=False) == txt, "tokenizer round trip")
    ck.ok(ids[0] == sp[C.IM_START] and sp[C.IM_END] in ids, "chat markup encodes as special tokens")
    ck.ok(max(sp.values()) < run.sizes.vocab_size, "special ids inside the vocabulary")
    # 3. batched drafter forward == reference draft_block; batched proposals == reference propose
    if os.path.exists(run.path("target", "model.safetensors")):
        model = load_target(run).cpu()
        toks = torch.from_numpy(load_stream(run, "code.heldout")[:60].astype(np.int64))
        runner = R.TargetRunner(model, run.sizes.taps)
        _, taps = runner.forward(toks.tolist())
        runner_hooks = runner._hooks
        for h in runner_hooks:
            h.remove()
        embed = model.get_input_embeddings().weight.detach().float()
        head = model.lm_head.weight.detach().float()
        for dcfg in run.sizes.drafters:
            dr, _ = make_drafter(run, dcfg)
            D.init_drafter(dr, embed, head, 7)
            # perturb the identity-initialized heads so that they are exercised
            with torch.no_grad():
                gg = torch.Generator().manual_seed(3)
                for n_, p in dr.named_parameters():
                    if "base_kernel" in n_ or "kernel_projection" in n_ or "successor" in n_ or "markov_w2" in n_ \
                            or "confidence" in n_:
                        p.add_(torch.randn(p.shape, generator=gg) * 0.05)
            dr.eval()
            B = dcfg.block_size
            anchors = [5, 17, 40]
            kv = D.context_kv(dr, taps[None])
            ap = torch.tensor([anchors])
            hid = D.block_forward(dr, kv, ap, toks[ap], B, dr.embed_table(embed))
            err = 0.0
            perr = True
            for j, a_ in enumerate(anchors):
                ref = dr.draft_block(R.DraftContextCache(dr.dc.num_layers), taps[:a_], a_, int(toks[a_]), B,
                                     dr.embed_table(embed))
                err = max(err, float((ref - hid[0, j]).abs().max().detach()))
                rl = dr.logits(ref, dr.head_weight(head))
                rp = R.propose(dr, ref, rl, int(toks[a_]), B, R.default_proposer(dr))
                bp, _ = D.propose_batch(dr, hid[0, j][None], dr.head_weight(head), toks[a_][None], B)
                perr &= bp[0].tolist() == rp
            ck.ok(err < 1e-4, f"{dcfg.name}: batched block forward vs reference draft_block (max |diff| {err:.2e})")
            ck.ok(perr, f"{dcfg.name}: batched proposals vs reference propose")
            print(f"  check {dcfg.name}: block forward max |diff| {err:.2e}, proposals equal: {perr}")
    print(f"checks: {ck.passed} passed, {ck.failed} failed")
    run.finish("checks", {"passed": ck.passed, "failed": ck.failed})
    if ck.failed:
        raise SystemExit(1)


def st_crosscheck(run: C.Run, a):
    """Reference greedy speculative loop (dflash_reference.spec_generate, CPU, fp32, full
    recompute per verify) vs the batched evaluator on prompts_per_domain prompts per domain
    (--crosscheck-prompts, default 1) at each drafter's trained block size: the committed tokens
    must equal the greedy trajectory and the accepted counts of every round must agree."""
    import dflash_reference as R
    import tm_draft as D
    s = run.sizes
    t0 = time.time()
    model = load_target(run).cpu()
    sp = special_ids(run)
    with open(run.path("data", "eval_prompts.json")) as f:
        prompts = json.load(f)
    k = a.crosscheck_prompts
    sel = [(d, p) for d in TX.DOMAINS for p in prompts[d][:k]]
    new = min(s.eval_new, a.crosscheck_new)
    x, P = greedy_full(model, [p for _, p in sel], new, sp[C.EOT])
    L = P + new
    feats, _, _ = target_pass(model, x, s.taps, batch=4, feat_dtype=torch.float32)
    embed = model.get_input_embeddings().weight.detach().float()
    head = model.lm_head.weight.detach().float()
    report = {}
    bad = 0
    for dcfg in s.drafters:
        path = run.path("drafters", dcfg.name)
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            continue
        dr = R.load_drafter(path)
        B = dcfg.block_size
        acc, _ = D.spec_eval(dr, feats, x, P, L, B, embed, head)
        runner = R.TargetRunner(model, dr.dc.target_layer_ids)
        rows = []
        for i, (d, p) in enumerate(sel):
            toks, rounds = R.spec_generate(runner, dr, p, new, B)
            same_out = toks == x[i, P[i]:L[i]].tolist()
            ref_a = [r.accepted for r in rounds][:len(acc[i])]
            same_a = ref_a == acc[i]
            bad += int(not (same_out and same_a))
            rows.append({"domain": d, "tokens_equal": same_out, "rounds_equal": same_a,
                         "rounds_compared": len(acc[i]), "ref_tau": round(sum(r.accepted + 1 for r in rounds) / len(rounds), 3)})
        for h in runner._hooks:
            h.remove()
        report[dcfg.name] = rows
        print(f"crosscheck {dcfg.name} B={B}: {rows}", flush=True)
    os.makedirs(run.path("eval"), exist_ok=True)
    with open(run.path("eval", "crosscheck.json"), "w") as f:
        json.dump(report, f, indent=1)
    run.finish("crosscheck", {"mismatches": bad, "wall_s": time.time() - t0})
    if bad:
        raise SystemExit(f"crosscheck: {bad} mismatching runs (see {run.path('eval', 'crosscheck.json')})")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="tiny model family pipeline (issue #6)")
    ap.add_argument("--data", default=os.path.join(ROOT, ".tinydata"), help="corpus folder (make_corpus.py)")
    ap.add_argument("--work", default=None, help="work folder (default .tinywork, or .tinywork-smoke)")
    ap.add_argument("--out", default=None, help="pack: output folder (e.g. $OUT)")
    ap.add_argument("--from", dest="src", default=None, help="unpack: folder with the packed files")
    ap.add_argument("--stage", default="all", help="all | comma list of " + ",".join(ALL + UTIL) + " | drafters")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for this invocation (default 480; smoke 110)")
    ap.add_argument("--target-steps", type=int, default=None, help="fixed target steps instead of the time budget")
    ap.add_argument("--drafter-steps", type=int, default=None, help="fixed steps per drafter")
    ap.add_argument("--crosscheck-prompts", type=int, default=1)
    ap.add_argument("--crosscheck-new", type=int, default=128)
    ap.add_argument("--force", action="store_true", help="rerun stages already finished")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: all; smoke: 1)")
    ap.add_argument("--smoke", action="store_true", help="toy sizes + tiny corpus + checks, CPU, < 3 min")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                    help="override an integer field of the training / evaluation sizes (tm_common.Sizes), "
                         "e.g. --set gen_seqs=8192; for dry runs and experiments")
    a = ap.parse_args(argv)
    sizes = copy.deepcopy(C.SMOKE if a.smoke else C.FULL)
    for kv in a.set:
        k, _, v = kv.partition("=")
        if (k == "vocab_size" or not hasattr(sizes, k) or not isinstance(getattr(sizes, k), int)
                or isinstance(getattr(sizes, k), bool)):
            raise SystemExit(f"--set {kv}: '{k}' is not an integer training / evaluation field of Sizes")
        setattr(sizes, k, int(v))
    if a.work is None:
        a.work = os.path.join(ROOT, ".tinywork-smoke" if a.smoke else ".tinywork")
    if a.budget_s is None:
        a.budget_s = 110.0 if a.smoke else 480.0
    if a.smoke and a.data == os.path.join(ROOT, ".tinydata"):
        a.data = os.path.join(a.work, "corpus")
    if a.smoke and not os.path.exists(os.path.join(a.data, "manifest.json")):
        import make_corpus
        make_corpus.main(["--out", a.data, "--smoke"])
    if a.smoke and a.out is None:
        a.out = os.path.join(a.work, "out")
    random.seed(C.SEED)
    np.random.seed(C.SEED % 2 ** 32)
    torch.manual_seed(C.SEED)
    if dev().type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.set_num_threads(a.threads or (1 if a.smoke else max(1, os.cpu_count() or 1)))
    run = C.Run(a.work, a.budget_s, sizes)
    if a.stage == "all":
        stages = list(ALL) + (["checks"] if a.smoke else [])
    else:
        stages = []
        for x in a.stage.split(","):
            stages += ["dflash", "dflash2", "dspark", "dflash_b16"] if x == "drafters" else [x]
    for x in stages:
        if x not in ALL + UTIL:
            raise SystemExit(f"unknown stage '{x}'")
    if a.smoke and "checks" in stages:
        stages.remove("checks")
        stages.insert(stages.index("pack") if "pack" in stages else len(stages), "checks")
    # the budget is shared among the stages that will actually run
    plan = Plan(run, [x for x in stages if a.force or not run.done(x) or x in UTIL or x == "pack"])
    import transformers
    run.say(f"device {dev()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"sizes {sizes.name}, stages {stages}, budget {a.budget_s:.0f} s")
    run.state.setdefault("versions", {})[str(dev().type)] = {"torch": torch.__version__,
                                                              "transformers": transformers.__version__,
                                                              "python": sys.version.split()[0]}
    run.save()

    def run_stage(st):
        if st == "data":
            if a.force or not data_ready(run) or not run.done("data"):
                st_data(run, a)
            else:
                run.say("stage data: already done (use --force to redo)")
            return
        if st not in ("tokenizer", "unpack", "pack") and not data_ready(run):
            if not os.path.exists(run.path("tokenizer", "tokenizer.json")):
                raise SystemExit(f"stage {st} needs the tokenizer: run --stage tokenizer or unpack one")
            st_data(run, a)         # token data is derived, cheap and never packed: redo it
        if run.done(st) and not a.force and st not in UTIL and st != "pack":
            run.say(f"stage {st}: already done (use --force to redo)")
            return
        run.say(f"stage {st} ...")
        if st == "tokenizer":
            st_tokenizer(run, a)
        elif st == "target":
            st_target(run, a, plan)
        elif st == "evaltarget":
            st_evaltarget(run, a)
        elif st == "gen":
            st_gen(run, a)
        elif st in ("dflash", "dflash2", "dspark", "dflash_b16"):
            st_drafter(run, a, plan, st)
        elif st == "evalspec":
            st_evalspec(run, a)
        elif st == "pack":
            st_pack(run, a)
        elif st == "unpack":
            st_unpack(run, a)
        elif st == "checks":
            st_checks(run, a)
        elif st == "crosscheck":
            st_crosscheck(run, a)

    for st in stages:
        try:
            run_stage(st)
        except BaseException as e:
            # whatever was finished still comes back: pack it before failing
            if "pack" in stages and st != "pack" and a.out:
                run.say(f"stage {st} FAILED ({type(e).__name__}: {e}); packing what is finished")
                try:
                    st_pack(run, a)
                except Exception as e2:
                    run.say(f"pack after failure failed too: {e2}")
            raise
    if a.smoke and "crosscheck" not in stages and a.stage == "all":
        st_crosscheck(run, a)
    run.say("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
