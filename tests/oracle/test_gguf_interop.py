#!/usr/bin/env python3
"""test_gguf_interop.py: dspec's GGUF reader and writer against llama.cpp's own gguf-py.

(a) gguf-py writes files with every KV type (nested arrays included), alignment 32 and 64, a
    split set, and tensors of many ggml types: quantized by gguf.quants.quantize where gguf-py
    can, else random valid blocks (finite f16 scales). `dspec info` must print every KV exactly
    as rendered here from gguf.GGUFReader, list every tensor (types we cannot dequantize too),
    and `dspec tensor --out` must match gguf.quants.dequantize.
(b) models/tiny-info.gguf, written by OUR writer (src/gguf/gguf_write_test.c), must load in
    gguf.GGUFReader with the same KVs, tensor table and values that dspec reports.
(c) bad input: a missing file and a truncated file give exit code 1 and a message naming them.

Usage (CTest does this): test_gguf_interop.py --dspec BUILD/dspec --build BUILD
"""
import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

SRC = Path(__file__).resolve().parents[2]
SEED = 1234

# Our dequantizers compute in f32 like gguf-py's numpy code, but in a different order of
# operations (e.g. d*sc*q - dmin*m): allow a few f32 ulps of the tensor's largest magnitude.
REL_TOL = 1e-6

# Types DESIGN.md §2 says dtype/ supports: dspec must dequantize them.
REQUIRED = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS]
# Compared when dspec has a dequantizer, reported as skipped otherwise.
OPTIONAL = [Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K]
# Listed by `dspec info` only (no kernel expected).
LIST_ONLY = [Q.IQ2_XXS, Q.TQ1_0]

# Byte offsets of the f16 scales in one block, for types written as random blocks.
F16_SCALES = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
              Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.IQ2_XXS: [0], Q.TQ1_0: [52]}

passed = 0
failed = 0
skipped = []


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def run(dspec, *args):
    return subprocess.run([dspec, *args], capture_output=True)


# ---- rendering of KVs the way `dspec info` prints them (src/cli/cmd_info.c) ------------------

TYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
              V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "str", V.ARRAY: "arr",
              V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}


def render_str(b: bytes, limit: int) -> bytes:
    out = bytearray(b'"')
    for c in b[:limit]:
        if c in (0x22, 0x5C):
            out += b"\\" + bytes([c])
        elif c == 0x0A:
            out += b"\\n"
        elif c < 0x20 or c == 0x7F:
            out += b"\\x%02x" % c
        else:
            out.append(c)
    out += b'"...(%d bytes)' % len(b) if len(b) > limit else b'"'
    return bytes(out)


def render_scalar(t, v) -> bytes:
    if t == V.FLOAT32:
        return b"%.9g" % float(np.float32(v))
    if t == V.FLOAT64:
        return b"%.17g" % float(v)
    if t == V.BOOL:
        return b"true" if v else b"false"
    return b"%d" % int(v)


def render_field(f) -> tuple[bytes, bytes]:
    t = f.types[0]
    if t == V.STRING:
        return b"str", render_str(bytes(f.parts[-1]), 64)
    if t != V.ARRAY:
        return TYPE_NAMES[t].encode(), render_scalar(t, f.parts[-1][0])
    sub = f.types[1]
    tname = b"arr[" + TYPE_NAMES[sub].encode() + b"]"
    if sub == V.ARRAY:
        return tname, b"[%d nested arrays]" % int(f.parts[4][0])
    n = len(f.data)
    elems = []
    for j in range(min(n, 8)):
        part = f.parts[f.data[j]]
        elems.append(render_str(bytes(part), 24) if sub == V.STRING else render_scalar(sub, part[0]))
    tail = b", ...] (%d elements)" % n if n > 8 else b"]"
    return tname, b"[" + b", ".join(elems) + tail


def info_sections(out: bytes):
    """Splits `dspec info` output into {key: (type, value)} and [(name, type, shape, bytes)]."""
    kvs, tensors, section = {}, [], None
    for line in out.split(b"\n"):
        if line.startswith(b"metadata:"):
            section = "kv"
        elif line.startswith(b"tensors:"):
            section = "t"
        elif line.startswith(b"by type:"):
            section = None
        elif section == "kv" and line.startswith(b"  "):
            key, typ, val = line.strip().split(None, 2)
            kvs[key.decode()] = (typ, val)
        elif section == "t" and line.startswith(b"  ") and not line.strip().startswith(b"name "):
            m = re.match(rb"\s+(\S+)\s+(\S+)\s+\{([^}]*)\}\s+(\d+)$", line)
            if m:
                shape = [int(x) for x in m.group(3).split(b",")]
                tensors.append((m.group(1).decode(), m.group(2).decode(), shape, int(m.group(4))))
    return kvs, tensors


def ggml_name(q) -> str:
    n = q.name.lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


# ---- comparisons -------------------------------------------------------------------------------

def compare_info(dspec, path: Path, label: str):
    r = run(dspec, "info", str(path))
    check(f"{label}: dspec info exit 0", r.returncode == 0, r.stderr.decode(errors="replace"))
    if r.returncode != 0:
        return
    kvs, tensors = info_sections(r.stdout)
    reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    check(f"{label}: number of keys", len(kvs) == len(fields), f"{len(kvs)} vs {len(fields)}")
    for key, f in fields.items():
        want = render_field(f)
        got = kvs.get(key)
        check(f"{label}: key {key}", got == want, f"dspec {got!r}, gguf-py {want!r}")
    check(f"{label}: number of tensors", len(tensors) == len(reader.tensors),
          f"{len(tensors)} vs {len(reader.tensors)}")
    for (name, tname, shape, nbytes), t in zip(tensors, reader.tensors):
        want = (t.name, ggml_name(t.tensor_type), [int(x) for x in t.shape], int(t.n_bytes))
        check(f"{label}: tensor row {t.name}", (name, tname, shape, nbytes) == want,
              f"dspec {(name, tname, shape, nbytes)}, gguf-py {want}")


def compare_values(dspec, path: Path, tmp: Path, label: str):
    """dspec tensor --out vs gguf.quants.dequantize for every tensor of the file."""
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        q = Q(t.tensor_type)
        if q in LIST_ONLY:
            continue
        out = tmp / "values.f32"
        r = run(dspec, "tensor", str(path), t.name, "--out", str(out))
        if r.returncode != 0 and b"cannot be dequantized yet" in r.stderr and q in OPTIONAL:
            skipped.append(f"{label}:{t.name} ({q.name}: no dequantizer in dtype/ yet)")
            continue
        ok = r.returncode == 0
        check(f"{label}: dspec tensor {t.name}", ok, r.stderr.decode(errors="replace"))
        if not ok:
            continue
        got = np.fromfile(out, dtype=np.float32)
        want = gguf.quants.dequantize(t.data, q).astype(np.float32).reshape(-1)
        same_shape = got.shape == want.shape
        check(f"{label}: {t.name} element count", same_shape, f"{got.shape} vs {want.shape}")
        if same_shape:
            tol = REL_TOL * max(1.0, float(np.abs(want).max()))
            err = float(np.abs(got - want).max()) if want.size else 0.0
            check(f"{label}: {t.name} ({q.name}) values", err <= tol, f"max |diff| {err} > {tol}")


# ---- files written by gguf-py --------------------------------------------------------------------

def random_blocks(rng, q, n_rows, ne0) -> np.ndarray:
    bs, ts = gguf.GGML_QUANT_SIZES[q]
    raw = rng.integers(0, 256, size=(n_rows, ne0 // bs, ts), dtype=np.uint8)
    for off in F16_SCALES[q]:
        d = rng.uniform(-1, 1, size=(n_rows, ne0 // bs)).astype(np.float16)
        raw[:, :, off:off + 2] = d.view(np.uint8).reshape(n_rows, ne0 // bs, 2)
    return raw.reshape(n_rows, -1)


def add_all_kv_types(w: gguf.GGUFWriter):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 1 << 62)
    w.add_int64("t.i64", -(1 << 62))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", -2.5e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo \"quoted\"\n\ttab")
    w.add_string("t.long", "x" * 100)
    w.add_array("t.arr_i32", [11, 11, 10, 0])
    w.add_key_value("t.arr_f32", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.arr_u8", list(range(20)), V.ARRAY, sub_type=V.UINT8)
    w.add_array("t.arr_str", ["a", "", "ccc", "y" * 40] + [f"tok{i}" for i in range(10)])
    w.add_key_value("t.arr_bool", [True, False], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("t.nested", [[1, 2], [3]], V.ARRAY)
    w.add_key_value("t.nested_str", [["a"], ["b", "c"]], V.ARRAY)


def write_pygguf(path: Path, rng, alignment=None, split_max_tensors=0):
    w = gguf.GGUFWriter(path, "qwen35", split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    add_all_kv_types(w)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    for q in [Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]:
        w.add_tensor(q.name.lower(), gguf.quants.quantize(x, q), raw_dtype=q)
    for q in F16_SCALES:
        w.add_tensor("rnd_" + q.name.lower(), random_blocks(rng, q, 2, 512), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_pygguf_files(dspec, tmp: Path):
    rng = np.random.default_rng(SEED)
    for align in (None, 64):
        path = tmp / f"py_{align or 32}.gguf"
        write_pygguf(path, rng, alignment=align)
        compare_info(dspec, path, path.name)
        compare_values(dspec, path, tmp, path.name)
        r = run(dspec, "info", str(path))
        check(f"{path.name}: alignment reported", f"alignment {align or 32},".encode() in r.stdout,
              r.stdout[:200])
    # every required type appeared in the values comparison
    reader = gguf.GGUFReader(tmp / "py_32.gguf")
    have = {Q(t.tensor_type) for t in reader.tensors}
    check("all required types written", set(REQUIRED) <= have, f"missing {set(REQUIRED) - have}")


def test_split(dspec, tmp: Path):
    rng = np.random.default_rng(SEED + 1)
    write_pygguf(tmp / "sp.gguf", rng, split_max_tensors=5)
    shards = sorted(tmp.glob("sp-*-of-*.gguf"))
    check("gguf-py wrote a split set", len(shards) > 1, [s.name for s in shards])
    r = run(dspec, "info", str(shards[0]))
    check("split: dspec info exit 0", r.returncode == 0, r.stderr.decode(errors="replace"))
    _, tensors = info_sections(r.stdout)
    names = [t.name for s in shards for t in gguf.GGUFReader(s).tensors]
    check("split: all tensors of all shards listed", [t[0] for t in tensors] == names,
          f"{len(tensors)} vs {len(names)}")
    check("split: shard count", f"{len(shards)} shards".encode() in r.stdout, r.stdout[:200])
    name = names[-1]
    out = tmp / "last.f32"
    r = run(dspec, "tensor", str(shards[0]), name, "--out", str(out))
    t = [t for t in gguf.GGUFReader(shards[-1]).tensors if t.name == name][0]
    want = gguf.quants.dequantize(t.data, Q(t.tensor_type)).astype(np.float32).reshape(-1)
    ok = r.returncode == 0 and np.array_equal(np.fromfile(out, dtype=np.float32), want)
    check("split: tensor from the last shard", ok or Q(t.tensor_type) not in REQUIRED,
          r.stderr.decode(errors="replace"))
    before = shards[-1].read_bytes()  # --out naming a later shard is refused, the shard intact
    r = run(dspec, "tensor", str(shards[0]), name, "--out", str(shards[-1]))
    check("split: tensor --out onto another shard refused",
          r.returncode == 2 and shards[-1].read_bytes() == before,
          r.stderr.decode(errors="replace"))


# ---- our writer's file --------------------------------------------------------------------------

def test_tiny_info(dspec, tmp: Path):
    path = SRC / "models" / "tiny-info.gguf"
    reader = gguf.GGUFReader(path)  # raises if gguf-py cannot parse our writer's output
    check("tiny-info: < 200 KB", path.stat().st_size < 200 * 1024, path.stat().st_size)
    check("tiny-info: architecture", reader.fields["general.architecture"].contents() == "qwen35")
    for t in reader.tensors:
        check(f"tiny-info: {t.name} data aligned", t.data_offset % 32 == 0, t.data_offset)
    types = {Q(t.tensor_type) for t in reader.tensors}
    check("tiny-info: one tensor of each type", set(REQUIRED) <= types, types)
    compare_info(dspec, path, "tiny-info")
    compare_values(dspec, path, tmp, "tiny-info")


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_input(dspec, tmp: Path):
    r = run(dspec, "info", str(tmp / "missing.gguf"))
    check("missing file: exit 1", r.returncode == 1, r.returncode)
    check("missing file: message", b"missing.gguf: cannot open" in r.stderr, r.stderr)
    data = (SRC / "models" / "tiny-info.gguf").read_bytes()
    last = gguf.GGUFReader(SRC / "models" / "tiny-info.gguf").tensors[-1]
    cut = tmp / "cut.gguf"
    for n in (3, 20, 100, 1000, last.data_offset + last.n_bytes - 1):
        cut.write_bytes(data[:n])
        r = run(dspec, "info", str(cut))
        check(f"truncated to {n}: exit 1", r.returncode == 1, r.returncode)
        check(f"truncated to {n}: message names file and offset or tensor",
              b"cut.gguf" in r.stderr and (b"offset" in r.stderr or b"tensor" in r.stderr),
              r.stderr)
    r = run(dspec, "tensor", str(SRC / "models" / "tiny-info.gguf"), "nope")
    check("unknown tensor: exit 1 and message", r.returncode == 1 and b"no tensor named nope"
          in r.stderr, r.stderr)
    r = run(dspec, "info", "--help")
    check("info --help", r.returncode == 0 and b"usage: dspec info" in r.stdout, r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", default=".")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.build) as d:
        tmp = Path(d)
        for test in (test_pygguf_files, test_split, test_tiny_info, test_bad_input):
            try:
                test(args.dspec, tmp)
            except Exception as e:  # a crash of the harness counts as a failure
                check(test.__name__, False, f"{type(e).__name__}: {e}")
    for s in skipped:
        print(f"skipped {s}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
