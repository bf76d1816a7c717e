#!/usr/bin/env python3
"""make_corpus.py: the text bundle the tiny model family is trained on (issue #6, DESIGN.md §8).

Collects code and prose from THIS machine's Debian packages, builds a chat-style "mixed" domain
from them, splits every domain into train / held-out by a hash of the source path, and writes
compressed JSON Lines into an ignored folder (default `.tinydata/`, which must be listed in
.git/info/exclude: the corpus is never committed). The bundle is then carried to the device
machine, where tools/tinymodel/pipeline.py trains on it.

Domains and sources (byte caps per source keep the bundle under ~35 MB compressed):
  code   Python sources (/usr/lib/python3.*, /usr/lib/python3/dist-packages), C headers
         (/usr/include, a deterministic sample), shell scripts (/usr/bin, /usr/sbin, /usr/share,
         by shebang), CMake modules.
  prose  man pages (English sections 1-8, troff markup stripped by our own small renderer), GNU
         info manuals, package documentation under /usr/share/doc (README, NEWS, *.txt, *.md,
         *.rst, HTML with tags stripped; changelogs and copyright files are left out).
  chat   conversations built from the sources above and rendered later with the ChatML template:
         "write a function that <docstring summary>" -> the function's code, "what does this
         function do?" + code -> its docstring, "what is the <cmd> command for?" -> the man
         page's NAME and first DESCRIPTION paragraph. Messages are stored, not rendered text.

Held-out split: sha1(source path) mod 100 < HELDOUT_PCT -> held-out, so no file (and no chat
conversation built from a held-out file) is in both splits. Exact-duplicate files are dropped.

Deterministic: sorted directory walks, a fixed seed for every random choice, no timestamps in
the output. Output (all under --out):
  code.train.jsonl.xz  code.heldout.jsonl.xz    {"src": path, "text": ...} per line
  prose.train.jsonl.xz prose.heldout.jsonl.xz   same
  chat.train.jsonl.xz  chat.heldout.jsonl.xz    {"src": path, "messages": [{"role", "content"}]}
  manifest.json                                 counts, bytes, sha256 of every file

Usage: python3 tools/tinymodel/make_corpus.py [--out .tinydata] [--scale 1.0] [--smoke]
  --scale multiplies every byte cap (0.05 gives a ~2 MB bundle for quick tests);
  --smoke = --scale 0.02, for the CPU smoke run of the pipeline.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import html
import io
import json
import lzma
import os
import random
import re
import sys
import textwrap
from pathlib import Path

SEED = 20260601
HELDOUT_PCT = 2
MAX_FILE_BYTES = 400_000

# Byte caps per source, at --scale 1.0 (raw UTF-8 text).
CAPS = {
    "python": 34_000_000,
    "c": 24_000_000,
    "shell": 3_000_000,
    "cmake": 2_000_000,
    "man": 30_000_000,
    "info": 8_000_000,
    "doc": 22_000_000,
    "chat": 18_000_000,
}

SYSTEM_CODE = [None, "You are a helpful assistant.", "You are a concise programming assistant.",
               "You are an expert Python programmer.", "Answer briefly and precisely."]
SYSTEM_CLI = [None, "You are a helpful assistant.", "You are an expert on Linux command-line tools.",
              "Answer briefly and precisely."]


def heldout_hash(path: str) -> int:
    return int(hashlib.sha256(path.encode()).hexdigest(), 16)


def heldout(path: str) -> bool:
    return heldout_hash(path) % 100 < HELDOUT_PCT


def sorted_walk(root: str):
    """All regular files under root, symlinks not followed, in a fixed pseudo-random order (by a
    hash of the path), so that a byte cap samples the whole tree rather than its first folders."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    out.sort(key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    return out


def read_text(path: str, max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """UTF-8 text of a (possibly .gz) file, or None if too big, binary or not UTF-8."""
    try:
        if os.path.getsize(path) > max_bytes * (4 if path.endswith(".gz") else 1):
            return None
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        if len(data) > max_bytes or b"\0" in data:
            return None
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, lzma.LZMAError):
        return None


def looks_generated(text: str) -> bool:
    """Minified / data-like files: very long lines or very few line breaks."""
    lines = text.split("\n")
    if not lines:
        return True
    if max(len(l) for l in lines) > 1000:
        return True
    return len(text) / max(1, len(lines)) > 160


def normalize(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip("\n") + "\n"


class Collector:
    """Deduplicates by content, enforces the byte cap of a source, splits train / held-out."""

    def __init__(self, scale: float):
        self.scale = scale
        self.seen: set[str] = set()
        self.docs = {"code": {"train": [], "heldout": []}, "prose": {"train": [], "heldout": []},
                     "chat": {"train": [], "heldout": []}}
        self.bytes = {k: 0 for k in CAPS}

    def cap(self, source: str) -> int:
        return int(CAPS[source] * self.scale)

    def full(self, source: str) -> bool:
        return self.bytes[source] >= self.cap(source)

    def add(self, domain: str, source: str, path: str, text: str) -> bool:
        if self.full(source):
            return False
        h = hashlib.sha1(text.encode()).hexdigest()
        if h in self.seen:
            return False
        self.seen.add(h)
        split = "heldout" if heldout(path) else "train"
        self.docs[domain][split].append({"src": path, "text": text})
        self.bytes[source] += len(text.encode())
        return True

    def add_chat(self, path: str, messages: list[dict]) -> bool:
        if self.full("chat"):
            return False
        key = hashlib.sha1(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        if key in self.seen:
            return False
        self.seen.add(key)
        split = "heldout" if heldout(path) else "train"
        self.docs["chat"][split].append({"src": path, "messages": messages})
        self.bytes["chat"] += sum(len(m["content"].encode()) for m in messages)
        return True


# ---- code ----------------------------------------------------------------------------------------

def python_roots():
    roots = []
    for d in sorted(os.listdir("/usr/lib")):
        if re.fullmatch(r"python3(\.\d+)?", d):
            roots.append(os.path.join("/usr/lib", d))
    return roots


def collect_python(col: Collector, files_out: list):
    for root in python_roots():
        for p in sorted_walk(root):
            if not p.endswith(".py") or "/__pycache__/" in p:
                continue
            t = read_text(p)
            if t is None or len(t) < 200 or looks_generated(t):
                continue
            t = normalize(t)
            if col.add("code", "python", p, t):
                files_out.append((p, t))
            if col.full("python"):
                return


def collect_c(col: Collector):
    files = [p for p in sorted_walk("/usr/include") if p.endswith((".h", ".hpp", ".hh"))]
    rng = random.Random(SEED + 1)
    rng.shuffle(files)
    for p in files:
        t = read_text(p)
        if t is None or len(t) < 300 or looks_generated(t):
            continue
        col.add("code", "c", p, normalize(t))
        if col.full("c"):
            return


def collect_shell(col: Collector):
    for root in ("/usr/bin", "/usr/sbin", "/usr/share", "/usr/lib/git-core"):
        if not os.path.isdir(root):
            continue
        for p in sorted_walk(root):
            if p.startswith("/usr/share/doc") or p.startswith("/usr/share/man"):
                continue
            try:
                with open(p, "rb") as f:
                    head = f.read(64)
            except OSError:
                continue
            if not re.match(rb"#!\s*/(usr/)?bin/(env\s+)?(ba|da|k|z)?sh\b", head):
                continue
            t = read_text(p)
            if t is None or len(t) < 300 or looks_generated(t):
                continue
            col.add("code", "shell", p, normalize(t))
            if col.full("shell"):
                return


def collect_cmake(col: Collector):
    for d in sorted(os.listdir("/usr/share")):
        if not d.startswith("cmake"):
            continue
        for p in sorted_walk(os.path.join("/usr/share", d)):
            if not p.endswith(".cmake"):
                continue
            t = read_text(p)
            if t is None or len(t) < 300 or looks_generated(t):
                continue
            col.add("code", "cmake", p, normalize(t))
            if col.full("cmake"):
                return


# ---- prose: man pages ------------------------------------------------------------------------------

_MAN_CHARS = {
    "em": "--", "en": "-", "aq": "'", "dq": '"', "bu": "*", "co": "(c)", "rg": "(R)", "hy": "-",
    "lq": '"', "rq": '"', "oq": "'", "cq": "'", "ti": "~", "ha": "^", "rs": "\\", "mi": "-",
    "pl": "+", "eq": "=", "<=": "<=", ">=": ">=", "->": "->", "<-": "<-", "mu": "x", "de": " deg",
    "tm": "(TM)", "ga": "`", "aa": "'", "sl": "/", "ba": "|", "br": "|", "or": "|", "lh": "<=",
    "rh": "=>", "Fo": "<<", "Fc": ">>", "fo": "<", "fc": ">", "ss": "ss", "fm": "'", "sd": '"',
}


def _man_escapes(s: str) -> str:
    s = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", s)          # font changes
    s = re.sub(r"\\s[+-]?\d", "", s)                       # size changes
    s = re.sub(r"\\\*\((..)", lambda m: _MAN_CHARS.get(m.group(1), ""), s)
    s = re.sub(r"\\\*\[([^\]]*)\]", lambda m: _MAN_CHARS.get(m.group(1), ""), s)
    s = re.sub(r"\\\*.", "", s)
    s = re.sub(r"\\\((..)", lambda m: _MAN_CHARS.get(m.group(1), ""), s)
    s = re.sub(r"\\\[([^\]]*)\]", lambda m: _MAN_CHARS.get(m.group(1), ""), s)
    s = re.sub(r"\\[nmgkVY]\(..|\\[nmgkVY]\[[^\]]*\]|\\[nmgkVY].", "", s)
    s = re.sub(r"\\[hvwlLDxXoNbZ]'[^']*'", "", s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "").replace("\\ ", " ")
    s = s.replace("\\~", " ").replace("\\0", " ").replace("\\|", "").replace("\\^", "")
    s = s.replace("\\%", "").replace("\\c", "").replace("\\,", "").replace("\\/", "")
    s = s.replace("\\:", "").replace("\\)", "").replace("\\'", "'").replace("\\`", "`")
    s = s.replace('\\"', "")
    s = re.sub(r"\\(.)", r"\1", s)
    return s


def _macro_args(rest: str) -> list[str]:
    out, cur, q, i = [], "", False, 0
    while i < len(rest):
        c = rest[i]
        if c == '"':
            if q and i + 1 < len(rest) and rest[i + 1] == '"':
                cur += '"'
                i += 2
                continue
            q = not q
        elif c in " \t" and not q:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def render_man(src: str) -> tuple[str, str, str] | None:
    """troff man source -> (plain text, NAME line, first DESCRIPTION paragraph), or None."""
    lines = []
    skip_def = False
    section = ""
    name_line, desc_par = "", ""
    desc_acc: list[str] = []
    for raw in src.split("\n"):
        if skip_def:
            if raw.startswith(".."):
                skip_def = False
            continue
        if raw.startswith(('.\\"', "'\\\"", '.\\}', "'.\\\"")) or raw.strip() in (".", "'"):
            continue
        if raw.startswith((".", "'")):
            m = re.match(r"[.']\s*(\S+)\s*(.*)", raw)
            if not m:
                continue
            mac, rest = m.group(1), m.group(2)
            if mac in ("de", "de1", "am", "ig"):
                skip_def = True
                continue
            if mac in ("SH", "SS"):
                title = _man_escapes(" ".join(_macro_args(rest))).strip()
                lines += ["", title.upper() if mac == "SH" else title]
                if mac == "SH":
                    if section == "DESCRIPTION" and desc_acc and not desc_par:
                        desc_par = " ".join(desc_acc)
                    section = title.upper()
                continue
            if mac in ("PP", "LP", "P", "sp", "br", "HP"):
                lines.append("")
                if section == "DESCRIPTION" and desc_acc and not desc_par:
                    desc_par = " ".join(desc_acc)
                continue
            if mac in ("TP", "IP", "TQ"):
                lines.append("")
                args = _macro_args(rest)
                if mac == "IP" and args:
                    lines.append(_man_escapes(args[0]))
                continue
            if mac in ("B", "I", "SM", "SB"):
                t = _man_escapes(" ".join(_macro_args(rest)))
            elif mac in ("BR", "RB", "BI", "IB", "IR", "RI"):
                t = _man_escapes("".join(_macro_args(rest)))
            elif mac in ("UR", "MT"):
                t = _man_escapes(rest)
            elif mac in ("Nm", "Nd", "Op", "Ar", "Fl", "Pa", "Xr", "Dq", "Sq", "Em", "Sy", "Cm"):
                t = _man_escapes(rest)      # mdoc: keep the words
            elif mac == "Sh":
                title = _man_escapes(rest).strip().upper()
                lines += ["", title]
                section = title
                continue
            elif mac == "Pp":
                lines.append("")
                continue
            else:
                continue
            if t.strip():
                lines.append(t)
                if section == "NAME" and not name_line:
                    name_line = t.strip()
                if section == "DESCRIPTION":
                    desc_acc.append(t.strip())
            continue
        t = _man_escapes(raw)
        lines.append(t)
        if section == "NAME":
            name_line = (name_line + " " + t.strip()).strip()
        if section == "DESCRIPTION" and t.strip():
            desc_acc.append(t.strip())
    if desc_acc and not desc_par:
        desc_par = " ".join(desc_acc)
    text = "\n".join(l.rstrip() for l in lines)
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    if len(text) < 200:
        return None
    return text + "\n", name_line, desc_par


def collect_man(col: Collector, man_out: list):
    for sec in range(1, 9):
        root = f"/usr/share/man/man{sec}"
        if not os.path.isdir(root):
            continue
        for p in sorted_walk(root):
            # google-cloud-cli ships ~16,000 near-identical gcloud_* pages: keep one in 20.
            if os.path.basename(p).startswith("gcloud") and heldout_hash(p) % 20:
                continue
            src = read_text(p)
            if src is None or src.startswith(".so "):
                continue
            r = render_man(src)
            if r is None:
                continue
            text, name_line, desc = r
            if col.add("prose", "man", p, text):
                man_out.append((p, text, name_line, desc))
            if col.full("man"):
                return


def collect_info(col: Collector):
    root = "/usr/share/info"
    if not os.path.isdir(root):
        return
    for p in sorted_walk(root):
        if ".info" not in p:
            continue
        t = read_text(p, max_bytes=8_000_000)
        if t is None:
            continue
        t = t.replace("\x1f", "")
        t = re.sub(r"^File: .*?Node: .*$", "", t, flags=re.M)
        t = re.sub(r"\x00\x08\[[^\]]*\x00\x08\]", "", t)
        for i, part in enumerate(re.split(r"\n(?=\d+(?:\.\d+)* [A-Z][^\n]*\n[=*\-.]{4,}\n)", t)):
            if part and len(part) > 400:
                col.add("prose", "info", f"{p}#{i}", normalize(part))
        if col.full("info"):
            return


_DOC_NAME = re.compile(r"(readme|news|faq|todo|authors|thanks|usage|howto|manual|guide|intro)"
                       r"|\.(txt|md|rst|html?)(\.gz)?$", re.I)


def strip_html(t: str) -> str:
    t = re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", "", t)
    t = re.sub(r"(?i)<br\s*/?>|</p>|</h\d>|</li>|</div>|</tr>", "\n", t)
    t = re.sub(r"(?s)<[^>]*>", "", t)
    t = html.unescape(t)
    t = re.sub(r"[ \t]+\n", "\n", t)
    return t


def collect_doc(col: Collector):
    for p in sorted_walk("/usr/share/doc"):
        base = os.path.basename(p).lower()
        if "changelog" in base or base.startswith("copyright") or ".debian" in base:
            continue
        if not _DOC_NAME.search(base):
            continue
        t = read_text(p)
        if t is None:
            continue
        if re.search(r"\.html?(\.gz)?$", base):
            t = strip_html(t)
        if len(t) < 400 or looks_generated(t):
            continue
        col.add("prose", "doc", p, normalize(t))
        if col.full("doc"):
            return


# ---- chat (mixed) ----------------------------------------------------------------------------------

def first_sentence(doc: str) -> str:
    par = doc.strip().split("\n\n")[0]
    par = " ".join(par.split())
    m = re.match(r"(.+?[.!?])(\s|$)", par)
    s = m.group(1) if m else par
    return s


def python_chats(path: str, text: str, rng: random.Random):
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    lines = text.split("\n")
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40 or node.name.startswith("__"):
            continue
        start = node.lineno - 1 - len(node.decorator_list)
        end = getattr(node, "end_lineno", None)
        if end is None or end - start > 60:
            continue
        src = textwrap.dedent("\n".join(lines[start:end]))
        if len(src) > 3000:
            continue
        summary = first_sentence(doc)
        if not (15 <= len(summary) <= 300):
            continue
        args = ", ".join(a.arg for a in node.args.args)
        system = rng.choice(SYSTEM_CODE)
        kind = rng.random()
        if kind < 0.5:
            user = rng.choice([
                f"Write a Python function `{node.name}({args})`. {summary}",
                f"Implement `{node.name}` in Python. It should do this: {summary}",
                f"Can you write a Python function named {node.name} with parameters ({args})? {summary}",
            ])
            answer = f"```python\n{src}\n```"
        else:
            body = src
            ds = node.body[0]
            if isinstance(ds, ast.Expr) and hasattr(ds, "end_lineno"):
                drop = set(range(ds.lineno - 1 - start, ds.end_lineno - start))
                body = "\n".join(l for i, l in enumerate(src.split("\n")) if i not in drop)
            if body.count("\n") < 2:
                continue
            user = rng.choice([
                f"What does this function do?\n\n```python\n{body}\n```",
                f"Explain this Python code:\n```python\n{body}\n```",
            ])
            answer = "\n".join(l.rstrip() for l in doc.strip().split("\n"))
        msgs = ([{"role": "system", "content": system}] if system else [])
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        out.append(msgs)
    return out


def man_chat(path: str, name_line: str, desc: str, rng: random.Random):
    m = re.match(r"([\w.+\-]+)(?:\s*,\s*[\w.+\-]+)*\s+-+\s+(.*)", name_line)
    if not m or not desc or len(desc) < 40:
        return None
    cmd, what = m.group(1), m.group(2).strip()
    desc = desc if len(desc) < 1200 else desc[:1200].rsplit(". ", 1)[0] + "."
    system = rng.choice(SYSTEM_CLI)
    user = rng.choice([f"What is the `{cmd}` command for?", f"What does {cmd} do?",
                       f"Explain {cmd} briefly."])
    answer = f"`{cmd}`: {what}.\n\n{desc}"
    msgs = ([{"role": "system", "content": system}] if system else [])
    return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def collect_chat(col: Collector, py_files: list, man_pages: list):
    rng = random.Random(SEED + 2)
    items = []
    for path, text in py_files:
        for msgs in python_chats(path, text, rng):
            items.append((path, msgs))
    for path, _, name_line, desc in man_pages:
        msgs = man_chat(path, name_line, desc, rng)
        if msgs:
            items.append((path, msgs))
    rng.shuffle(items)
    for path, msgs in items:
        col.add_chat(path, msgs)
        if col.full("chat"):
            break


# ---- output ------------------------------------------------------------------------------------

def write_jsonl_xz(path: Path, rows: list) -> dict:
    buf = io.BytesIO()
    for r in rows:
        buf.write(json.dumps(r, ensure_ascii=False).encode())
        buf.write(b"\n")
    raw = buf.getvalue()
    data = lzma.compress(raw, preset=6)
    path.write_bytes(data)
    return {"docs": len(rows), "raw_bytes": len(raw), "xz_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".tinydata")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--heldout-pct", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="--scale 0.02 --heldout-pct 10")
    a = ap.parse_args(argv)
    global HELDOUT_PCT
    HELDOUT_PCT = 10 if a.smoke else a.heldout_pct
    scale = 0.02 if a.smoke else a.scale
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    col = Collector(scale)
    py_files, man_pages = [], []
    steps = [("python", lambda: collect_python(col, py_files)), ("c", lambda: collect_c(col)),
             ("shell", lambda: collect_shell(col)), ("cmake", lambda: collect_cmake(col)),
             ("man", lambda: collect_man(col, man_pages)), ("info", lambda: collect_info(col)),
             ("doc", lambda: collect_doc(col)), ("chat", lambda: collect_chat(col, py_files, man_pages))]
    for name, fn in steps:
        fn()
        print(f"  {name:7s} {col.bytes[name] / 1e6:8.2f} MB (cap {col.cap(name) / 1e6:.2f})", flush=True)
    manifest = {"seed": SEED, "heldout_pct": HELDOUT_PCT, "scale": scale,
                "source_bytes": col.bytes, "files": {}}
    total = 0
    for domain, splits in col.docs.items():
        for split, rows in splits.items():
            name = f"{domain}.{split}.jsonl.xz"
            info = write_jsonl_xz(out / name, rows)
            manifest["files"][name] = info
            total += info["xz_bytes"]
            print(f"  {name:24s} {info['docs']:7d} docs {info['raw_bytes'] / 1e6:8.2f} MB raw "
                  f"{info['xz_bytes'] / 1e6:7.2f} MB xz", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}/ ({total / 1e6:.2f} MB compressed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
