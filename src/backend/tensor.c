// tensor.c: ds_tensor view helpers and the step wrapper shared by every backend. Calls dtype/.
// Called by model/, draft/.
#include "backend/backend.h"

static ds_tensor tensor_make(void *data, ds_type type, int64_t ne0, int64_t ne1, int64_t ne2) {
    const ds_type_traits *tt = ds_type_traits_get(type);
    DS_ASSERT(tt != NULL && ne0 % tt->block_elems == 0);
    ds_tensor t = {.data = data, .type = type, .ne = {ne0, ne1, ne2, 1}};
    t.nb[0] = tt->block_bytes;
    t.nb[1] = ds_type_row_size(type, ne0);
    t.nb[2] = t.nb[1] * (size_t)ne1;
    t.nb[3] = t.nb[2] * (size_t)ne2;
    return t;
}

ds_tensor ds_tensor_1d(void *data, ds_type type, int64_t ne0) {
    return tensor_make(data, type, ne0, 1, 1);
}

ds_tensor ds_tensor_2d(void *data, ds_type type, int64_t ne0, int64_t ne1) {
    return tensor_make(data, type, ne0, ne1, 1);
}

ds_tensor ds_tensor_3d(void *data, ds_type type, int64_t ne0, int64_t ne1, int64_t ne2) {
    return tensor_make(data, type, ne0, ne1, ne2);
}

int64_t ds_tensor_nelements(const ds_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

size_t ds_tensor_nbytes(const ds_tensor *t) {
    return ds_type_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

bool ds_tensor_is_contiguous(const ds_tensor *t) {
    size_t row = ds_type_row_size(t->type, t->ne[0]);
    return t->nb[1] == row && t->nb[2] == row * (size_t)t->ne[1] &&
           t->nb[3] == t->nb[2] * (size_t)t->ne[2];
}

ds_tensor ds_tensor_rows(const ds_tensor *t, int64_t r0, int64_t n) {
    DS_ASSERT(r0 >= 0 && r0 + n <= t->ne[1] && t->ne[2] == 1 && t->ne[3] == 1);
    ds_tensor v = *t;
    v.data = (uint8_t *)t->data + (size_t)r0 * t->nb[1];
    v.ne[1] = n;
    v.nb[2] = v.nb[1] * (size_t)n;
    v.nb[3] = v.nb[2];
    return v;
}

void ds_backend_free(ds_backend *be) {
    if (be) {
        be->ops.destroy(be);
    }
}

void ds_backend_matmul_multi(ds_backend *be, int n, ds_tensor *const *y, const ds_tensor *const *w,
                             const ds_tensor *x) {
    if (be->ops.matmul_multi) {
        be->ops.matmul_multi(be, n, y, w, x);
        return;
    }
    for (int i = 0; i < n; i++) be->ops.matmul(be, y[i], w[i], x);
}

void ds_backend_ffn_swiglu(ds_backend *be, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                           const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                           const ds_tensor *x) {
    if (be->ops.ffn_swiglu && be->ops.ffn_swiglu(be, out, g, u, wg, wu, wd, x)) return;
    ds_tensor *y[2] = {g, u};
    const ds_tensor *w[2] = {wg, wu};
    ds_backend_matmul_multi(be, 2, y, w, x);
    be->ops.swiglu(be, g, g, u);
    be->ops.matmul(be, out, wd, g);
}

void ds_backend_add_rmsnorm(ds_backend *be, ds_tensor *y, ds_tensor *xo, const ds_tensor *x,
                            const ds_tensor *b, const ds_tensor *w, float eps) {
    if (be->ops.add_rmsnorm) {
        be->ops.add_rmsnorm(be, y, xo, x, b, w, eps);
        return;
    }
    be->ops.add(be, xo, x, b);
    be->ops.rmsnorm(be, y, xo, w, eps);
}

void ds_backend_step(ds_backend *be, uint64_t key, int64_t kv_len, void (*run)(void *arg),
                     void *arg) {
    if (!be->ops.step_begin) {
        run(arg);
        return;
    }
    be->ops.step_begin(be, key, kv_len);
    run(arg);
    if (!be->ops.step_end(be)) run(arg); // not run: run it eagerly
}
