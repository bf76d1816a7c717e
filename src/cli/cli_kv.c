// cli_kv.c: the --kv-type option that run, serve, logits and bench --model share.
#include "cli/cli.h"

#include <string.h>

bool ds_cli_kv_type(const char *s, ds_type *t) {
    if (!s) return false;
    if (!strcmp(s, "f16")) *t = DS_TYPE_F16;
    else if (!strcmp(s, "f32")) *t = DS_TYPE_F32;
    else if (!strcmp(s, "q8_0")) *t = DS_TYPE_Q8_0;
    else return false;
    return true;
}

bool ds_cli_kv_params(const char *s, dspec_engine_params *ep) {
    ds_type t;
    if (!ds_cli_kv_type(s, &t)) return false;
    ep->kv_f16 = t == DS_TYPE_F16;
    ep->kv_q8_0 = t == DS_TYPE_Q8_0;
    return true;
}
