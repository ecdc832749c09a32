{#- Statements both absorbed-MLA kernels open with, so that the merge reads exactly the splits the
    first kernel wrote: the keys of `row` (its top-k list past dense_until, else every key up to
    its position) go by in tiles of 32, `per` tiles to each of the `splits` blocks of the row, so
    only the first `used` splits hold any. Declares pos, keys, tiles, per and used. #}
    const i64 pos = positions[row];
{%- if sparse %}
    const i64 keys = pos + 1 > {{ dense_until }} ? {{ topk }} : pos + 1;
{%- else %}
    const i64 keys = pos + 1;
{%- endif %}
    const i64 tiles = (keys + 31) / 32, per = (tiles + splits - 1) / splits, used = (tiles + per - 1) / per;
