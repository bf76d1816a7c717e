// cli_path.c: output-path checks shared by the commands that write files (convert, tensor):
// refusing an output that is one of the command's own inputs.
#include "cli/cli.h"

#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>

static bool same(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

bool ds_cli_clobbers(const char *out, const char *in) {
    struct stat so, si;
    if (stat(out, &so) != 0 || stat(in, &si) != 0) return false;
    if (same(&so, &si)) return true;
    if (!S_ISDIR(si.st_mode)) return false;
    DIR *d = opendir(in);
    if (!d) return false;
    bool hit = false;
    for (struct dirent *e; !hit && (e = readdir(d));) {
        char p[4096];
        struct stat sf;
        if (snprintf(p, sizeof(p), "%s/%s", in, e->d_name) < (int)sizeof(p) &&
            stat(p, &sf) == 0 && S_ISREG(sf.st_mode)) {
            hit = same(&so, &sf);
        }
    }
    closedir(d);
    return hit;
}
