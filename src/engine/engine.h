// engine.h: the engine layer: implements the public API of include/dspec.h (engines = loaded
// target + tokenizer + optional drafter; sessions = one sequence: prompt -> tokens -> prefill ->
// decode or speculate -> streamed text). Calls spec/, draft/, model/, text/, sample/, backend/.
// Called by server/ and cli/. Spec: DESIGN.md §2 "engine/".
//
// Usage: see include/dspec.h (dspec_engine_new, dspec_session_new, dspec_generate).
//
// Rules: an engine is immutable after creation and shared by its sessions; a session is used by
// one thread at a time. Internal layers above (server/, cli/) may use these accessors to reach the
// tokenizer and model for things the public API does not cover yet (chat rendering, tokenize).
#pragma once

#include "dspec.h"
#include "draft/draft.h"
#include "model/model.h"
#include "text/text.h"

const ds_tok *ds_engine_tok(const dspec_engine *e);
const ds_model *ds_engine_model(const dspec_engine *e);
const ds_drafter *ds_engine_drafter(const dspec_engine *e);
const dspec_engine_params *ds_engine_params(const dspec_engine *e);
