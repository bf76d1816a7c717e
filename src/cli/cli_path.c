// cli_path.c: output-path checks shared by the commands that write files (convert, tensor,
// logits, synth): refusing an output that is one of the command's own inputs.
#include "cli/cli.h"
#include "gguf/gguf.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static bool same(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

// Whether name ends with suffix.
static bool ends_with(const char *name, const char *suffix) {
    const size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

bool ds_cli_clobbers(const char *out, const char *in) {
    struct stat so, si;
    if (stat(out, &so) != 0 || stat(in, &si) != 0) {
        return false;
    }
    if (same(&so, &si)) {
        return true;
    }
    if (!S_ISDIR(si.st_mode)) {
        return false;
    }
    DIR *d = opendir(in);
    if (!d) {
        return false;
    }
    bool hit = false;
    for (struct dirent *e; !hit && (e = readdir(d));) {
        // what the converter reads: weights, configs, tokenizer files (an earlier .gguf written
        // into the model directory may be written again)
        const char *nm = e->d_name;
        if (!ends_with(nm, ".safetensors") && !ends_with(nm, ".json") &&
            !ends_with(nm, ".txt") && !ends_with(nm, ".model") && !ends_with(nm, ".tiktoken")) {
            continue;
        }
        char p[4096];
        struct stat sf;
        if (snprintf(p, sizeof(p), "%s/%s", in, nm) < (int)sizeof(p) && stat(p, &sf) == 0 &&
            S_ISREG(sf.st_mode)) {
            hit = same(&so, &sf);
        }
    }
    closedir(d);
    return hit;
}

bool ds_cli_clobbers_gguf(const char *out, const char *in) {
    struct stat so;
    if (stat(out, &so) != 0) { // (nothing there to overwrite: no need to open the input)
        return false;
    }
    if (ds_cli_clobbers(out, in)) {
        return true;
    }
    // the later shards of a split set are inputs too (loading maps them all)
    ds_gguf *g = NULL;
    dspec_err err;
    if (ds_gguf_open(&g, in, &err) != DSPEC_OK) {
        return false;
    }
    bool hit = false;
    for (int k = 1; !hit && k < ds_gguf_n_shards(g); k++) {
        hit = ds_cli_clobbers(out, ds_gguf_shard_path(g, k));
    }
    ds_gguf_close(g);
    return hit;
}
