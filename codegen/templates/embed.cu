// embed: one block per token copies its row of {{ cols }} ({{ vec }} elements a thread per
// step). The table holds vocabulary rows start..start + {{ vocab }}: the whole vocabulary
// (start 0), or with `shard` one tensor-parallel rank's part of a vocab-parallel
// lookup, whose ids outside its part write zeros, so the all_reduce after it sums exactly one
// row; `start` is an argument, not a parameter, so every rank runs the same kernel. An id no
// table holds (negative, or past the vocabulary of an unsharded one) writes NaN (loud, never a
// plausible row).
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_stride,
    const {{ table_t }}* __restrict__ table,
    const i64* __restrict__ ids, i64 rows, i64 start)
{
    grid_dependency_control();
    constexpr int D = {{ cols }}, V = {{ vec }};
    constexpr bool SHARD = {{ shard }};
    const i64 row = blockIdx.x;
    const i64 id = ids[row];
    const i64 local = id - start;
    const bool mine = local >= 0 && local < {{ vocab }};
    const float missing = SHARD && id >= 0 ? 0.f : nan_f32();
    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
        float v[V];
        if (mine) {
            ld_vec<{{ table_t }}, V>(table + local * D + c, v);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = missing;
        }
        st_vec<{{ y_t }}, V>(y + row * y_stride + c, v);
    }
}
