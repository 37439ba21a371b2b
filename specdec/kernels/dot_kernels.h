// The per-weight-row dot products of the linear kernels, as tables indexed by the number of activation
// rows (1..kMaxRows): one table per instruction set, chosen at run time (linear_kernels.cpp).
//
// Every path computes the same exact int32 sums per weight group and then the same float operations in
// the same order, so all paths give bit-identical results (tests/test_kernel_paths.py checks it): a
// machine's choice changes speed, never an output bit.
//
// No inline functions here: linear_kernels_avx512.cpp is compiled for AVX-512, and an inline function
// both files emitted could be linked from its AVX-512 copy into AVX2-only code.
#pragma once
#include <cstdint>

namespace specdec_kernels {

constexpr int kMaxRows = 8;

// 4-bit (Q4_K values): qs, sc, mn, d, dmin, groups, xq, group sums (as floats), K, group-sum stride, result
using DotFn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float*, const float*, int64_t,
                       const int8_t*, const float*, int64_t, int64_t, float*);
// int8 weights: w, xq, K, activation totals (one per row, `stride` apart), stride, int32 result
using DotQ8Fn = void (*)(const int8_t*, const int8_t*, int64_t, const int32_t*, int64_t, int32_t*);
// 6-bit (Q6_K values): ql, qh, sc, d, blocks, xq, int16 sums per 16, K, sum stride, result
using DotQ6Fn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float*, int64_t, const int8_t*,
                         const int16_t*, int64_t, int64_t, float*);

// AVX2 (maddubs / madd): linear_kernels_q6q8.cpp (the 4-bit table is linear_kernels.cpp's own)
extern const DotQ8Fn kDotQ8Avx2[kMaxRows + 1];
extern const DotQ6Fn kDotQ6Avx2[kMaxRows + 1];

// AVX-512 VNNI (vpdpbusd / vpdpwssd, 32 vector registers): linear_kernels_avx512.cpp; entries from 2
// rows (one row runs the AVX2 code: see kPaths in linear_kernels.cpp)
extern const DotFn kDotAvx512Vnni[kMaxRows + 1];
extern const DotQ8Fn kDotQ8Avx512Vnni[kMaxRows + 1];
extern const DotQ6Fn kDotQ6Avx512Vnni[kMaxRows + 1];

// AVX-VNNI (VEX vpdpbusd / vpdpwssd on 256 bits, 16 vector registers): linear_kernels_avxvnni.cpp; entries
// from 2 rows, as above. Empty tables where the compiler lacks AVX-VNNI (avx_vnni_compiled() says so).
extern const DotFn kDotAvxVnni[kMaxRows + 1];
extern const DotQ8Fn kDotQ8AvxVnni[kMaxRows + 1];
extern const DotQ6Fn kDotQ6AvxVnni[kMaxRows + 1];
bool avx_vnni_compiled();

// Attention's inner loops for one token's query heads of one KV head against a block of its visible cache
// slots slot[i0 .. i1) (layer_ops.cpp runs the rest). Every path computes each (head, slot) score as one
// 8-lane FMA chain in dimension order and one fixed horizontal sum, and each output lane as an FMA chain in
// slot order, so all paths give the same bits — alone or inside a chunk.
// scores: q [heads, D], keys [slots, D] -> p[h * L + i] = q_h · keys[slot[i]]
using ScoresFn = void (*)(const float* q, int64_t heads, const float* keys, const int64_t* slot, int64_t i0,
                          int64_t i1, int64_t D, float* p, int64_t L);
// values: acc[h * D + d] += Σ_i p[h * L + i] · v[slot[i] * D + d], i in slot order
using ValuesFn = void (*)(const float* p, int64_t heads, int64_t L, const int64_t* slot, int64_t i0, int64_t i1,
                          const float* v, int64_t D, float* acc);
// normalize: one (token, head) row of n scores -> p[i] = e^(p[i]·scale − max_j p[j]·scale) in place; returns
// 1 / Σ p[i], summed as 8 lane sums over p's whole 8-element chunks in order, their hsum, then the rest in order
using NormalizeFn = float (*)(float* p, int64_t n, float scale);
struct AttentionKernels {
  ScoresFn scores;
  ValuesFn values;
  NormalizeFn normalize;
};
extern const AttentionKernels kAttentionAvx2;    // layer_ops.cpp
extern const AttentionKernels kAttentionAvx512;  // attention_avx512.cpp: two heads per 512-bit register
// The instruction set the dot products and attention run with: the best this CPU has unless set_kernel_path
// chose another (tests run every supported path). Every path gives the same bits.
struct KernelPath {
  const char* name;
  const DotFn* q4;
  const DotQ8Fn* q8;
  const DotQ6Fn* q6;
  const AttentionKernels* attention;
};
// The active path (linear_kernels.cpp) and its attention kernels
const KernelPath& active_path();
const AttentionKernels& attention_kernels();

// Whether this CPU runs the AVX-512 VNNI code above and below (linear_kernels.cpp: the one place that asks)
bool cpu_has_avx512_vnni();

// The int8 mode's GEMM (int8_gemm_avx512.cpp; formats there), AVX-512 VNNI only:
// rows of x [rows, K] -> int8 xq [rows, K], their scales xs and the totals of their codes
void int8_quantize_rows_avx512(const float* x, int64_t rows, int64_t K, int8_t* xq, float* xs, int32_t* totals);
// `rows` quantized activation rows x one packed panel of 64 outputs (`cols` of them real) -> out (row stride ldo)
void int8_gemm_panel_avx512(const int8_t* xq, const float* xs, const int32_t* totals, int64_t rows, int64_t K,
                            const uint8_t* panel, const float* ws, const float* bias, int64_t cols, float* out,
                            int64_t ldo);
// The same panel on Intel AMX (int8_gemm_amx.cpp): bit-identical results, for when amx_int8_ready()
void int8_gemm_panel_amx(const int8_t* xq, const float* xs, const int32_t* totals, int64_t rows, int64_t K,
                         const uint8_t* panel, const float* ws, const float* bias, int64_t cols, float* out,
                         int64_t ldo);
// Whether this CPU has AMX-INT8 and the OS granted this process its tile state (asked once)
bool amx_int8_ready();
// The 4-bit linear on AMX tiles (linear_kernels_amx.cpp), K a multiple of 256. Its weights are a copy made once
// per layer (q4_amx_repack): per panel of 16 weight rows and block of 256 inputs, the codes in tdpbsud's B order,
// two vectors to a byte (group g, pair c: byte 4 j + t = code 32 g + 8 c + t of weight row j, low nibble, and
// code 32 g + 8 c + 4 + t, high), and the 16 rows' scales side by side (sc, mn per group; d, dmin)
struct alignas(64) Q4AmxBlock {
  uint8_t codes[8][4][64];
  uint8_t sc[8][16];
  int8_t mn[8][16];
  float d[16];
  float dmin[16];
};
static_assert(sizeof(Q4AmxBlock) == 2432, "the repacked block has no padding");
// N weight rows in the stored format (linear_kernels.cpp) -> ceil(N / 16) panels x K / 256 blocks (a last panel
// narrower than 16 repeats its last row)
void q4_amx_repack(const uint8_t* qs, const uint8_t* sc, const int8_t* mn, const float* d, const float* dmin, int64_t K,
                   int64_t N, Q4AmxBlock* out);
// `rows` activation rows (int8 in order, K apart; their group sums as floats, gstride apart; their scales xs) x
// one panel's K / 256 blocks (`outs` <= 16 weight rows real) -> out[r * ldo + j] = dot x xs[r] (+ bias[j]), the
// dot product bit-identical to every path's and then QuantizedRows::output's operations
void q4_panel_amx(const Q4AmxBlock* panel, int64_t K, int64_t outs, const int8_t* xq, const float* gsum,
                  int64_t gstride, int64_t rows, const float* xs, const float* bias, float* out, int64_t ldo);
// amx_int8_ready(): where q4_panel_amx runs
bool amx_q4_ready();
// A prompt twin's causal attention on AMX-BF16 tiles (attention_amx.cpp): q [T, heads, D] after RoPE, the
// caches float [kv_heads, S, D] holding slots 0 .. start + T, -> out [T, heads * D]; D a multiple of 32
void prompt_attention_amx(const float* q, int64_t T, int64_t heads, int64_t kv_heads, const float* kc, const float* vc,
                          int64_t S, int64_t D, int64_t start, float scale, float* out);
// Whether this CPU has AMX-BF16 and AVX-512 BF16 and the OS granted the tile state (asked once)
bool amx_bf16_ready();
// The same with AVX-512 BF16's vdpbf16ps instead of tiles (attention_bf16.cpp); the same arguments (D a multiple of 32)
void prompt_attention_bf16(const float* q, int64_t T, int64_t heads, int64_t kv_heads, const float* kc, const float* vc,
                           int64_t S, int64_t D, int64_t start, float scale, float* out);
// Whether this CPU has AVX-512 (F, BW, VL, DQ) with BF16: where prompt_attention_bf16 runs
bool avx512_bf16_ready();
// Both kernels' epilogue: int32 sums of q * (w + 128), [rows, 64] -> (float(sum - 128 * total) * row scale) *
// weight scale (+ bias), `cols` of the 64 outputs stored (one function: the same bits from either kernel)
void int8_finish_rows(const int32_t* sums, int64_t rows, const int32_t* totals, const float* xs, const float* ws,
                      const float* bias, int64_t cols, float* out, int64_t ldo);

}  // namespace specdec_kernels
