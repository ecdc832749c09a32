{#- The signature and first statements both absorbed-MLA kernels share (256 threads): the output
    (or the split scratch `part`), the queries, the caches (moved to a prefill's cache slot), the
    positions, the top-k lists when sparse, the row and split counts and the scale. -#}
extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
{%- if direct %}
    bf16* __restrict__ out, i64 out_row, i64 out_head,
{%- else %}
    float* __restrict__ part,
{%- endif %}
    const bf16* __restrict__ q1, i64 q1_row, i64 q1_head,
    const bf16* __restrict__ q2, i64 q2_row, i64 q2_head,
    const bf16* __restrict__ k1, i64 k1_seq, i64 k1_key,
    const bf16* __restrict__ k2, i64 k2_seq, i64 k2_key,
    const i64* __restrict__ positions,
{%- if sparse %}
    const i64* __restrict__ topk, i64 topk_row,
{%- endif %}
    i64 rows, i64 splits, float scale_log2{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k1_slot, i64 k2_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: each cache starts that many slots in
    // (0 apart for one held in the arena).
    k1 += cache_slot[0] * k1_slot;
    k2 += cache_slot[0] * k2_slot;
{%- endif %}