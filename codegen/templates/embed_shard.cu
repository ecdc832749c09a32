// embed_shard: one tensor-parallel rank's part of a vocab-parallel lookup. The table holds
// vocabulary rows start..start + {{ vocab }}; one block per token copies its row of {{ cols }}
// ({{ vec }} elements a thread per step) when the id falls in that range and writes zeros
// otherwise, so the all_reduce after it sums exactly one row. `start` is an argument, not a
// parameter, so every rank runs the same kernel. A negative id writes NaN (loud, never a
// plausible row).
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_stride,
    const {{ table_t }}* __restrict__ table,
    const i64* __restrict__ ids, i64 rows, i64 start)
{
    constexpr int D = {{ cols }}, V = {{ vec }};
    const i64 row = blockIdx.x;
    const i64 id = ids[row];
    const i64 local = id - start;
    const bool mine = local >= 0 && local < {{ vocab }};
    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
        float v[V];
        if (mine) {
            ld_vec<{{ table_t }}, V>(table + local * D + c, v);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = id < 0 ? nan_f32() : 0.f;
        }
        st_vec<{{ y_t }}, V>(y + row * y_stride + c, v);
    }
}
