"""tm_draft.py: batched drafter forward, training losses and the batched greedy speculative
evaluation for the tiny-model pipeline (tools/tinymodel/pipeline.py).

The drafter modules and parameter names are tools/reference/dflash_reference.py's (R.Drafter);
this file only adds a batched forward over many sequences x many anchors, which the reference
(one sequence, one block) does not have. It is the same computation as R.Drafter.draft_block:
fused context c = hidden_norm(fc(taps)); per layer, context K/V = (k_norm(W_K c) roped at the
context position, W_V c); the block [anchor, mask x (B-1)] at positions a..a+B-1 attends to the
context positions < a and to its own B slots (per-layer causality and sliding window as resolved
by R.DrafterConfig); DFlash2 convolutions run along the block slots. pipeline.py's smoke run
checks block_forward() against R.Drafter.draft_block and spec_eval() against R.spec_generate.

Layouts (spec §0): z-lab DFlash / DFlash2 propose from slots 1..B-1 (slot j predicts position
a+j); DSpark (shifted) proposes from slots 0..B-1 (slot j predicts a+j+1).

Training labels are the target's own greedy tokens: g[p] = argmax of the target logits at row
p-1 of the same sequence. The "walk" token before a proposal is the anchor for the first slot and
the previous label after it (teacher forcing for the DFlash2 selector and the DSpark Markov head).
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

import dflash_reference as R


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    """NEOX rotate-half RoPE. x [..., heads, d], pos [...] (same leading shape)."""
    freqs = pos.to(torch.float32)[..., None] * inv_freq.to(x.device)           # [..., d/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = (emb.cos() * scale)[..., None, :]
    sin = (emb.sin() * scale)[..., None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def context_kv(model: R.Drafter, feats: torch.Tensor):
    """feats [N, T, n_t*H] -> per layer (K [N,T,kv,d] roped at 0..T-1, V [N,T,kv,d])."""
    N, T, _ = feats.shape
    c = model.fuse_context(feats)
    pos = torch.arange(T, device=feats.device)[None, :].expand(N, T)
    out = []
    for layer in model.layers:
        at = layer.self_attn
        k = at.k_norm(at.k_proj(c).view(N, T, at.nkv, at.hd))
        v = at.v_proj(c).view(N, T, at.nkv, at.hd)
        out.append((_rope(k, pos, model.inv_freq, model.rope_scale), v))
    return out


def _conv(conv, z: torch.Tensor, dyn: torch.Tensor, stage: int) -> torch.Tensor:
    """Batched R.GroupedDynamicCausalConv._convolve along the block-slot axis (dim -2).
    z [N,K,B,H], dyn [N,K,B,Kc,G]."""
    B = z.shape[-2]
    out = torch.zeros_like(z)
    for o in range(conv.kernel_size):
        if o:
            shifted = torch.zeros_like(z)
            shifted[..., o:, :] = z[..., :B - o, :]
        else:
            shifted = z
        per_channel = dyn[..., o, :].repeat_interleave(conv.group_size, dim=-1)
        out = out + conv.base_kernel[stage, o] * shifted + per_channel * shifted
    return out


def _conv_prepare(conv, u: torch.Tensor):
    sh = u.shape[:-1]
    dyn = conv.kernel_projection(u).view(*sh, 2, conv.kernel_size, -1)
    return _conv(conv, u, dyn[..., 0, :, :], 0), dyn[..., 1, :, :]


def _attention(layer, u, blk_pos, anchor_pos, kctx, vctx, inv_freq, scale):
    """u [N,K,B,H]; blk_pos [N,K,B]; anchor_pos [N,K]; kctx/vctx [N,T,kv,d]."""
    at = layer.self_attn
    N, K, B, _ = u.shape
    T = kctx.shape[1]
    q = _rope(at.q_norm(at.q_proj(u).view(N, K, B, at.nh, at.hd)), blk_pos, inv_freq, scale)
    kb = _rope(at.k_norm(at.k_proj(u).view(N, K, B, at.nkv, at.hd)), blk_pos, inv_freq, scale)
    vb = at.v_proj(u).view(N, K, B, at.nkv, at.hd)
    rep = at.nh // at.nkv
    kc, vc = kctx, vctx
    if rep > 1:
        kc, vc = kc.repeat_interleave(rep, dim=2), vc.repeat_interleave(rep, dim=2)
        kb, vb = kb.repeat_interleave(rep, dim=3), vb.repeat_interleave(rep, dim=3)
    dt = q.dtype
    s_ctx = torch.einsum("nkbhd,nthd->nkhbt", q, kc.to(dt)) / math.sqrt(at.hd)
    s_blk = torch.einsum("nkbhd,nkchd->nkhbc", q, kb.to(dt)) / math.sqrt(at.hd)
    tpos = torch.arange(T, device=u.device)
    vis_ctx = tpos[None, None, None, :] < anchor_pos[:, :, None, None]          # [N,K,1,T]
    if at.window is not None:
        vis_ctx = vis_ctx & ((blk_pos[..., None] - tpos) < at.window)           # [N,K,B,T]
    else:
        vis_ctx = vis_ctx.expand(N, K, B, T)
    j = torch.arange(B, device=u.device)
    vis_blk = torch.ones(B, B, dtype=torch.bool, device=u.device)
    if at.causal:
        vis_blk &= j[None, :] <= j[:, None]
    if at.window is not None:
        vis_blk &= (j[:, None] - j[None, :]) < at.window
        if not at.causal:
            vis_blk &= (j[None, :] - j[:, None]) < at.window
    s_ctx = s_ctx.float().masked_fill(~vis_ctx[:, :, None], float("-inf"))
    s_blk = s_blk.float().masked_fill(~vis_blk, float("-inf"))
    p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1).to(dt)
    out = (torch.einsum("nkhbt,nthd->nkbhd", p[..., :T], vc.to(dt))
           + torch.einsum("nkhbc,nkchd->nkbhd", p[..., T:], vb.to(dt)))
    return at.o_proj(out.reshape(N, K, B, at.nh * at.hd))


def block_forward(model: R.Drafter, kv, anchor_pos: torch.Tensor, anchor_tok: torch.Tensor,
                  block_size: int, embed_weight: torch.Tensor) -> torch.Tensor:
    """One drafter pass over N sequences x K anchors. kv = context_kv(model, feats);
    anchor_pos/anchor_tok [N,K]. Returns the final-normed block hidden [N,K,B,H]."""
    N, K = anchor_pos.shape
    B = block_size
    dev = anchor_pos.device
    ids = torch.full((N, K, B), model.dc.mask_token_id, dtype=torch.long, device=dev)
    ids[..., 0] = anchor_tok
    x = F.embedding(ids, embed_weight) * model.dc.input_embedding_scale
    blk_pos = anchor_pos[..., None] + torch.arange(B, device=dev)
    for i, layer in enumerate(model.layers):
        u = layer.input_layernorm(x)
        if layer.attention_conv is not None:
            u, dyn = _conv_prepare(layer.attention_conv, u)
        a = _attention(layer, u, blk_pos, anchor_pos, kv[i][0], kv[i][1], model.inv_freq, model.rope_scale)
        if layer.attention_conv is not None:
            a = _conv(layer.attention_conv, a, dyn, 1)
        x = x + a
        u = layer.post_attention_layernorm(x)
        if layer.mlp_conv is not None:
            u, dyn = _conv_prepare(layer.mlp_conv, u)
        m = layer.mlp(u)
        if layer.mlp_conv is not None:
            m = _conv(layer.mlp_conv, m, dyn, 1)
        x = x + m
    return model.norm(x)


def proposal_slots(model: R.Drafter, block_size: int) -> tuple[int, int]:
    """(first proposal slot, number of proposals): (1, B-1) z-lab, (0, B) shifted."""
    return (0, block_size) if model.dc.sample_from_anchor else (1, block_size - 1)


def init_drafter(model: R.Drafter, target_embed: torch.Tensor, target_head: torch.Tensor, seed: int):
    """Initialization per the spec: DFlash2 convs = identity (base tap 0 = 1, projection 0), selector
    predecessor codebook ~ N(0, 0.02), successor 0 (a no-op at init); DSpark Markov W1 ~ N(0,
    0.02), W2 = 0, frozen embed_tokens / lm_head = copies of the target's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("candidate_selector", "markov_head", "embed_tokens",
                                                     "lm_head", "confidence_head")):
                if "kernel_projection" in name:
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[1])))
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    conv.base_kernel.zero_()
                    conv.base_kernel[:, 0, :] = 1.0
                    conv.kernel_projection.weight.zero_()
            # residual-branch outputs start small (a common init for short training)
            layer.self_attn.o_proj.weight.mul_(0.5 / math.sqrt(len(model.layers)))
            layer.mlp.down_proj.weight.mul_(0.5 / math.sqrt(len(model.layers)))
        if model.candidate_selector is not None:
            cs = model.candidate_selector
            cs.predecessor_codebook.copy_(torch.randn(cs.predecessor_codebook.shape, generator=g) * 0.02)
            cs.successor_codebook.zero_()
            cs.hidden_projection.weight.copy_(torch.randn(cs.hidden_projection.weight.shape, generator=g)
                                              / math.sqrt(model.dc.hidden_size))
        if model.dc.is_dspark:
            model.embed_tokens.weight.copy_(target_embed)
            model.lm_head.weight.copy_(target_head)
            model.embed_tokens.weight.requires_grad_(False)
            model.lm_head.weight.requires_grad_(False)
            if model.markov_head is not None:
                mh = model.markov_head
                mh.markov_w1.weight.copy_(torch.randn(mh.markov_w1.weight.shape, generator=g) * 0.02)
                mh.markov_w2.weight.zero_()
            if model.confidence_head is not None:
                model.confidence_head.proj.weight.zero_()
                model.confidence_head.proj.bias.fill_(0.0)


# ---------------------------------------------------------------------------------------------
# Training loss
# ---------------------------------------------------------------------------------------------

def drafter_loss(model: R.Drafter, feats, tokens, labels, anchor_pos, block_size, decay_gamma,
                 target_embed, target_head, target_final_hidden=None):
    """Block loss for a batch. feats [N,T,F]; tokens [N,T]; labels [N,T+1] (labels[:,p] = target
    greedy token for position p, p >= 1); anchor_pos [N,K] with a + n_prop <= T (shifted: label
    index a+B <= T). target_final_hidden [N,T,H] (post-norm) is needed for DSpark's TV term.
    Returns (loss, metrics dict of detached tensors)."""
    N, K = anchor_pos.shape
    dev = feats.device
    first, n = proposal_slots(model, block_size)
    kv = context_kv(model, feats)
    anchor_tok = tokens.gather(1, anchor_pos)
    hidden = block_forward(model, kv, anchor_pos, anchor_tok, block_size,
                           model.embed_table(target_embed))                        # [N,K,B,H]
    h = hidden[:, :, first:first + n]                                             # [N,K,n,H]
    head = model.head_weight(target_head)
    logits = model.logits(h, head).float()                                        # [N,K,n,V]
    # proposal i predicts position a+i+1 in both layouts (z-lab slot i+1 -> a+(i+1); shifted slot
    # i -> a+i+1)
    lpos = anchor_pos[..., None] + torch.arange(1, n + 1, device=dev)
    lab = labels.gather(1, lpos.view(N, -1)).view(N, K, n)
    prev = torch.cat([anchor_tok[..., None], lab[..., :-1]], dim=-1)              # walk tokens
    w = torch.exp(-torch.arange(n, device=dev, dtype=torch.float32) / decay_gamma)
    w = w / w.sum()
    V = logits.shape[-1]
    metrics = {}
    if model.dc.is_dspark:
        mh = model.markov_head
        z = logits + mh.markov_w2(mh.markov_w1(prev)).float() if mh is not None else logits
        ce = F.cross_entropy(z.view(-1, V), lab.view(-1), reduction="none").view(N, K, n)
        tlog = (target_final_hidden.gather(1, (lpos - 1).view(N, -1, 1).expand(-1, -1, target_final_hidden.shape[-1]))
                .view(N, K, n, -1) @ target_head.t().to(target_final_hidden.dtype)).float()
        pt = torch.softmax(tlog, dim=-1)
        pd = torch.softmax(z, dim=-1)
        tv = 0.5 * (pd - pt).abs().sum(-1)
        loss = ((0.1 * ce + 0.9 * tv) * w).sum(-1).mean()
        if model.confidence_head is not None:
            feats_c = h
            if model.dc.confidence_head_with_markov:
                feats_c = torch.cat([h, mh.markov_w1(prev).to(h.dtype)], dim=-1)
            cl = model.confidence_head.proj(feats_c)[..., 0].float()
            bce = F.binary_cross_entropy_with_logits(cl, (1.0 - tv).detach(), reduction="none")
            loss = loss + (bce * w).sum(-1).mean()
            metrics["bce"] = (bce * w).sum(-1).mean().detach()
        metrics["tv"] = (tv * w).sum(-1).mean().detach()
        pred = z.argmax(-1)
    else:
        ce = F.cross_entropy(logits.view(-1, V), lab.view(-1), reduction="none").view(N, K, n)
        loss = (ce * w).sum(-1).mean()
        pred = logits.argmax(-1)
        if model.candidate_selector is not None:
            cs = model.candidate_selector
            vals, ids = torch.sort(logits.detach(), dim=-1, descending=True, stable=True)
            ids = ids[..., :cs.top_k]
            U = logits.gather(-1, ids)
            g = cs.hidden_projection(h)
            s = U + torch.einsum("nkpr,nkpcr->nkpc", (cs.predecessor_codebook[prev] * g).float(),
                                 cs.successor_codebook[ids].float())
            hit = ids == lab[..., None]
            valid = hit.any(-1)
            tgt = hit.float().argmax(-1)
            sel_ce = F.cross_entropy(s.view(-1, cs.top_k), tgt.view(-1), reduction="none").view(N, K, n)
            sel_ce = sel_ce * valid
            loss = loss + (sel_ce * w).sum(-1).mean()
            metrics["sel_ce"] = (sel_ce * w).sum(-1).mean().detach()
            metrics["sel_acc"] = ((s.argmax(-1) == tgt) & valid).float().mean((0, 1)).detach()
            metrics["topk_recall"] = valid.float().mean((0, 1)).detach()
        metrics["ce"] = (ce * w).sum(-1).mean().detach()
    metrics["acc"] = (pred == lab).float().mean((0, 1)).detach()                 # per position
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# Batched greedy speculative evaluation (exact for greedy verification)
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def propose_batch(model: R.Drafter, hidden: torch.Tensor, head: torch.Tensor, anchor: torch.Tensor,
                  block_size: int):
    """hidden [n,B,H] -> (proposals [n, n_prop] long, confidence probs [n, n_prop] or None),
    greedy, batched twins of R.propose (argmax / selector walk / Markov chain)."""
    first, n_prop = proposal_slots(model, block_size)
    h = hidden[:, first:first + n_prop]
    logits = model.logits(h, head).float()
    conf = None
    if model.dc.is_dflash2:
        cs = model.candidate_selector
        vals, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        vals, ids = vals[..., :cs.top_k], ids[..., :cs.top_k]
        g = cs.hidden_projection(h)
        prev = anchor
        out = []
        for p in range(n_prop):
            s = vals[:, p] + torch.einsum("nkr,nr->nk", cs.successor_codebook[ids[:, p]],
                                          cs.predecessor_codebook[prev] * g[:, p])
            k = s.argmax(-1)
            prev = ids[:, p].gather(1, k[:, None])[:, 0]
            out.append(prev)
        return torch.stack(out, 1), None
    if model.dc.is_dspark:
        mh = model.markov_head
        prev = anchor
        out, prevs = [], []
        for p in range(n_prop):
            z = logits[:, p]
            if mh is not None:
                z = z + mh.markov_w2(mh.markov_w1.weight[prev])
            prevs.append(prev)
            prev = z.argmax(-1)
            out.append(prev)
        if model.confidence_head is not None:
            feats = h
            if model.dc.confidence_head_with_markov:
                feats = torch.cat([h, mh.markov_w1.weight[torch.stack(prevs, 1)]], dim=-1)
            conf = torch.sigmoid(model.confidence_head.proj(feats)[..., 0])
        return torch.stack(out, 1), conf
    return logits.argmax(-1), None


@torch.no_grad()
def spec_eval(model: R.Drafter, feats: torch.Tensor, traj: torch.Tensor, prompt_len: torch.Tensor,
              traj_len: torch.Tensor, block_size: int, target_embed: torch.Tensor,
              target_head: torch.Tensor):
    """Greedy speculative decoding of N known greedy trajectories at once.

    traj [N,T]: prompt followed by the target's greedy continuation; feats [N,T,F] the target taps
    of traj (a causal model: the taps of the committed prefix are those rows); prompt_len [N]
    (= position of the first generated token, the first anchor); traj_len [N]. Because verify is
    greedy and lossless, the committed stream is the trajectory itself, so a round only needs the
    drafter: proposals d vs the trajectory's next tokens -> a = longest matching prefix, commit
    a+1. Rounds run while all proposal positions lie inside the trajectory.
    Returns (list per sequence of accepted counts a per round, list of per-round confidences or
    None)."""
    N, T = traj.shape
    dev = traj.device
    first, n_prop = proposal_slots(model, block_size)
    kv = context_kv(model, feats)
    embed = model.embed_table(target_embed)
    head = model.head_weight(target_head)
    start = prompt_len.clone()
    accepted = [[] for _ in range(N)]
    confs = [[] for _ in range(N)]
    while True:
        active = (start + n_prop <= traj_len - 1).nonzero()[:, 0]
        if active.numel() == 0:
            break
        s = start[active]
        b = traj[active, s]
        kv_a = [(k[active], v[active]) for k, v in kv]
        hidden = block_forward(model, kv_a, s[:, None], b[:, None], block_size, embed)[:, 0]
        d, conf = propose_batch(model, hidden, head, b, block_size)
        truth = traj[active[:, None], s[:, None] + 1 + torch.arange(n_prop, device=dev)]
        a = (d == truth).long().cumprod(-1).sum(-1)
        for i, (row, ai) in enumerate(zip(active.tolist(), a.tolist())):
            accepted[row].append(ai)
            if conf is not None:
                confs[row].append(conf[i].tolist())
        start[active] = s + a + 1
    return accepted, (confs if getattr(model, "confidence_head", None) is not None else None)


def summarize_acceptance(accepted: list[list[int]], n_prop: int) -> dict:
    """tau = mean(a+1) over all rounds; per-position acceptance: P(a >= k) and P(a >= k | a >=
    k-1) for k = 1..n_prop; histogram of a."""
    allr = [a for seq in accepted for a in seq]
    if not allr:
        return {"rounds": 0}
    t = torch.tensor(allr, dtype=torch.float64)
    ge = [float((t >= k).double().mean()) for k in range(0, n_prop + 1)]
    return {
        "rounds": len(allr),
        "tau": round(float((t + 1).mean()), 4),
        "accept_ge_k": [round(x, 4) for x in ge[1:]],
        "accept_cond_k": [round(ge[k] / ge[k - 1], 4) if ge[k - 1] > 0 else None for k in range(1, n_prop + 1)],
        "hist": [int((t == k).sum()) for k in range(n_prop + 1)],
    }
