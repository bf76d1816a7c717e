// draft_config_fuzz.c: libFuzzer target for the drafter config.json parser (draft_config.h): any
// byte string that is a JSON object either parses (and then every field is within the documented
// ranges) or is refused with a status and a message; never a crash, leak or UB. Not built by
// CMake (it needs clang). Build and run from the repository root:
//
//   CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDSPEC_CUDA=OFF \
//       -DDSPEC_SANITIZE=address,undefined,fuzzer-no-link
//   cmake --build build-fuzz --target ds_draft
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
//       src/draft/draft_config_fuzz.c build-fuzz/libds_draft.a build-fuzz/libds_model.a \
//       build-fuzz/libds_backend.a build-fuzz/libds_gguf.a build-fuzz/libds_dtype.a \
//       build-fuzz/libds_core.a -ljansson -lm -lpthread -o build-fuzz/draft_config_fuzz
//   mkdir -p build-fuzz/cfg_corpus && cp tests/fixtures/drafter/*/config.json build-fuzz/cfg_corpus/
//   build-fuzz/draft_config_fuzz -max_total_time=300 build-fuzz/cfg_corpus
#include "draft/draft_config.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *top = json_loadb((const char *)data, size, 0, &jerr);
    if (!top) return 0;
    ds_draft_hf_config c;
    dspec_err err = {0};
    if (json_is_object(top) && ds_draft_hf_config_parse(&c, top, "fuzz", &err) == DSPEC_OK) {
        // the documented ranges hold for anything accepted
        if (c.n_layer < 1 || c.n_layer > DS_DRAFT_HF_MAX_LAYERS || c.n_head < 1 ||
            c.n_head_kv < 1 || c.n_head % c.n_head_kv != 0 || c.n_taps < 1 ||
            c.n_taps > DS_MODEL_MAX_TAPS || c.mask_id < 0 || c.mask_id >= c.n_vocab ||
            c.block_size < 2) {
            abort();
        }
        for (int i = 1; i < c.n_taps; i++) {
            if (c.taps[i] <= c.taps[i - 1]) abort();
        }
    }
    json_decref(top);
    return 0;
}
