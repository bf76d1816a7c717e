#!/usr/bin/env python3
"""libdspec as an embedder gets it: `cmake --install` of the build into a temporary prefix gives
the header, libdspec.so and dspec.pc; the shared library exports the dspec_* API and nothing
else (an embedder that defines its own ds_time_now links and runs); examples/embed.c, built with
`pkg-config --cflags --libs dspec` and -Werror, generates the same text as `dspec run` with the
bundled tiny target, plain and with a drafter; the header compiles as C99 and as C++."""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail else ''}", flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)
    return ok


def run(cmd, env=None, timeout=120):
    r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspec", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    tiny = os.path.join(root, "models", "tiny-target-q8_0.gguf")
    draft = os.path.join(root, "models", "tiny-dspark-g7-q8_0.gguf")
    cc = shutil.which("cc") or shutil.which("gcc")
    cxx = shutil.which("c++") or shutil.which("g++")
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        rc, out, err = run(["cmake", "--install", a.build, "--prefix", prefix])
        check("cmake --install", rc == 0, err[-300:])
        libs = glob.glob(os.path.join(prefix, "**", "libdspec.so"), recursive=True)
        pcs = glob.glob(os.path.join(prefix, "**", "pkgconfig", "dspec.pc"), recursive=True)
        hdr = os.path.join(prefix, "include", "dspec.h")
        if not check("installed: libdspec.so, dspec.pc, dspec.h, bin/dspec",
                     len(libs) == 1 and len(pcs) == 1 and os.path.exists(hdr) and
                     os.path.exists(os.path.join(prefix, "bin", "dspec")), f"{libs} {pcs}"):
            print(f"{passed} passed, {failed} failed")
            return 1
        libdir = os.path.dirname(libs[0])
        rc, out, _ = run(["nm", "-D", "--defined-only", libs[0]])
        names = [line.split()[-1] for line in out.splitlines() if line.strip()]
        api = sorted(n for n in names if n.startswith("dspec_"))
        check("libdspec.so exports the dspec_* API only", rc == 0 and len(api) >= 10 and
              len(api) == len(names), [n for n in names if not n.startswith("dspec_")][:8])
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
        rc, flags, err = run(["pkg-config", "--cflags", "--libs", "dspec"], env=env)
        check("pkg-config --cflags --libs dspec", rc == 0 and "-ldspec" in flags, err[-200:])
        # an embedder's own function named like an internal one of the engine
        clash = os.path.join(tmp, "clash.c")
        with open(clash, "w") as f:
            f.write("double ds_time_now(void);\ndouble ds_time_now(void) { return -1.0; }\n")
        exe = os.path.join(tmp, "embed")
        rc, _, err = run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror",
                          os.path.join(root, "examples", "embed.c"), clash, "-o", exe,
                          *flags.split()])
        check("examples/embed.c builds against the installed library (-Werror, a ds_time_now "
              "of its own)", rc == 0, err[-400:])
        if cxx:
            cpp = os.path.join(tmp, "h.cpp")
            with open(cpp, "w") as f:
                f.write("#include <dspec.h>\nint main() { return dspec_version() ? 0 : 1; }\n")
            rc, _, err = run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", cpp, "-o",
                              cpp + ".out", *flags.split()])
            check("dspec.h builds and links in C++11", rc == 0, err[-300:])
        renv = dict(os.environ, LD_LIBRARY_PATH=libdir)
        prompt = "def main():\n"
        _, want, _ = run([a.dspec, "run", "-m", tiny, "-p", prompt, "-n", "24", "-t", "2"])
        for label, extra in (("plain", []), ("with the DSpark drafter", [draft])):
            rc, got, err = run([exe, tiny, prompt, "24", *extra], env=renv)
            check(f"embed {label}: the text of dspec run", rc == 0 and got.strip() and
                  got.strip() == want.strip(), f"rc {rc}: {got!r} vs {want!r} {err[-300:]}")
            if extra:
                check("embed with a drafter: speculative steps ran",
                      "speculative steps 0" not in err and "tau" in err, err[-200:])
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 (a timeout or a missing tool: named, not a traceback)
        check("test_embed ran to the end", False, repr(e)[:400])
        print(f"{passed} passed, {failed} failed")
        sys.exit(1)
