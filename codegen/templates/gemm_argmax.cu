// {{ name }}: {{ op }}, the {{ stage }} launch of three. `matmul.argmax` (lm_head fused with the
// greedy argmax) runs as
//   1. init: best[r] = 0 for every row (one 64-bit slot per row, in the node's scratch, which
//      other steps reuse, so it is cleared every time);
//   2. the skinny GEMM (bf16, gemm_skinny.cu) or the GEMV (f32, gemv.cu) with the argmax
//      epilogue: the logits are computed exactly as the unfused kernel computes them, same
//      sums in the same order, rounded to the dtype it would store; each block folds its
//      columns of a row into the largest key (argmax_key in gemm_head.cuh) with shared-memory
//      atomicMax, then into best[r] with one global atomicMax per row;
//   3. finish: out[r] = the column in best[r]'s low half, or -1 where best[r] is still 0.
// Why this is `sample.argmax` of the unfused logits: a key is (logit's f32 bits made
// unsigned-ordered) << 32 | ~column, so comparing keys compares logits first and, between equal
// logits, prefers the lower column; -0 is keyed as +0, since they compare equal. The maximum
// of a set does not depend on the order it is taken in, so the token never depends on which
// block or thread got there first. NaN is never keyed (its key would be 0), and every number's
// key is above 0 (-inf's high half is 0x007fffff), so a row keeps 0 exactly when it holds
// nothing but NaN, which gives -1 as in `sample.argmax`. The vocabulary fits 32 bits.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
{%- if stage == "init" %}
    unsigned long long* __restrict__ best, i64 rows)
{
    grid_dependency_control();
    const i64 r = (i64)blockIdx.x * {{ threads }} + threadIdx.x;
    if (r < rows) best[r] = 0ull;
}
{%- else %}
    i64* __restrict__ out, const unsigned long long* __restrict__ best, i64 rows)
{
    grid_dependency_control();
    const i64 r = (i64)blockIdx.x * {{ threads }} + threadIdx.x;
    if (r < rows) {
        const unsigned long long key = best[r];
        out[r] = key == 0ull ? -1 : (i64)(unsigned)~(unsigned)key;
    }
}
{%- endif %}
