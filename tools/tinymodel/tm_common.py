"""tm_common.py: configurations, special tokens, the chat template and small helpers shared by the
tiny-model pipeline (tools/tinymodel/pipeline.py; issue #6, DESIGN.md §8).

Sizes (FULL) follow the engine's constraints: every weight row length is a multiple of 256 so that
K-quants apply (hidden 256, MLP widths 1024 / 512, n_head*head_dim = 256, DeltaNet value width
H_v*d_v = 256, selector / Markov rank 256, fc input 3*256), linear_key_head_dim ==
linear_value_head_dim, H_v != H_k, untied head, hybrid 3 DeltaNet : 1 attention.
SMOKE is the same structure at toy sizes for the CPU smoke run.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, asdict

SEED = 20260601

# Qwen3.5 pre-tokenizer regex, exactly as in Qwen3.5's tokenizer.json (src/convert/tokenizer.c
# recognizes this string and writes tokenizer.ggml.pre = "qwen35").
RE_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# The Qwen3.5 added tokens in their order (text, special), target-qwen35.md §4, then our mask
# token for the drafters (dflash_config.mask_token_id). They follow the BPE vocabulary, as in Qwen.
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False), ("<|audio_start|>", True),
    ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
    ("<|MASK|>", True),
]
EOT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"

# Our own ChatML template with the Qwen3.5 layout for plain conversations (system / user /
# assistant / tool messages; no tool schemas): system and user text trimmed; the assistant turns
# after the last user message carry a <think> block (reasoning_content, or the text before
# </think> in the content), earlier ones only their content; the generation prompt opens
# "<think>\n", closed at once when enable_thinking is false. render_chat() below is the same
# logic in Python; the smoke run checks both against tests/fixtures/chat/goldens.json.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set text = (m.content if m.content is string else '') | trim %}"
    "{%- if m.role == 'system' %}"
    "{%- if not loop.first %}{{- raise_exception('System message must be at the beginning.') }}{%- endif %}"
    "{{- '<|im_start|>system\\n' + text + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + text + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in text %}"
    "{%- set reasoning = text.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + (reasoning | trim) + '\\n</think>\\n\\n' + text + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + text + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- raise_exception('Unexpected message role.') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def render_chat(messages: list[dict], add_generation_prompt: bool = False,
                enable_thinking: bool = True) -> str:
    """Python twin of CHAT_TEMPLATE (same output for every conversation it accepts)."""
    last_query = -1
    for i, m in enumerate(messages):
        if m["role"] == "user":
            last_query = i
    out = []
    for i, m in enumerate(messages):
        text = m.get("content") if isinstance(m.get("content"), str) else ""
        text = text.strip()
        role = m["role"]
        if role == "system":
            if i != 0:
                raise ValueError("System message must be at the beginning.")
            out.append(f"<|im_start|>system\n{text}<|im_end|>\n")
        elif role == "user":
            out.append(f"<|im_start|>user\n{text}<|im_end|>\n")
        elif role == "assistant":
            reasoning = ""
            if isinstance(m.get("reasoning_content"), str):
                reasoning = m["reasoning_content"]
            elif "</think>" in text:
                reasoning = text.split("</think>")[0].split("<think>")[-1]
                text = text.split("</think>")[-1].lstrip("\n")
            if i > last_query:
                out.append(f"<|im_start|>assistant\n<think>\n{reasoning.strip()}\n</think>\n\n{text}<|im_end|>\n")
            else:
                out.append(f"<|im_start|>assistant\n{text}<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{text}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:
            raise ValueError("Unexpected message role.")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n<think>\n")
        if not enable_thinking:
            out.append("\n</think>\n\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------

@dataclass
class TargetCfg:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    full_attention_interval: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_head_dim: int               # linear_key_head_dim == linear_value_head_dim
    mrope_section: list
    max_position_embeddings: int = 4096
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25


@dataclass
class DrafterCfg:
    name: str
    arch: str                          # DFlashDraftModel | DFlash2DraftModel | Qwen3DSparkModel
    block_size: int
    num_layers: int
    layer_type: str                    # full_attention | sliding_attention
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    decay_gamma: float                 # position weights exp(-(k-1)/gamma)
    conv_group_size: int = 16
    selector_rank: int = 0
    selector_top_k: int = 0
    markov_rank: int = 0
    sliding_window: int = 2048


@dataclass
class Sizes:
    name: str
    vocab_size: int
    target: TargetCfg
    taps: list
    drafters: list
    # target training
    seq_len: int
    batch: int
    lr: float
    warmup: int
    # drafter data (target continuations) and training
    gen_prompt_len: int
    gen_new: int
    gen_seqs: int
    gen_batch: int
    d_seqs_per_step: int
    d_anchors: int
    d_lr: float
    d_warmup: int
    # evaluation
    eval_windows: int                  # held-out windows of seq_len per domain
    eval_prompts: int                  # spec-decoding prompts per domain
    eval_prompt_len: int               # code / prose prompts: first N tokens of a held-out doc
    eval_new: int
    chat_prompt_max: int               # longest chat prompt (system+user+generation prompt) used
    eval_blocks: list = field(default_factory=lambda: [4, 8, 16])
    # time reserved for the non-training stages when splitting --budget-s (seconds)
    reserve: dict = field(default_factory=dict)


def drafters_for(H_i: int, heads: int, kv: int, hd: int, layers: int, rank: int, topk: int,
                 group: int) -> list:
    return [
        DrafterCfg("dflash", "DFlashDraftModel", 8, layers, "full_attention", H_i, heads, kv, hd, 4.0),
        DrafterCfg("dflash2", "DFlash2DraftModel", 8, layers, "sliding_attention", H_i, heads, kv, hd, 4.0,
                   conv_group_size=group, selector_rank=rank, selector_top_k=topk),
        DrafterCfg("dspark", "Qwen3DSparkModel", 7, layers, "full_attention", H_i, heads, kv, hd, 4.0,
                   markov_rank=rank),
        DrafterCfg("dflash_b16", "DFlashDraftModel", 16, layers, "full_attention", H_i, heads, kv, hd, 7.0),
    ]


FULL = Sizes(
    name="full", vocab_size=8192,
    target=TargetCfg(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                     full_attention_interval=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_head_dim=64,
                     mrope_section=[3, 3, 2]),
    taps=[1, 3, 5],
    drafters=drafters_for(512, 4, 2, 64, 3, 256, 16, 16),
    seq_len=1024, batch=64, lr=2e-3, warmup=100,
    gen_prompt_len=128, gen_new=256, gen_seqs=4096, gen_batch=1024,
    d_seqs_per_step=64, d_anchors=48, d_lr=2e-3, d_warmup=50,
    eval_windows=256, eval_prompts=32, eval_prompt_len=96, eval_new=256, chat_prompt_max=192,
    reserve={"tokenizer": 20, "data": 25, "evaltarget": 10, "gen": 30, "evalspec": 30, "pack": 10},
)

SMOKE = Sizes(
    name="smoke", vocab_size=512,
    target=TargetCfg(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                     full_attention_interval=4, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_head_dim=32,
                     mrope_section=[2, 1, 1], max_position_embeddings=1024),
    taps=[1, 3, 5],
    drafters=drafters_for(128, 2, 1, 32, 2, 32, 8, 16),
    seq_len=128, batch=8, lr=3e-3, warmup=10,
    gen_prompt_len=32, gen_new=48, gen_seqs=48, gen_batch=48,
    d_seqs_per_step=8, d_anchors=8, d_lr=3e-3, d_warmup=10,
    eval_windows=8, eval_prompts=3, eval_prompt_len=32, eval_new=40, chat_prompt_max=200,
    reserve={"tokenizer": 3, "data": 5, "evaltarget": 3, "gen": 5, "evalspec": 15, "pack": 2},
)


def target_hf_config(s: Sizes, special: dict) -> dict:
    """Keyword arguments for transformers' Qwen3_5TextConfig (flat text-model config)."""
    t = s.target
    return dict(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
        linear_num_key_heads=t.linear_num_key_heads, linear_num_value_heads=t.linear_num_value_heads,
        linear_key_head_dim=t.linear_head_dim, linear_value_head_dim=t.linear_head_dim,
        linear_conv_kernel_dim=4, max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
        layer_types=["full_attention" if (i + 1) % t.full_attention_interval == 0 else "linear_attention"
                     for i in range(t.num_hidden_layers)],
        rope_parameters={"rope_type": "default", "rope_theta": t.rope_theta,
                         "partial_rotary_factor": t.partial_rotary_factor,
                         "mrope_section": list(t.mrope_section), "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=special[IM_END], pad_token_id=special[EOT],
    )


def drafter_hf_config(s: Sizes, d: DrafterCfg, special: dict) -> dict:
    """config.json of a drafter with the field names of the published checkpoints (spec §1.1,
    §3.3, §4.5): z-lab dflash_config sub-dict for DFlash / DFlash2, DeepSpec flat fields for
    DSpark."""
    H = s.target.hidden_size
    cfg = {
        "architectures": [d.arch],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "layer_types": [d.layer_type] * d.num_layers,
        "max_position_embeddings": s.target.max_position_embeddings,
        "num_target_layers": s.target.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7},
        "tie_word_embeddings": False,
        "vocab_size": s.vocab_size,
        "dtype": "bfloat16",
    }
    mask = special[MASK]
    if d.arch == "DFlashDraftModel":
        cfg["block_size"] = d.block_size
        cfg["dflash_config"] = {"block_size": d.block_size, "target_layer_ids": list(s.taps),
                                "mask_token_id": mask}
    elif d.arch == "DFlash2DraftModel":
        cfg.update(is_causal=False, sliding_window=d.sliding_window, use_sliding_window=True)
        cfg["dflash_config"] = {"block_size": d.block_size, "target_layer_ids": list(s.taps),
                                "mask_token_id": mask, "conv_kernel_size": 2,
                                "conv_group_size": d.conv_group_size, "selector_rank": d.selector_rank,
                                "selector_top_k": d.selector_top_k}
    else:
        cfg.update(block_size=d.block_size, target_layer_ids=list(s.taps), mask_token_id=mask,
                   num_anchors=512, markov_rank=d.markov_rank, markov_head_type="vanilla",
                   enable_confidence_head=True, confidence_head_with_markov=True)
    return cfg


# ---------------------------------------------------------------------------------------------
# Logging, state, time budget
# ---------------------------------------------------------------------------------------------

class Run:
    """Work directory bookkeeping: state.json (finished stages + their summaries), log.jsonl
    (every logged training step), and the time budget of this invocation."""

    def __init__(self, work: str, budget_s: float, sizes: Sizes):
        self.work = work
        self.t0 = time.time()
        self.budget_s = budget_s
        self.sizes = sizes
        os.makedirs(work, exist_ok=True)
        self.state_path = os.path.join(work, "state.json")
        self.state = {"stages": {}, "sizes": sizes.name}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state = json.load(f)
            if self.state.get("sizes") != sizes.name:
                raise SystemExit(f"{work}: holds a '{self.state.get('sizes')}' run, not '{sizes.name}'"
                                 " (use another --work)")
        self.log_f = open(os.path.join(work, "log.jsonl"), "a")

    def path(self, *p) -> str:
        return os.path.join(self.work, *p)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def done(self, stage: str) -> bool:
        return stage in self.state["stages"]

    def finish(self, stage: str, summary: dict):
        summary = dict(summary)
        summary["wall_s"] = round(summary.get("wall_s", 0.0), 2)
        self.state["stages"][stage] = summary
        self.save()
        print(f"[{self.elapsed():7.1f}s] stage {stage} done: {json.dumps(summary)[:400]}", flush=True)

    def save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1, sort_keys=True)
        os.replace(tmp, self.state_path)

    def log(self, **kw):
        kw["t"] = round(self.elapsed(), 3)
        self.log_f.write(json.dumps(kw) + "\n")
        self.log_f.flush()

    def say(self, msg: str):
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def as_dict(x):
    return asdict(x)
