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
##     can try the layouts and learn which reading of the two fields is right. D leaves the
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
        return "\n    ".join(f'asm volatile("" : "+f"({acc}{i}) :: "memory");' for i in range(n // 2))
%>
#define WGMMA_FENCE() asm volatile("${H}wgmma.fence.sync.aligned;" ::: "memory")
#define WGMMA_COMMIT() asm volatile("${H}wgmma.commit_group.sync.aligned;" ::: "memory")
#define WGMMA_WAIT0() asm volatile("${H}wgmma.wait_group.sync.aligned 0;" ::: "memory")
// Local memory written by ordinary stores, read next by the tensor cores' async proxy.
#define PROXY_FENCE() asm volatile("${H}fence.proxy.async.shared::cta;" ::: "memory")

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
    __local ${st} sa[64 * ${kk}] __attribute__((aligned(128)));
    __local ${st} sb[${n} * ${kk}] __attribute__((aligned(128)));
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
