{#- The head every GEMM template starts with: its columns (and rope epilogue) and its signature, through the opening brace of the body. -#}
{%- set argmax = argmax | default(value=false) -%}
// {{ name }}: {{ op }}, y[r, h, :] = x[r, h, :] · w[h]ᵀ with K = {{ k }}, {{ n }} columns and
// {{ heads }} head(s); x rows are `x_inner_rows` rows `x_row` apart, repeated every `x_outer`.
{%- if argmax %}
// Argmax epilogue (`matmul.argmax`, see gemm_argmax.cu): y is not stored; each block folds its
// columns of every row into one key per row (argmax_key) in shared memory and then into
// `best[r]` with one 64-bit atomicMax per row.
{%- endif %}
{%- if rope %}
// Rope epilogue: in every block of {{ period }} columns, columns {{ start }}..{{ end }} are
// rotated at the row's position ({% if interleaved %}pairs (2i, 2i+1){% else %}pairs (i, i+{{ half }}){% endif %}, theta {{ theta }}).
// Tiles walk a permuted column order in which each block's rotated pairs come first, two adjacent
// columns per pair, and blocks are padded to an even width, so the thread holding an even column
// holds its partner too. The angle is reduced in f32 arithmetic that keeps it within 5e-7 of
// the f64 angle (rotate2 says how): SM120 runs f64 at 1/64 of the f32 rate.
{%- endif %}
namespace {{ name }}_ {
constexpr int K = {{ k }}, N = {{ n }}, HEADS = {{ heads }};
{%- if rope %}
constexpr int PERIOD = {{ period }}, START = {{ start }}, R = {{ end }} - {{ start }}, HALF = R / 2;
constexpr int PADDED = PERIOD + PERIOD % 2;
constexpr int COLS = N / PERIOD * PADDED;
constexpr double INV_FREQ[HALF] = { {{ inv_freq }} };
// Each frequency as a float and the float of what it misses, so that position · hi is computed
// exactly (an fma gives its rounding error) and position · lo adds the rest.
struct Freqs {
    float hi[HALF], lo[HALF];
};
constexpr Freqs split_freqs() {
    Freqs f{};
    for (int i = 0; i < HALF; ++i) {
        f.hi[i] = (float)INV_FREQ[i];
        f.lo[i] = (float)(INV_FREQ[i] - (double)f.hi[i]);
    }
    return f;
}
__device__ const Freqs freqs = split_freqs();
// The column a permuted index stands for, or -1 past the end and for a block's padding column.
__device__ __forceinline__ int column(int l) {
    if (l >= COLS) return -1;
    const int block = l / PADDED, o = l % PADDED;
    if (o >= PERIOD) return -1;
    int c;
    if (o < R) {
        {% if interleaved %}c = START + o;{% else %}c = START + o / 2 + (o % 2) * HALF;{% endif %}
    } else {
        c = o - R < START ? o - R : o;
    }
    return block * PERIOD + c;
}
{%- else %}
constexpr int COLS = N;
__device__ __forceinline__ int column(int l) { return l < COLS ? l : -1; }
{%- endif %}
{%- if argmax %}

// The key of logit `v` of column `c` (-1: none): the logit as the unfused kernel stores it
// ({{ y_t }}), its f32 bits mapped so that unsigned order is numeric order (-0 made +0, which
// compare equal), above the complement of the column, so a larger key is a larger logit or an
// equal one further left. NaN and no column give 0, below every number's key (-inf's is
// 0x007fffff'…), so 0 left in a row's slot means the row has no number.
__device__ __forceinline__ unsigned long long argmax_key(float v, int c) {
    const float r = rnd<{{ y_t }}>(v);
    if (c < 0 || isnan(r)) return 0ull;
    const unsigned bits = __float_as_uint(r == 0.f ? 0.f : r);
    const unsigned ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
    return (unsigned long long)ordered << 32 | (unsigned)~c;
}
{%- endif %}

// The output tile block `block` computes: its column tile, head and first row. Blocks take
// column tiles fastest, then heads, then row tiles (the grid is rounded up to whole row tiles, so
// a block may start past the last row: it has nothing to do).
struct Tile {
    int nt, h;
    i64 m0;
};
__device__ __forceinline__ Tile tile_of(i64 block, int col_tiles, int tile_rows) {
    return {(int)(block % col_tiles), (int)(block / col_tiles % HEADS), block / col_tiles / HEADS * tile_rows};
}

// tile_of for the tiled GEMM, with blocks walking `group` row tiles down before they move one
// tile right (column tiles, then heads): the blocks resident at once then span fewer weight
// columns and more rows, so each weight tile is read from DRAM once for `group` row tiles while
// it is in L2. Row tiles past the last and slots of a short last group give m0 ≥ rows.
__device__ __forceinline__ Tile grouped_tile_of(i64 block, int col_tiles, int tile_rows, i64 rows, int group) {
    const i64 per_row = (i64)col_tiles * HEADS;  // the tiles of one row tile
    const i64 row_tiles = (rows + tile_rows - 1) / tile_rows;
    const i64 first = block / (per_row * group) * group, in_group = block % (per_row * group);
    const i64 height = row_tiles - first < group ? row_tiles - first : group;
    if (height <= 0 || in_group >= per_row * height) return {0, 0, row_tiles * tile_rows};
    const i64 rest = in_group / height;
    return {(int)(rest % col_tiles), (int)(rest / col_tiles), (first + in_group % height) * tile_rows};
}

__device__ __forceinline__ i64 x_offset(i64 r, int h, i64 x_outer, i64 x_row, i64 x_inner_rows, i64 x_head) {
    return (r / x_inner_rows) * x_outer + (r % x_inner_rows) * x_row + h * x_head;
}

// The position row r is rotated at (0 without rope), exact as a float below 2^24. An epilogue
// reads it once a row, not once a pair of columns: the i64 division and the dependent load are
// not repeated for each of a thread's pairs.
__device__ __forceinline__ float rope_position(const i64* __restrict__ positions, i64 r, i64 rows_per_position) {
{%- if rope %}
    return (float)positions[r / rows_per_position];
{%- else %}
    return 0.f;
{%- endif %}
}

// Whether permuted column l is the first of a rotated pair.
__device__ __forceinline__ bool rotated(int l) {
{%- if rope %}
    return l < COLS && l % PADDED < R;
{%- else %}
    return false;
{%- endif %}
}

// The frequency of permuted column l's pair (hi + lo), and whether it turns at all.
struct Freq {
    float hi, lo;
    bool rot;
};
__device__ __forceinline__ Freq freq_of(int l) {
{%- if rope %}
    const bool rot = rotated(l);
    const int i = rot ? l % PADDED / 2 : 0;
    return {freqs.hi[i], freqs.lo[i], rot};
{%- else %}
    return {0.f, 0.f, false};
{%- endif %}
}

// A pair of columns turned by frequency f at `position`. Branch-free: a pair outside the rope
// span keeps its values by a select, so an epilogue's pairs are independent chains the
// scheduler interleaves. The angle p·f (p < 2^24, f = hi + lo) is reduced by 2π in three parts:
// n·C1 is exact (C1 has 8 bits, n < 2^16), so p·hi − n·C1 is exact too (both are multiples of
// p·hi's ulp and the difference is under 2^7); the fmas against C2 and C3 round once each near
// π, and the rounding error of p·hi and p·lo are added last: four roundings of half an ulp near
// π, within 5e-7 of the f64 angle (__sincosf's own error there) below ROPE_POSITIONS
// (kernels.rs, whose test emulates this in f32: 3.3e-7 at the worst). The GPU GEMM sweeps check
// the kernels at positions up to GLM-5's 202752.
__device__ __forceinline__ void rotate2(Freq f, float& v0, float& v1, float position) {
{%- if rope %}
    constexpr float C1 = 6.28125f, C2 = 1.9353071795864769e-3f;
    constexpr float C3 = (float)(6.283185307179586 - 6.28125 - (double)C2), INV_TWO_PI = 0.15915494309189535f;
    const float p = position * f.hi;
    const float n = rintf(p * INV_TWO_PI);
    float a = fmaf(-n, C1, p);
    a = fmaf(-n, C2, a);
    a = fmaf(-n, C3, a);
    a += fmaf(position, f.hi, -p) + position * f.lo;
    float s, c;
    __sincosf(a, &s, &c);
    // Selected, not turned by 0: an infinite partner would make x · 0 a NaN.
    const float x0 = v0, x1 = v1;
    v0 = f.rot ? x0 * c - x1 * s : x0;
    v1 = f.rot ? x1 * c + x0 * s : x1;
{%- endif %}
}

// Permuted columns l and l + 1 (l even) of a row at `position`, rotated where rope applies.
__device__ __forceinline__ void rotate2(int l, float& v0, float& v1, float position) {
    rotate2(freq_of(l), v0, v1, position);
}

// Stores permuted columns l and l + 1 (l even) of one output row, rotated first where rope
// applies; `positions` is only read under rope.
template <typename T>
__device__ __forceinline__ void store2(T* __restrict__ row, int l, float v0, float v1,
                                       const i64* __restrict__ positions, i64 r, i64 rows_per_position) {
    rotate2(l, v0, v1, rope_position(positions, r, rows_per_position));
    int c = column(l);
    if (c >= 0) st(row + c, v0);
    c = column(l + 1);
    if (c >= 0) st(row + c, v1);
}
}  // namespace {{ name }}_

extern "C" __global__ void __launch_bounds__({{ threads }}, {{ min_blocks | default(value=1) }}) {{ name }}(
{%- if argmax %}
    unsigned long long* __restrict__ best,
{%- else %}
    {{ y_t }}* __restrict__ y, i64 y_row, i64 y_head,
{%- endif %}
    const {{ x_t }}* __restrict__ x, i64 x_outer, i64 x_row, i64 x_inner_rows, i64 x_head,
    const {{ w_t }}* __restrict__ w,
{%- if part | default(value="whole") != "whole" %}
    float* __restrict__ partials,
{%- endif %}
{%- if rope %}
    const i64* __restrict__ positions, i64 rows_per_position,
{%- endif %}
    i64 rows)
{
{%- if weights_first | default(value=false) %}
    weights_before_wait();
{%- else %}
    grid_dependency_control();
{%- endif %}
    using namespace {{ name }}_;
{%- if not rope and not argmax %}
    const i64* positions = nullptr;  // read only under rope
    const i64 rows_per_position = 1;
{%- endif %}
