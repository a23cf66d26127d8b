## Hopper's warpgroup MMA (wgmma, PTX ISA 8.0, target sm_90a) from OpenCL: the kernels of
## benchmarks/sm90a_probe.py, which asks whether NVIDIA's OpenCL runs them at all and how fast.
##
## NVIDIA's OpenCL compiles OpenCL C for sm_90, whose PTX assembler refuses wgmma. With
## HIDE, every instruction that needs sm_90a or PTX 8.0 is written as a PTX comment starting
## "//@ " (inline assembly reaches the PTX text verbatim, operands substituted): the program
## builds for sm_90, and the host (``retarget`` in the probe) removes the markers, names
## sm_90a and PTX 8.0 in the header, and builds the PTX again from that text as a program
## binary. Without HIDE the instructions are written plainly (a build option naming sm_90a,
## or a local check with ptxas).
##
## Kernels (one warpgroup is 128 consecutive work-items; N is a template choice per kernel):
##   wgmma_tile_<dt>_n<N>(a, b, d, a_core_k, a_core_mn, a_lbo, a_sbo, b_core_k, b_core_mn,
##                        b_lbo, b_sbo)
##     local (128): one product D (64 x N, float, row-major) = A (64 x K, row-major: K
##     contiguous) times B^T (B is N x K, row-major: K contiguous), K = 8 (tf32) or 16
##     (f16, bf16: 16-bit values as ushort). The operands go to local memory as 8-row core
##     matrices of 16 bytes a row (no swizzle): core (i, j) (rows 8i.., 16-byte column j) at
##     byte i * core_mn + j * core_k; the descriptors carry lbo and sbo as given, so the host
##     can try the layouts and learn which reading of the two fields is right (A and B lie in
##     16 KiB, so that a wrong reading stays inside local memory). D leaves the
##     registers in the accumulator layout of mma.m16n8 repeated: warp w holds rows
##     16w .. 16w + 15, lane l rows 16w + l / 4 (values 4j, 4j + 1) and + 8 (4j + 2, 4j + 3),
##     columns 8j + 2 (l % 4) + {0, 1}.
##   wgmma_swizzle_<dt>_n<N>(a, b, d, width, bits, layout, lbo, sbo)
##     local (128): D (64 x N) = A (64 x KW) times B^T (B: N x KW), both K contiguous, KW the
##     elements in `width` bytes (32, 64 or 128: the swizzle's width). Rows of `width` bytes
##     one after another (8 rows: one swizzle atom), each 16-byte chunk moved as the swizzle
##     moves it: byte offset o to o ^ (((o >> 7) & (2^bits - 1)) << 4) (bits 1, 2, 3 for 32,
##     64, 128 bytes), from a base aligned to 1024 bytes. KW / K wgmma products accumulate,
##     the descriptors' start advanced by K values (32 bytes) each; `layout` is the
##     descriptor's swizzle code (1: 128 bytes, 2: 64, 3: 32), lbo and sbo its offsets.
##   wgmma_peak_<dt>_n<N>(y, trips)
##     local (WARPGROUPS * 128): every warpgroup issues UNROLL wgmma m64nNkK products per trip
##     into one accumulator tile from operands of 1.0 in local memory; each accumulator ends at
##     K * UNROLL * trips, and y gets the sum of a work-item's accumulators (the host checks).
##     Work: 2 * 64 * N * K * UNROLL * trips flops per warpgroup.
##   wgmma_gemm_<dt>_n<BN>_s<S>_w<W>(a, b, c, M, N, K, sbo, layout)
##     local (256), global (M / 128 * 256, N / BN): C (M x N, row-major, float) = A (M x K,
##     row-major) times B^T (B: N x K, row-major): TF32 products of float32 operands (the
##     tensor cores read the top 19 bits), or of 16-bit ones (f16, bf16: ushort), float32
##     accumulators; M a multiple of 128, N of BN, K of a slice (16 or 32 values). A
##     work-group's two warpgroups compute a 128 x BN tile, warpgroup g rows 64g .. 64g + 63,
##     by wgmma m64n<BN>k<8|16> from local memory, two a slice. Slices of 64-byte rows (16
##     TF32 or 32 16-bit values deep) in the 64-byte swizzle (the
##     layout of wgmma_swizzle at width 64, `sbo` and `layout` its descriptor's stride offset
##     and swizzle code) come in by 16-byte async copies (cp.async) S stages deep; W = 0: every
##     slice's products are waited for before the next slice (the copies S - 1 slices ahead),
##     W = 1: one slice's products stay in flight (the copies S - 2 slices ahead). One barrier
##     a slice. Work-groups walk the tiles GROUP_M tile rows at a time (L2 reuse).
##   local_probe(y, buf, n)
##     a __local argument of n floats: written, read back reversed, y = each item's sum; how
##     much local memory one work-group can be given at launch.
##
## Template parameters:
##   hide        True: sm_90a / PTX 8.0 instructions as "//@ " comments (see above)
##   tiles       list of (dt, N) for wgmma_tile kernels
##   swizzles    list of (dt, N) for wgmma_swizzle kernels
##   peaks       list of (dt, N) for wgmma_peak kernels
##   warpgroups  warpgroups per work-group of the peak kernels
##   unroll      products per trip of the peak kernels
##   gemms       list of (dt, BN, S, W) for wgmma_gemm kernels
##   emulate     True: every wgmma of the GEMM kernels computed by the work-items from local
##               memory as the hardware reads it (64-byte swizzle, the stride offset given),
##               cp.async as plain copies: the GEMM's addressing checked on any OpenCL device
<%
    H = "//@ " if hide else ""
    K = {"tf32": 8, "f16": 16, "bf16": 16}
    STORE = {"tf32": "uint", "f16": "ushort", "bf16": "ushort"}
    ONE = {"tf32": "0x3f800000u", "f16": "0x3c00", "bf16": "0x3f80"}

    def mma(dt, n, acc, da, db, scale):
        count = n // 2
        regs = ", ".join(f"%{i}" for i in range(count))
        tail = ", 1, 1" + (", 0, 0" if dt != "tf32" else "")
        outs = ", ".join(f'"+f"({acc}{i})' for i in range(count))
        return (f'asm volatile("{{\\n"\n'
                f'                 ".reg .pred p;\\n"\n'
                f'                 "setp.ne.b32 p, %{count + 2}, 0;\\n"\n'
                f'                 "{H}wgmma.mma_async.sync.aligned.m64n{n}k{K[dt]}.f32.{dt}.{dt} "\n'
                f'                 "{{{regs}}}, %{count}, %{count + 1}, p{tail};\\n"\n'
                f'                 "}}\\n"\n'
                f'                 : {outs}\n'
                f'                 : "l"({da}), "l"({db}), "r"({scale}));')

    def keep(acc, n):
        if emulate:
            return ""
        return "\n    ".join(f'asm volatile("" : "+f"({acc}{i}) :: "memory");' for i in range(n // 2))
%>
<%namespace name="access" file="memory_access.cl.mako"/>
% if emulate:
#define WGMMA_FENCE()
#define WGMMA_COMMIT()
#define WGMMA_WAIT0()
#define WGMMA_WAIT(pending)
#define PROXY_FENCE()
% else:
#define WGMMA_FENCE() asm volatile("${H}wgmma.fence.sync.aligned;" ::: "memory")
#define WGMMA_COMMIT() asm volatile("${H}wgmma.commit_group.sync.aligned;" ::: "memory")
#define WGMMA_WAIT0() asm volatile("${H}wgmma.wait_group.sync.aligned 0;" ::: "memory")
#define WGMMA_WAIT(pending) asm volatile("${H}wgmma.wait_group.sync.aligned " #pending ";" ::: "memory")
// Local memory written by ordinary stores, read next by the tensor cores' async proxy.
#define PROXY_FENCE() asm volatile("${H}fence.proxy.async.shared::cta;" ::: "memory")
% endif

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (each
// stored >> 4), no swizzle, base offset 0.
inline ulong descriptor(__local const void *base, int lbo, int sbo)
{
    const uint addr = (uint)(ulong)base;
    return (ulong)((addr & 0x3FFFFu) >> 4) | ((ulong)((uint)lbo >> 4) << 16)
           | ((ulong)((uint)sbo >> 4) << 32);
}

// The element offset of (row r, column k) of an operand stored as core matrices: rows of 16
// bytes holding `per` values, core (r / 8, k / per) at byte (r / 8) * core_mn + (k / per) * core_k.
inline int core_offset(int r, int k, int per, int bytes, int core_k, int core_mn)
{
    return ((r / 8) * core_mn + (k / per) * core_k) / bytes + (r % 8) * per + k % per;
}

% for dt, n in tiles:
<% kk = K[dt]; st = STORE[dt] %>
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void wgmma_tile_${dt}_n${n}(__global const ${st} *a, __global const ${st} *b, __global float *d,
                            int a_core_k, int a_core_mn, int a_lbo, int a_sbo,
                            int b_core_k, int b_core_mn, int b_lbo, int b_sbo)
{
    // A at 0, B 8 KiB further, in 16 KiB: a layout read with the wrong offsets stays inside
    // the work-group's local memory (its products are wrong, the launch is not).
    __local ${st} pool[${16384 // (4 if dt == "tf32" else 2)}] __attribute__((aligned(1024)));
    __local ${st} *sa = pool, *sb = pool + ${8192 // (4 if dt == "tf32" else 2)};
    const int t = get_local_id(0);
    const int per = ${4 if dt == "tf32" else 8}, bytes = ${4 if dt == "tf32" else 2};
    for (int i = t; i < 64 * ${kk}; i += 128)
        sa[core_offset(i / ${kk}, i % ${kk}, per, bytes, a_core_k, a_core_mn)] = a[i];
    for (int i = t; i < ${n} * ${kk}; i += 128)
        sb[core_offset(i / ${kk}, i % ${kk}, per, bytes, b_core_k, b_core_mn)] = b[i];
    PROXY_FENCE();
    barrier(CLK_LOCAL_MEM_FENCE);
    const ulong da = descriptor(sa, a_lbo, a_sbo), db = descriptor(sb, b_lbo, b_sbo);
    const int scale_d = 1;
% for i in range(n // 2):
    float acc${i} = 0.0f;
% endfor
    WGMMA_FENCE();
    ${mma(dt, n, "acc", "da", "db", "scale_d")}
    WGMMA_COMMIT();
    WGMMA_WAIT0();
    ${keep("acc", n)}
    const int warp = t / 32, lane = t % 32;
    const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);
% for j in range(n // 8):
    d[row * ${n} + ${8 * j} + col] = acc${4 * j};
    d[row * ${n} + ${8 * j} + col + 1] = acc${4 * j + 1};
    d[(row + 8) * ${n} + ${8 * j} + col] = acc${4 * j + 2};
    d[(row + 8) * ${n} + ${8 * j} + col + 1] = acc${4 * j + 3};
% endfor
}

% endfor
% for dt, n in swizzles:
<% kk = K[dt]; st = STORE[dt]; size = 4 if dt == "tf32" else 2 %>
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void wgmma_swizzle_${dt}_n${n}(__global const ${st} *a, __global const ${st} *b,
                               __global float *d, int width, int bits, int layout, int lbo,
                               int sbo)
{
    __local ${st} sa[64 * ${128 // size}] __attribute__((aligned(1024)));
    __local ${st} sb[${n} * ${128 // size}] __attribute__((aligned(1024)));
    const int t = get_local_id(0);
    const int kw = width / ${size}, mask = (1 << bits) - 1;
    for (int i = t; i < 64 * kw; i += 128) {
        int o = (i / kw) * width + (i % kw) * ${size};
        o ^= ((o >> 7) & mask) << 4;
        sa[o / ${size}] = a[i];
    }
    for (int i = t; i < ${n} * kw; i += 128) {
        int o = (i / kw) * width + (i % kw) * ${size};
        o ^= ((o >> 7) & mask) << 4;
        sb[o / ${size}] = b[i];
    }
    PROXY_FENCE();
    barrier(CLK_LOCAL_MEM_FENCE);
    const ulong swizzle = (ulong)layout << 62;
    const int scale_d = 1;
% for i in range(n // 2):
    float acc${i} = 0.0f;
% endfor
    WGMMA_FENCE();
    for (int step = 0; step < kw / ${kk}; ++step) {
        // K values a step: 32 bytes further into each row.
        const ulong da = descriptor((__local const char *)sa + 32 * step, lbo, sbo) | swizzle;
        const ulong db = descriptor((__local const char *)sb + 32 * step, lbo, sbo) | swizzle;
        ${mma(dt, n, "acc", "da", "db", "scale_d")}
    }
    WGMMA_COMMIT();
    WGMMA_WAIT0();
    ${keep("acc", n)}
    const int warp = t / 32, lane = t % 32;
    const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);
% for j in range(n // 8):
    d[row * ${n} + ${8 * j} + col] = acc${4 * j};
    d[row * ${n} + ${8 * j} + col + 1] = acc${4 * j + 1};
    d[(row + 8) * ${n} + ${8 * j} + col] = acc${4 * j + 2};
    d[(row + 8) * ${n} + ${8 * j} + col + 1] = acc${4 * j + 3};
% endfor
}

% endfor
% for dt, n in peaks:
<% kk = K[dt]; st = STORE[dt] %>
__kernel __attribute__((reqd_work_group_size(${128 * warpgroups}, 1, 1)))
void wgmma_peak_${dt}_n${n}(__global float *y, int trips)
{
    __local ${st} sa[64 * ${kk}] __attribute__((aligned(128)));
    __local ${st} sb[${n} * ${kk}] __attribute__((aligned(128)));
    const int t = get_local_id(0);
    for (int i = t; i < 64 * ${kk}; i += ${128 * warpgroups})
        sa[i] = (${st})${ONE[dt]};
    for (int i = t; i < ${n} * ${kk}; i += ${128 * warpgroups})
        sb[i] = (${st})${ONE[dt]};
    PROXY_FENCE();
    barrier(CLK_LOCAL_MEM_FENCE);
    // Every value is 1.0: any core-matrix layout gives the same product (K-adjacent cores
    // 128 bytes apart, M- or N-adjacent ones 256).
    const ulong da = descriptor(sa, 128, 256), db = descriptor(sb, 128, 256);
    const int scale_d = 1;
% for i in range(n // 2):
    float acc${i} = 0.0f;
% endfor
    for (int trip = 0; trip < trips; ++trip) {
        WGMMA_FENCE();
% for u in range(unroll):
        ${mma(dt, n, "acc", "da", "db", "scale_d")}
% endfor
        WGMMA_COMMIT();
        WGMMA_WAIT0();
    }
    ${keep("acc", n)}
    float total = 0.0f;
% for i in range(n // 2):
    total += acc${i};
% endfor
    y[get_global_id(0)] = total;
}

% endfor
% if gemms:
${access.async_copies(not emulate)}

// The 64-byte swizzle of a byte offset from a 1024-byte aligned base: its 16-byte chunk index
// (bits 4-5) XOR bits 7-8.
inline int swizzle64(int o)
{
    return o ^ (((o >> 7) & 3) << 4);
}

// One 16-byte copy of slice row `row`, chunk `chunk` from `src` into its swizzled place in the
// operand's tile at `tile` (1024-byte aligned).
inline void copy_chunk(__local uint *tile, int row, int chunk, __global const void *src)
{
    copy16((__local float *)tile + swizzle64(row * 64 + chunk * 16) / 4,
           (__global const float *)src);
}

% for dt in (sorted({g[0] for g in gemms}) if emulate else []):
// Element (row r, K value k) of a slice operand of ${dt} values read as wgmma reads it: from
// the descriptor's start (`start` bytes past the stage's 1024-byte aligned base), 8-row atoms
// `sbo` bytes apart, rows of 64 bytes, the address swizzled.
inline float slice_at_${dt}(__local const uint *stage, int start, int sbo, int r, int k)
{
% if dt == "tf32":
    return as_float(stage[swizzle64(start + (r / 8) * sbo + (r % 8) * 64 + 4 * k) / 4]);
% else:
    const int o = swizzle64(start + (r / 8) * sbo + (r % 8) * 64 + 2 * k);
    const uint bits = (stage[o / 4] >> (16 * ((o / 2) % 2))) & 0xFFFFu;
% if dt == "bf16":
    return as_float(bits << 16);
% else:
    return vload_half(0, (__private const half *)&bits + 0);
% endif
% endif
}

% endfor
% endif
% for dt, bn, stages, wait in gemms:
<%
    size = 4 if dt == "tf32" else 2  # bytes a value
    ks = 64 // size                    # K values a slice (rows of 64 bytes)
    kk = K[dt]                         # K values a wgmma (32 bytes)
    et = "float" if dt == "tf32" else "ushort"
    depth = stages - 1 - wait          # slices in flight ahead of the one multiplied
    stage_words = (128 + bn) * 16      # A then B, rows of 16 words
    a_chunks, b_chunks = 128 * 4 // 256, bn * 4 // 256
    assert depth >= 1 and stages * stage_words * 4 <= 49152
%>
% if (dt, bn, stages, wait) == [g for g in gemms if g[:2] == (dt, bn)][0]:
// Slice `s` (K values ${ks} s .. ${ks} s + ${ks - 1}) of the A rows m0.. and B rows n0.. into
// `stage`: chunk q = t + 256 j is row q / 4, 16-byte chunk q % 4 (four items a 64-byte row:
// coalesced reads).
inline void load_slice_${dt}_n${bn}(__local uint *stage, __global const ${et} *a,
                              __global const ${et} *b, int m0, int n0, int K, int s, int t)
{
    const int k = ${ks} * s + ${16 // size} * (t % 4);
% for j in range(a_chunks):
    copy_chunk(stage, (t + ${256 * j}) / 4, t % 4, a + (long)(m0 + (t + ${256 * j}) / 4) * K + k);
% endfor
% for j in range(b_chunks):
    copy_chunk(stage + 128 * 16, (t + ${256 * j}) / 4, t % 4,
               b + (long)(n0 + (t + ${256 * j}) / 4) * K + k);
% endfor
}

% endif
__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void wgmma_gemm_${dt}_n${bn}_s${stages}_w${wait}(__global const ${et} *restrict a,
                                                 __global const ${et} *restrict b,
                                                 __global float *restrict c, int M, int N,
                                                 int K, int sbo, int layout)
{
    __local uint smem[${stages * stage_words}] __attribute__((aligned(1024)));
    const int t = get_local_id(0);
    const int wg = t / 128, warp = (t % 128) / 32, lane = t % 32;
    // Tiles walked GROUP_M tile rows at a time down M, then along N.
    const int tiles_m = M / 128, tiles_n = N / ${bn};
    const int id = get_group_id(0) + get_group_id(1) * get_num_groups(0);
    const int group = id / (8 * tiles_n), first = group * 8;
    const int rows_here = min(tiles_m - first, 8);
    const int tm = first + (id % (8 * tiles_n)) % rows_here;
    const int tn = (id % (8 * tiles_n)) / rows_here;
    const int m0 = tm * 128, n0 = tn * ${bn};
    const int slices = K / ${ks};
    const ulong swizzle = (ulong)layout << 62;
% for i in range(bn // 2):
    float acc${i} = 0.0f;
% endfor
% for s0 in range(depth):
    if (${s0} < slices)
        load_slice_${dt}_n${bn}(smem + ${s0 * stage_words}, a, b, m0, n0, K, ${s0}, t);
    COPY_COMMIT();
% endfor
    for (int s = 0; s < slices; ++s) {
        COPY_WAIT(${depth - 1});
        PROXY_FENCE();
        barrier(CLK_LOCAL_MEM_FENCE);
        // The stage the copies go to was last read by slice s - ${stages - depth}, whose
        // products every warpgroup waited for before this barrier.
        if (s + ${depth} < slices)
            load_slice_${dt}_n${bn}(smem + (s + ${depth}) % ${stages} * ${stage_words}, a, b,
                                    m0, n0, K, s + ${depth}, t);
        COPY_COMMIT();
        __local uint *stage = smem + (s % ${stages}) * ${stage_words};
        WGMMA_FENCE();
% for step in range(2):
        {
            const int a_start = wg * 64 * 64 + ${32 * step}, b_start = 128 * 64 + ${32 * step};
% if emulate:
            // acc (row, col) += sum over ${kk} K values: rows 16 warp + lane / 4 (+ 8), columns
            // 8 j + 2 (lane % 4) (+ 1), as the hardware's accumulator layout.
            const int r = 16 * warp + lane / 4, col = 2 * (lane % 4);
            for (int k = 0; k < ${kk}; ++k) {
                const float a0 = slice_at_${dt}(stage, a_start, sbo, r, k);
                const float a1 = slice_at_${dt}(stage, a_start, sbo, r + 8, k);
% for j in range(bn // 8):
                {
                    const float b0 = slice_at_${dt}(stage, b_start, sbo, ${8 * j} + col, k);
                    const float b1 = slice_at_${dt}(stage, b_start, sbo, ${8 * j} + col + 1, k);
                    acc${4 * j} = fma(a0, b0, acc${4 * j});
                    acc${4 * j + 1} = fma(a0, b1, acc${4 * j + 1});
                    acc${4 * j + 2} = fma(a1, b0, acc${4 * j + 2});
                    acc${4 * j + 3} = fma(a1, b1, acc${4 * j + 3});
                }
% endfor
            }
% else:
            const ulong da = descriptor((__local const char *)stage + a_start, 16, sbo) | swizzle;
            const ulong db = descriptor((__local const char *)stage + b_start, 16, sbo) | swizzle;
            const int scale_d = 1;
            ${mma(dt, bn, "acc", "da", "db", "scale_d")}
% endif
        }
% endfor
        WGMMA_COMMIT();
        WGMMA_WAIT(${wait});
    }
    WGMMA_WAIT0();
    ${keep("acc", bn)}
    const int row = m0 + 64 * wg + 16 * warp + lane / 4, col = n0 + 2 * (lane % 4);
% for j in range(bn // 8):
    *(__global float2 *)(c + (long)row * N + col + ${8 * j}) = (float2)(acc${4 * j}, acc${4 * j + 1});
    *(__global float2 *)(c + (long)(row + 8) * N + col + ${8 * j}) = (float2)(acc${4 * j + 2}, acc${4 * j + 3});
% endfor
}

% endfor
__kernel void local_probe(__global float *y, __local float *buf, int n)
{
    const int t = get_local_id(0), size = get_local_size(0);
    for (int i = t; i < n; i += size)
        buf[i] = (float)i;
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    for (int i = t; i < n; i += size)
        s += buf[n - 1 - i];
    y[get_global_id(0)] = s;
}
