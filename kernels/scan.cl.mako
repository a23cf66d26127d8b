## Scans and sorting along one dimension (dlprim_py/ops/scan.py): cumsum, sort, topk.
##
## The tensor is seen as (O, N, I): N the scanned / sorted dimension. Sorting works on rows
## (I = 1: the caller moves the dimension last); sizes, offsets and strides are run-time
## arguments, in elements.
##
## part == "cumsum" (template parameters src, acc: input and output element types):
##   scan_chunks(N, chunks, x, x_off, y, y_off, partial, reverse)
##     One work-group per chunk of CHUNK = GROUP * PER consecutive elements of a row (I = 1):
##     the chunk is loaded into local memory (coalesced), each item sums PER neighbours, the
##     group scans those sums (Hillis-Steele), each item writes its running sums back, and
##     the chunk is stored (coalesced); the chunk's total goes to partial[row * chunks + c].
##     ``reverse``: the scan runs from the end of the row (cumsum's backward).
##   scan_add(total, N, chunks, partial, y, y_off, reverse)
##     y[row, p] += the inclusive scan of the partials up to the chunk before p's: the second
##     pass where a row has several chunks.
##   scan_columns(total, N, I, x, x_off, y, y_off, reverse)
##     I > 1: one work item per (o, i) column walking its N elements (coalesced across i).
##
## part == "lookback" (template parameters acc: the element type; vec: 1 where whole tiles may be
## read and written as 4-vectors; lper: elements per work item, a multiple of 4; ptx_fence: 1 on
## NVIDIA, where the device-wide fence and the look-back's flag and value reads are PTX):
##   scan_lookback(N, chunks, tiles, x, x_off, y, y_off, status, reverse)
##     The single-pass scan (decoupled look-back): one work-group per tile of TILE = GROUP * LPER
##     elements of a row, ``tiles`` = rows * chunks of them. A group takes its tile from a
##     ticket counter, not from its group id, so that tiles start in order: a tile waits only
##     for tiles that have started already, which makes the wait safe on any implementation
##     that runs a started work-group to completion (the ids' order of execution is not
##     promised). The group scans its tile in local memory, publishes its total (flag AGG), looks
##     back over its predecessors' totals until one has published its inclusive prefix (flag
##     PREFIX; a row's first tile publishes that at once), publishes its own inclusive prefix
##     and writes its tile out: each element is read once and written once.
##     ``status`` (ints, zero before the first launch): [0] the ticket counter, [1] the count of
##     finished groups, then per tile a flag, then the totals, then the inclusive prefixes
##     (WORDS ints each). Every write to it is atomic (reads too, but for NVIDIA's look-back:
##     acquire / relaxed loads at GPU scope); a value is written before its flag, behind a
##     global fence, and read after it, and a total and a prefix have words of their
##     own, so a reader never pairs a flag with another value. The group that finishes last
##     sets the flags and counters back to zero for the next launch (launches on one in-order
##     queue: the host keeps one status buffer per context).
##
## part == "select" (template parameters key: the key type; group >= 256, the digits; vec: 1
## where every row starts on a 4-entry boundary, read as 4-vectors):
##   topk_radix(n, k, x, x_off, values, v_off, indices, i_off, largest)
##     One work-group per row of n entries: the k-th best entry's key by radix select, then the
##     k best gathered and sorted in local memory. Keys are mapped to unsigned integers whose
##     order is the wanted one (floats: sign-magnitude to biased, NaN to the largest, -0.0 to
##     0.0; integers: the sign bit flipped; largest=0: complemented). Each pass histograms one
##     8-bit digit, most significant first, of the entries that agree with the digits chosen
##     so far, and picks the digit holding the k-th best (a suffix scan of the histogram); it
##     stops early once every entry agreeing with the chosen digits is needed. The k best are
##     the entries above the chosen prefix plus, of those equal to it, the first by position
##     (in position order where more are equal than needed), sorted by key then position
##     (bitonic, k <= KMAX = 1024), so results are the same on every run.
##
## part == "sort" (template parameter key: the key type):
##   The order: keys ascending (descending with ``desc``), NaN after every number (before it
##   descending), equal keys by position (a stable sort, so results do not depend on the
##   schedule); entries with a negative position are padding and come after everything.
##   Bitonic networks over rows padded to a power of two.
##   sort_tile(rows, n, tiles, segment, kin, kin_off, kin_stride, iin, iin_off, has_idx, kout,
##             kout_off, kout_stride, iout, iout_off, keep, merge_k, local_dir, desc)
##     One work-group per tile of TILE = 2 * GROUP consecutive entries of a row, in local
##     memory; or, for rows of at most ``segment`` < TILE entries, TILE / segment rows. merge_k == 0: the whole network up to TILE (the tile sorted, or, with
##     local_dir == 0, the bitonic stages of the whole row up to TILE); merge_k > 0: the
##     steps of stage merge_k below TILE. Writes the tile's first ``keep`` entries to
##     out[row * kout_stride + tile * keep + e]. Without ``has_idx`` positions are the
##     entries' own.
##   sort_step(pairs, P, k, j, keys, idx, desc)
##     One compare-exchange step (stage k, distance j >= TILE) over rows of P entries.
##
## Template parameters: part, src / acc or key (OpenCL C types), group (work-group size, a
## power of two), index_t ("int" where every index fits in 31 bits, else "long").
#define index_t ${index_t}
#define GROUP ${group}
% if part == "cumsum":
#define PER 8
#define CHUNK (GROUP * PER)
// Local index of chunk element e: one padding word every 32, so that the items' strided reads
// of their PER neighbours fall in distinct banks.
#define AT(e) ((e) + (e) / 32)

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void scan_chunks(index_t N, index_t chunks, __global const ${src}* x, index_t x_off,
                 __global ${acc}* y, index_t y_off, __global ${acc}* partial, int reverse)
{
    __local ${acc} buf[CHUNK + CHUNK / 32];
    __local ${acc} sums[GROUP];
    const int lid = get_local_id(0);
    const index_t c = get_group_id(0) % chunks;
    const index_t row = get_group_id(0) / chunks;
    const index_t first = c * CHUNK;
    for (int e = lid; e < CHUNK; e += GROUP) {
        const index_t p = first + e;
        const index_t q = reverse ? N - 1 - p : p;
        buf[AT(e)] = p < N ? (${acc})x[x_off + row * N + q] : (${acc})0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ${acc} own = (${acc})0;
    for (int m = 0; m < PER; ++m)
        own += buf[AT(lid * PER + m)];
    sums[lid] = own;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int offset = 1; offset < GROUP; offset <<= 1) {
        const ${acc} add = lid >= offset ? sums[lid - offset] : (${acc})0;
        barrier(CLK_LOCAL_MEM_FENCE);
        sums[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    ${acc} run = sums[lid] - own;
    for (int m = 0; m < PER; ++m) {
        run += buf[AT(lid * PER + m)];
        buf[AT(lid * PER + m)] = run;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < CHUNK; e += GROUP) {
        const index_t p = first + e;
        if (p < N)
            y[y_off + row * N + (reverse ? N - 1 - p : p)] = buf[AT(e)];
    }
    if (lid == GROUP - 1 && chunks > 1)
        partial[row * chunks + c] = sums[GROUP - 1];
}

__kernel void scan_add(index_t total, index_t N, index_t chunks, __global const ${acc}* partial,
                       __global ${acc}* y, index_t y_off, int reverse)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t row = g / N;
        const index_t p = g % N;
        const index_t c = p / CHUNK;
        if (c > 0)
            y[y_off + row * N + (reverse ? N - 1 - p : p)] += partial[row * chunks + c - 1];
    }
}

__kernel void scan_columns(index_t total, index_t N, index_t I, __global const ${src}* x,
                           index_t x_off, __global ${acc}* y, index_t y_off, int reverse)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t i = g % I;
        const index_t base = (g / I) * N * I + i;
        ${acc} run = (${acc})0;
        for (index_t s = 0; s < N; ++s) {
            const index_t at = base + (reverse ? N - 1 - s : s) * I;
            run += (${acc})x[x_off + at];
            y[y_off + at] = run;
        }
    }
}
% elif part == "lookback":
#define LPER ${lper}
#define TILE (GROUP * LPER)
#define ACC ${acc}
#define ACC4 ${acc}4
// Local index of tile element e: one padding word every 32 (the items' reads of their LPER
// neighbours fall in distinct banks); 4-aligned runs stay contiguous.
#define AT(e) ((e) + (e) / 32)
#define WINDOW 32
#define FLAG_AGG 1
#define FLAG_PREFIX 2
// Orders a work-item's status accesses as every other work-group sees them: OpenCL 1.2's
// mem_fence promises order only as the work-item's own group observes it, and NVIDIA's
// relaxed atomics take no ordering from it across SMs, so there a GPU-scope fence in PTX.
% if ptx_fence:
#define DEVICE_FENCE() asm volatile("membar.gl;" ::: "memory")
% else:
#define DEVICE_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
% endif
% if acc == "long":
#define WORDS 2
% else:
#define WORDS 1
% endif

// A value as WORDS ints written with atomic exchanges, and read back with atomic reads.
inline void put_value(volatile __global int* at, ACC v)
{
% if acc == "long":
    const int2 w = as_int2(v);
    atomic_xchg(at, w.x);
    atomic_xchg(at + 1, w.y);
% else:
    atomic_xchg(at, as_int(v));
% endif
}

% if ptx_fence:
// NVIDIA: the look-back reads flags by acquire loads (the reads of the value behind a flag are
// ordered after it, no fence needed) and values by relaxed loads at GPU scope (served by L2,
// never a stale L1 line): plain loads, where an atomic read-modify-write per poll would queue
// at each flag's address behind every other group's polls.
inline int read_flag(volatile __global int* at)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"((ulong)at) : "memory");
    return v;
}

inline int read_word(volatile __global int* at)
{
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"((ulong)at) : "memory");
    return v;
}
% else:
// A flag read with an atomic, then a fence before the value behind it is read.
inline int read_flag(volatile __global int* at)
{
    const int v = atomic_or(at, 0);
    DEVICE_FENCE();
    return v;
}

#define read_word(at) atomic_or((at), 0)
% endif

inline ACC get_value(volatile __global int* at)
{
% if acc == "long":
    return as_long((int2)(read_word(at), read_word(at + 1)));
% else:
    return as_${acc}(read_word(at));
% endif
}

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void scan_lookback(index_t N, index_t chunks, int tiles, __global const ACC* x, index_t x_off,
                   __global ACC* y, index_t y_off, volatile __global int* status, int reverse)
{
    __local ACC buf[TILE + TILE / 32];
    __local ACC sums[GROUP];
    __local ACC window_value[WINDOW];
    __local int window_flag[WINDOW];
    __local int l_tile, l_look, l_done;
    __local ACC l_prefix;
    volatile __global int* flags = status + 2;
    volatile __global int* totals = flags + tiles;
    volatile __global int* prefixes = totals + tiles * WORDS;
    const int lid = get_local_id(0);
    if (lid == 0)
        l_tile = atomic_inc(status);
    barrier(CLK_LOCAL_MEM_FENCE);
    const int tile = l_tile;
    const index_t row = tile / chunks;
    const index_t c = tile % chunks;
    const index_t first = c * TILE;
    const index_t x_row = x_off + row * N, y_row = y_off + row * N;
% if vec:
    // A whole tile read forwards: 4-vectors (the host passes vec only where every row starts
    // on a 4-element boundary of both buffers).
    const int whole = !reverse && first + TILE <= N;
    if (whole) {
        __global const ACC4* xv = (__global const ACC4*)(x + x_row + first);
        for (int v = lid; v < TILE / 4; v += GROUP) {
            const ACC4 a = xv[v];
            buf[AT(4 * v)] = a.x;
            buf[AT(4 * v) + 1] = a.y;
            buf[AT(4 * v) + 2] = a.z;
            buf[AT(4 * v) + 3] = a.w;
        }
    } else
% endif
    for (int e = lid; e < TILE; e += GROUP) {
        const index_t p = first + e;
        buf[AT(e)] = p < N ? x[x_row + (reverse ? N - 1 - p : p)] : (ACC)0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ACC own = (ACC)0;
    for (int m = 0; m < LPER; ++m)
        own += buf[AT(lid * LPER + m)];
    sums[lid] = own;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int offset = 1; offset < GROUP; offset <<= 1) {
        const ACC add = lid >= offset ? sums[lid - offset] : (ACC)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        sums[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const ACC total = sums[GROUP - 1];
    if (lid == 0) {
        if (c == 0) {
            put_value(prefixes + tile * WORDS, total);
            DEVICE_FENCE();
            atomic_xchg(flags + tile, FLAG_PREFIX);
        } else {
            put_value(totals + tile * WORDS, total);
            DEVICE_FENCE();
            atomic_xchg(flags + tile, FLAG_AGG);
        }
        l_prefix = (ACC)0;
        l_look = tile - 1;
        l_done = c == 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // The look-back: WINDOW items read the flags (and values) of the WINDOW tiles before l_look;
    // item 0 adds the totals up to the nearest inclusive prefix, or up to the first tile not
    // published yet (the window then starts again from there). The row's first tile publishes
    // a prefix at once, so the walk never leaves the row. Every item runs the loop (barriers),
    // l_done deciding for all.
    while (!l_done) {
        if (lid < WINDOW) {
            const int t = l_look - lid;
            int f = 0;
            ACC v = (ACC)0;
            if (t >= tile - c) {
                f = read_flag(flags + t);
                if (f == FLAG_PREFIX)
                    v = get_value(prefixes + t * WORDS);
                else if (f == FLAG_AGG)
                    v = get_value(totals + t * WORDS);
            }
            window_flag[lid] = f;
            window_value[lid] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) {
            int w = 0;
            ACC run = l_prefix;
            while (w < WINDOW && window_flag[w] == FLAG_AGG)
                run += window_value[w++];
            if (w < WINDOW && window_flag[w] == FLAG_PREFIX) {
                run += window_value[w];
                l_done = 1;
            }
            l_prefix = run;
            l_look -= w;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const ACC prefix = l_prefix;
    if (lid == 0 && c > 0) {
        put_value(prefixes + tile * WORDS, prefix + total);
        DEVICE_FENCE();
        atomic_xchg(flags + tile, FLAG_PREFIX);
    }
    ACC run = prefix + sums[lid] - own;
    for (int m = 0; m < LPER; ++m) {
        run += buf[AT(lid * LPER + m)];
        buf[AT(lid * LPER + m)] = run;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% if vec:
    if (whole) {
        __global ACC4* yv = (__global ACC4*)(y + y_row + first);
        for (int v = lid; v < TILE / 4; v += GROUP)
            yv[v] = (ACC4)(buf[AT(4 * v)], buf[AT(4 * v) + 1], buf[AT(4 * v) + 2],
                           buf[AT(4 * v) + 3]);
    } else
% endif
    for (int e = lid; e < TILE; e += GROUP) {
        const index_t p = first + e;
        if (p < N)
            y[y_row + (reverse ? N - 1 - p : p)] = buf[AT(e)];
    }
    // The last group to finish sets the status back to zero for the next launch: every other
    // group has made its last access to it before counting itself finished.
    if (lid == 0) {
        DEVICE_FENCE();
        l_done = atomic_inc(status + 1) == tiles - 1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (l_done) {
        for (int t = lid; t < tiles; t += GROUP)
            atomic_xchg(flags + t, 0);
        if (lid == 0) {
            atomic_xchg(status, 0);
            atomic_xchg(status + 1, 0);
        }
    }
}
% elif part == "select":
#define KEY ${key}
#define KEY4 ${key}4
#define KMAX 1024
#define DIGITS 256
// Copies of the histogram, one per 32 items (NVIDIA's warps), so that items hitting the same
// digit at once spread over copies (shared-memory atomics on one address serialise).
#define COPIES (GROUP / 32 < 8 ? GROUP / 32 : 8)
// Vectors each item loads before counting any: several loads in flight per item.
#define UNROLL 4
% if key == "long":
#define UKEY ulong
#define KEY_BITS 64
% else:
#define UKEY uint
#define KEY_BITS 32
% endif

// The order-preserving unsigned key of v (larger: better).
inline UKEY order_key(KEY v, int largest)
{
% if key == "float":
    uint b = as_uint(v);
    if (isnan(v))
        b = 0xffffffffu;
    else if (v == 0.0f)
        b = 0x80000000u;
    else
        b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
% elif key == "long":
    UKEY b = as_ulong(v) ^ 0x8000000000000000ul;
% else:
    UKEY b = as_uint(v) ^ 0x80000000u;
% endif
    return largest ? b : ~b;
}

// Inclusive scan of scan[0..len) in place (Hillis-Steele, len <= GROUP); every item calls it.
inline void group_scan(__local int* scan, int len, int lid)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int offset = 1; offset < len; offset <<= 1) {
        const int add = lid < len && lid >= offset ? scan[lid - offset] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < len)
            scan[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

## Runs ``body`` for every entry p of the row with its key u, the items' loads of UNROLL
## vectors (or entries) issued before any body runs.
<%def name="each_key(body)">
    {
% if vec:
        __global const KEY4* srcv = (__global const KEY4*)src;
        const int nv = n / 4;
        for (int v0 = lid; v0 < nv; v0 += GROUP * UNROLL) {
            KEY4 a[UNROLL];
            for (int r = 0; r < UNROLL; ++r)
                if (v0 + r * GROUP < nv)
                    a[r] = srcv[v0 + r * GROUP];
            for (int r = 0; r < UNROLL; ++r) {
                if (v0 + r * GROUP < nv) {
                    const KEY e[4] = {a[r].x, a[r].y, a[r].z, a[r].w};
                    for (int c = 0; c < 4; ++c) {
                        const int p = 4 * (v0 + r * GROUP) + c;
                        const UKEY u = order_key(e[c], largest);
                        ${body}
                    }
                }
            }
        }
        for (int p = 4 * nv + lid; p < n; p += GROUP) {
            const UKEY u = order_key(src[p], largest);
            ${body}
        }
% else:
        for (int p0 = lid; p0 < n; p0 += GROUP * UNROLL) {
            KEY a[UNROLL];
            for (int r = 0; r < UNROLL; ++r)
                if (p0 + r * GROUP < n)
                    a[r] = src[p0 + r * GROUP];
            for (int r = 0; r < UNROLL; ++r) {
                if (p0 + r * GROUP < n) {
                    const int p = p0 + r * GROUP;
                    const UKEY u = order_key(a[r], largest);
                    ${body}
                }
            }
        }
% endif
    }
</%def>

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void topk_radix(int n, int k, __global const KEY* x, index_t x_off, __global KEY* values,
                index_t v_off, __global long* indices, index_t i_off, int largest)
{
    __local int hist[COPIES * DIGITS];
    __local int scan[GROUP];
    __local UKEY lkey[KMAX];
    __local int lidx[KMAX];
    __local UKEY l_prefix, l_mask;
    __local int l_need, l_equal, l_above, l_taken;
    const int lid = get_local_id(0);
    const index_t row = get_group_id(0);
    __global const KEY* src = x + x_off + row * n;
    __local int* own_hist = hist + ((lid / 32) % COPIES) * DIGITS;
    if (lid == 0) {
        l_prefix = 0;
        l_mask = 0;
        l_need = k;
        l_equal = n;
    }
    for (int shift = KEY_BITS - 8; shift >= 0; shift -= 8) {
        for (int d = lid; d < COPIES * DIGITS; d += GROUP)
            hist[d] = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        const UKEY prefix = l_prefix, mask = l_mask;
        const int need = l_need;
        // Once every entry agreeing with the chosen digits is needed, the prefix decides: the
        // remaining passes count nothing (and keep their barriers, outside any branch: PoCL
        // does not keep barriers in a branch apart).
        const int done = l_equal == need;
        if (!done)
            ${each_key("if ((u & mask) == prefix) atomic_inc(&own_hist[(int)(u >> shift) & (DIGITS - 1)]);")}
        // Counts from the largest digit down: item i < DIGITS holds digits 255 - i and up.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < DIGITS) {
            int count = 0;
            for (int c = 0; c < COPIES; ++c)
                count += hist[c * DIGITS + DIGITS - 1 - lid];
            scan[lid] = count;
        }
        group_scan(scan, DIGITS, lid);
        if (!done && lid < DIGITS) {
            const int above = lid > 0 ? scan[lid - 1] : 0;
            if (scan[lid] >= need && above < need) {
                const int digit = DIGITS - 1 - lid;
                l_prefix = prefix | ((UKEY)digit << shift);
                l_mask = mask | ((UKEY)(DIGITS - 1) << shift);
                l_need = need - above;
                l_equal = scan[lid] - above;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const UKEY prefix = l_prefix, mask = l_mask;
    const int need = l_need;
    const int all_equal = l_equal == need;
    if (lid == 0) {
        l_above = 0;
        l_taken = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Entries above the prefix (k - need of them) in slots [0, k - need), in any order (the sort
    // below orders them); those equal to it after them, all of them where all are needed.
    ${each_key("""const UKEY top = u & mask;
                        int slot = -1;
                        if (top > prefix)
                            slot = atomic_inc(&l_above);
                        else if (all_equal && top == prefix)
                            slot = k - need + atomic_inc(&l_taken);
                        if (slot >= 0) {
                            lkey[slot] = u;
                            lidx[slot] = p;
                        }""")}
    // Where more entries equal the k-th key than are needed: the first ``need`` by position.
    // Item i counts the equal entries of its run of positions, an exclusive scan of the counts
    // gives its first slot, and it takes its entries while slots remain.
    const int run = (n + GROUP - 1) / GROUP;
    const int begin = min(n, lid * run), end = min(n, begin + run);
    int count = 0;
    if (!all_equal)
        for (int p = begin; p < end; ++p)
            count += order_key(src[p], largest) == prefix;
    scan[lid] = count;
    group_scan(scan, GROUP, lid);
    if (!all_equal) {
        int slot = k - need + scan[lid] - count;
        for (int p = begin; p < end && slot < k; ++p) {
            const UKEY u = order_key(src[p], largest);
            if (u == prefix) {
                lkey[slot] = u;
                lidx[slot] = p;
                ++slot;
            }
        }
    }
    // Padding up to a power of two, after every entry.
    int P = 1;
    while (P < k)
        P <<= 1;
    for (int e = k + lid; e < P; e += GROUP) {
        lkey[e] = 0;
        lidx[e] = -1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Bitonic sort: larger key first, then lower position; padding (position -1) last.
    for (int size = 2; size <= P; size <<= 1) {
        for (int j = size >> 1; j > 0; j >>= 1) {
            for (int q = lid; q < P / 2; q += GROUP) {
                const int i = (q / j) * 2 * j + q % j;
                const int partner = i + j;
                const UKEY a = lkey[i], b = lkey[partner];
                const int ia = lidx[i], ib = lidx[partner];
                // Whether b belongs before a.
                const int b_first = ia < 0 ? ib >= 0
                                  : ib >= 0 && (b > a || (b == a && ib < ia));
                const int first_half = (i & size) == 0;
                if (first_half ? b_first : (!b_first && ia != ib)) {
                    lkey[i] = b;
                    lkey[partner] = a;
                    lidx[i] = ib;
                    lidx[partner] = ia;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    for (int e = lid; e < k; e += GROUP) {
        const int p = lidx[e];
        values[v_off + row * k + e] = src[p];
        indices[i_off + row * k + e] = p;
    }
}
% else:
#define TILE (2 * GROUP)
#define KEY ${key}

// Whether (a, ia) comes before (b, ib) in the order above.
inline int before(KEY a, long ia, KEY b, long ib, int desc)
{
    if (ia < 0)
        return 0;
    if (ib < 0)
        return 1;
% if key in ("float", "half"):
    const int an = isnan(a), bn = isnan(b);
    if (an || bn) {
        if (an && bn)
            return ia < ib;
        return desc ? an : bn;
    }
% endif
    if (a != b)
        return desc ? a > b : a < b;
    return ia < ib;
}

inline void exchange(__local KEY* lk, __local long* li, int i, int partner, int ascending,
                     int desc)
{
    const KEY a = lk[i], b = lk[partner];
    const long ia = li[i], ib = li[partner];
    if (ascending ? before(b, ib, a, ia, desc) : before(a, ia, b, ib, desc)) {
        lk[i] = b;
        lk[partner] = a;
        li[i] = ib;
        li[partner] = ia;
    }
}

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void sort_tile(index_t rows, index_t n, index_t tiles, int segment,
               __global const KEY* kin, index_t kin_off, index_t kin_stride,
               __global const long* iin, index_t iin_off, int has_idx,
               __global KEY* kout, index_t kout_off, index_t kout_stride,
               __global long* iout, index_t iout_off, index_t keep,
               index_t merge_k, int local_dir, int desc)
{
    __local KEY lk[TILE];
    __local long li[TILE];
    const int lid = get_local_id(0);
    // segment < TILE (short rows, tiles == 1): TILE / segment rows share the work-group, each
    // in a segment of its own.
    const int per = TILE / segment;
    const index_t tile = get_group_id(0) % tiles;
    const index_t first_row = (get_group_id(0) / tiles) * per;
    const index_t base = tile * TILE;
    for (int e = lid; e < TILE; e += GROUP) {
        const index_t row = first_row + e / segment;
        const index_t p = base + e % segment;
        if (row < rows && p < n) {
            lk[e] = kin[kin_off + row * kin_stride + p];
            li[e] = has_idx ? iin[iin_off + row * kin_stride + p] : (long)p;
        } else {
            lk[e] = (KEY)0;
            li[e] = -1;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Each item exchanges one pair per step: TILE / 2 == GROUP pairs. With local_dir the last
    // stage sorts every segment ascending; without, directions follow the row's network.
    const index_t offset = local_dir ? 0 : base;
    if (merge_k == 0) {
        for (int k = 2; k <= segment; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                const int i = (lid / j) * 2 * j + lid % j;
                const int ascending = (local_dir && k == segment) || ((offset + i) & k) == 0;
                exchange(lk, li, i, i + j, ascending, desc);
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
    } else {
        for (int j = TILE >> 1; j > 0; j >>= 1) {
            const int i = (lid / j) * 2 * j + lid % j;
            exchange(lk, li, i, i + j, ((base + i) & merge_k) == 0, desc);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    for (int e = lid; e < per * keep; e += GROUP) {
        const index_t row = first_row + e / keep;
        const int q = e % keep;
        if (row < rows) {
            const index_t at = row * kout_stride + tile * keep + q;
            kout[kout_off + at] = lk[(e / keep) * segment + q];
            iout[iout_off + at] = li[(e / keep) * segment + q];
        }
    }
}

__kernel void sort_step(index_t pairs, index_t P, index_t k, index_t j, __global KEY* keys,
                        __global long* idx, int desc)
{
    const index_t half_row = P / 2;
    for (index_t t = get_global_id(0); t < pairs; t += get_global_size(0)) {
        const index_t row = t / half_row;
        const index_t q = t % half_row;
        const index_t i = (q / j) * 2 * j + q % j;
        const index_t a = row * P + i, b = a + j;
        const KEY ka = keys[a], kb = keys[b];
        const long ia = idx[a], ib = idx[b];
        const int ascending = (i & k) == 0;
        if (ascending ? before(kb, ib, ka, ia, desc) : before(ka, ia, kb, ib, desc)) {
            keys[a] = kb;
            keys[b] = ka;
            idx[a] = ib;
            idx[b] = ia;
        }
    }
}
% endif
