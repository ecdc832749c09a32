// embed: one block per token copies its row of {{ cols }} ({{ vec }} elements a
// thread per step). An id outside the vocabulary of {{ vocab }} writes NaN (loud, never a
// plausible row).
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_stride,
    const {{ table_t }}* __restrict__ table,
    const i64* __restrict__ ids, i64 rows)
{
    constexpr int D = {{ cols }}, V = {{ vec }};
    const i64 row = blockIdx.x;
    const i64 id = ids[row];
    const bool ok = id >= 0 && id < {{ vocab }};
    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
        float v[V];
        if (ok) {
            ld_vec<{{ table_t }}, V>(table + id * D + c, v);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = nan_f32();
        }
        st_vec<{{ y_t }}, V>(y + row * y_stride + c, v);
    }
}
