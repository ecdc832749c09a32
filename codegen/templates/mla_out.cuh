{#- The end both absorbed-MLA kernels share: the softmax sum l and max m of head row srow (held
    by its ROW_LANES threads), and o[MI][8][4], the m16n8 tiles of latent columns warp·64.. of
    head rows mi·16.. (of HG in the group), are written out: normalised to bf16 in `out`
    (direct), or as a split's partial O and log-sum-exp for the merge. #}
    cp_async_wait<0>();
    if ((tid & (ROW_LANES - 1)) == 0) {
        lsum[srow] = l;
        lmax[srow] = m;
    }
    __syncthreads();

    // Accumulator e of m16n8 tile o[mi][nt] is head row mi·16 + g + (e / 2)·8, column
    // warp·64 + nt·8 + t4·2 + e % 2.{% if not direct %}
    // A head that saw no key writes no partial O: its lse is −inf and the merge gives it weight 0
    // without using the O it reads (a split whose keys are all hidden: −1 entries, or past the
    // position).{% endif %}
#pragma unroll
    for (int mh = 0; mh < 2 * MI; ++mh) {
        const int mi = mh >> 1, half = mh & 1, r = mi * 16 + g + half * 8;
        if (r < HG{% if not direct %} && lsum[r] > 0.f{% endif %}) {
            const float inv = lsum[r] > 0.f ? 1.f / lsum[r] : 0.f;
            const i64 h = group * HG + r;
{%- if direct %}
            bf16* const dst = out + row * out_row + h * out_head + warp * 64 + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
                    __floats2bfloat162_rn(o[mi][nt][half * 2] * inv, o[mi][nt][half * 2 + 1] * inv);
{%- else %}
            float* const dst = part + ((row * splits + split) * HEADS + h) * D1 + warp * 64 + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                *reinterpret_cast<float2*>(dst + nt * 8) =
                    make_float2(o[mi][nt][half * 2] * inv, o[mi][nt][half * 2 + 1] * inv);
{%- endif %}
        }
    }
{%- if not direct %}
    if (tid < HG) {
        float* const lse = part + rows * splits * HEADS * D1 + (row * splits + split) * HEADS;
        lse[group * HG + tid] = lsum[tid] > 0.f ? lmax[tid] + log2f(lsum[tid]) : -INFINITY;
    }
{%- endif %}
