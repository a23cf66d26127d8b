## Batch normalisation in training mode fused with an activation, forward and backward
## (MIOpen's BnFwdTrgActivationFused / BnBwdTrgActivationFused).
##
## Layout: the input is viewed as (N, C, S): element (n, c, s) lies at off + (n * C + c) * S + s.
## Spatial batch norm of an NCHW tensor is (N, C, H*W); per-activation batch norm is
## (N, C*H*W, 1), so one kernel serves both modes. One work-group owns one channel c: it reduces
## the channel's N*S elements in local memory and then writes them, so statistics, normalisation
## and activation (or the whole backward) take one launch and no global scratch memory.
##
## Forward, per channel:  mean, var = biased statistics of x over (N, S)
##                        y = act((x - mean) / sqrt(var + eps) * scale + bias)
##                        saved_mean = mean, saved_inv_variance = 1 / sqrt(var + eps)
##                        running = (1 - factor) * running + factor * (mean, unbiased var)
## Backward, per channel: z = x_hat * scale + bias (recomputed from the saved statistics),
##                        dz = dy * act'(z); dbias = sum dz; dscale = sum dz * x_hat
##                        dx = scale * inv_std / M * (M * dz - dbias - x_hat * dscale), M = N*S
##
## Large channels are split into chunks so that the whole device works (one work-group per
## channel leaves most of a GPU idle when C is small and N*S large): with chunks > 1,
##   *_partial   work-group (j, c) reduces chunk j of channel c into partials[(c * chunks + j) * 2]
##               (forward: sums of d and d^2 with d = x - origin, origin the channel's first
##               element (0 where that is not finite), a shift that keeps the variance free of
##               cancellation; backward: sums of dz and dz * x_hat);
##   *_apply     work-group (j, c) adds the channel's partials up again (chunks values, cheap),
##               writes its chunk of the output, and chunk 0 writes the per-channel results.
## Chunk j covers the channel's elements [j * chunk_len, min(M, (j + 1) * chunk_len)).
##
## Template parameters:
##   group_size     work-items per work-group (a power of two); one work-group per channel
##   index_t        "int" when every element index fits in 31 bits, else "long"
##   act_forward    OpenCL C expression of act(z) over the variable `z`
##   act_derivative OpenCL C expression of act'(z) over the variables `z` and `a` (a = act(z))
##   vec            elements per load: 4 (float4 loads and stores; needs S, the chunk length and
##                  every tensor offset divisible by 4, which the host checks) or 1
##
## The loops walk packets of `vec` consecutive elements of one (n, c) plane: with S divisible
## by vec a packet never crosses planes, so the (n, s) split costs one division per packet.
#define GROUP_SIZE ${group_size}
#define VEC ${vec}
typedef ${index_t} index_t;

inline float act_f(float z) { return ${act_forward}; }
inline float act_d(float z, float a) { return ${act_derivative}; }

% if vec == 4:
typedef float4 floatv;
#define LOADV(p, e) (*(__global const float4*)((p) + (e)))
#define STOREV(p, e, v) (*(__global float4*)((p) + (e)) = (v))
#define HSUM(v) (((v).x + (v).y) + ((v).z + (v).w))
#define ACTV(z) ((float4)(act_f((z).x), act_f((z).y), act_f((z).z), act_f((z).w)))
#define DERV(z, a) ((float4)(act_d((z).x, (a).x), act_d((z).y, (a).y), \
                             act_d((z).z, (a).z), act_d((z).w, (a).w)))
% else:
typedef float floatv;
#define LOADV(p, e) ((p)[e])
#define STOREV(p, e, v) ((p)[e] = (v))
#define HSUM(v) (v)
#define ACTV(z) act_f(z)
#define DERV(z, a) act_d(z, a)
% endif

// Tree reduction of two float arrays of GROUP_SIZE in local memory at once; the sums end in [0].
inline void reduce_sum2(__local float* first, __local float* second, int lid)
{
    for (int step = GROUP_SIZE / 2; step > 0; step >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < step) {
            first[lid] += first[lid + step];
            second[lid] += second[lid + step];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

// The chunked kernels' shift: the channel's first element, or 0 where it is not finite (an
// infinity there would make every x - origin NaN, where torch's mean is that infinity).
inline float stats_origin(float first)
{
    return isfinite(first) ? first : 0.0f;
}

inline index_t element_index(index_t i, index_t C, index_t S, index_t c)
{
    // i runs over the channel's N*S elements: i = n * S + s.
    index_t n = i / S;
    index_t s = i - n * S;
    return (n * C + c) * S + s;
}

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_forward_activation(
    index_t N, index_t C, index_t S,
    __global const float* restrict x, index_t x_off,
    __global float* restrict y, index_t y_off,
    __global const float* restrict scale, index_t scale_off,
    __global const float* restrict bias, index_t bias_off,
    __global float* restrict saved_mean, index_t saved_mean_off,
    __global float* restrict saved_inv_variance, index_t saved_inv_variance_off,
    __global float* restrict running_mean, index_t running_mean_off,
    __global float* restrict running_variance, index_t running_variance_off,
    float exp_avg_factor, float epsilon, int save_statistics, int update_running)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t c = get_group_id(0);
    const index_t M = N * S;

    float sum = 0.0f;
    for (index_t q = lid; q < M / VEC; q += GROUP_SIZE)
        sum += HSUM(LOADV(x, x_off + element_index(q * VEC, C, S, c)));
    first[lid] = sum;
    second[lid] = 0.0f;
    reduce_sum2(first, second, lid);
    const float mean = first[0] / (float)M;
    barrier(CLK_LOCAL_MEM_FENCE);

    // A second pass around the mean: sum(x^2) - M*mean^2 cancels badly in float32.
    float squares = 0.0f;
    for (index_t q = lid; q < M / VEC; q += GROUP_SIZE) {
        floatv d = LOADV(x, x_off + element_index(q * VEC, C, S, c)) - mean;
        squares += HSUM(d * d);
    }
    first[lid] = squares;
    second[lid] = 0.0f;
    reduce_sum2(first, second, lid);
    const float variance = first[0] / (float)M;
    const float inv_std = 1.0f / sqrt(variance + epsilon);
    const float gain = scale[scale_off + c] * inv_std;
    const float shift = bias[bias_off + c] - mean * gain;

    for (index_t q = lid; q < M / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv z = LOADV(x, x_off + e) * gain + shift;
        STOREV(y, y_off + e, ACTV(z));
    }
    if (lid == 0) {
        if (save_statistics) {
            saved_mean[saved_mean_off + c] = mean;
            saved_inv_variance[saved_inv_variance_off + c] = inv_std;
        }
        if (update_running) {
            float unbiased = M > 1 ? variance * (float)M / (float)(M - 1) : variance;
            running_mean[running_mean_off + c] =
                (1.0f - exp_avg_factor) * running_mean[running_mean_off + c] + exp_avg_factor * mean;
            running_variance[running_variance_off + c] =
                (1.0f - exp_avg_factor) * running_variance[running_variance_off + c]
                + exp_avg_factor * unbiased;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_backward_activation(
    index_t N, index_t C, index_t S,
    __global const float* restrict x, index_t x_off,
    __global const float* restrict dy, index_t dy_off,
    __global float* restrict dx, index_t dx_off,
    __global const float* restrict scale, index_t scale_off,
    __global const float* restrict bias, index_t bias_off,
    __global const float* restrict saved_mean, index_t saved_mean_off,
    __global const float* restrict saved_inv_variance, index_t saved_inv_variance_off,
    __global float* restrict scale_diff, index_t scale_diff_off,
    __global float* restrict bias_diff, index_t bias_diff_off)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t c = get_group_id(0);
    const index_t M = N * S;
    const float mean = saved_mean[saved_mean_off + c];
    const float inv_std = saved_inv_variance[saved_inv_variance_off + c];
    const float gamma = scale[scale_off + c];
    const float beta = bias[bias_off + c];

    float sum_dz = 0.0f, sum_dz_xhat = 0.0f;
    for (index_t q = lid; q < M / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv x_hat = (LOADV(x, x_off + e) - mean) * inv_std;
        floatv z = x_hat * gamma + beta;
        floatv a = ACTV(z);
        floatv dz = LOADV(dy, dy_off + e) * DERV(z, a);
        sum_dz += HSUM(dz);
        sum_dz_xhat += HSUM(dz * x_hat);
    }
    first[lid] = sum_dz;
    second[lid] = sum_dz_xhat;
    reduce_sum2(first, second, lid);
    const float total_dz = first[0];
    const float total_dz_xhat = second[0];

    const float factor = gamma * inv_std / (float)M;
    for (index_t q = lid; q < M / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv x_hat = (LOADV(x, x_off + e) - mean) * inv_std;
        floatv z = x_hat * gamma + beta;
        floatv a = ACTV(z);
        floatv dz = LOADV(dy, dy_off + e) * DERV(z, a);
        STOREV(dx, dx_off + e, factor * ((float)M * dz - total_dz - x_hat * total_dz_xhat));
    }
    if (lid == 0) {
        scale_diff[scale_diff_off + c] = total_dz_xhat;
        bias_diff[bias_diff_off + c] = total_dz;
    }
}

// ---- chunked variants -------------------------------------------------------------------------

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_forward_partial(
    index_t N, index_t C, index_t S, index_t chunk_len,
    __global const float* restrict x, index_t x_off,
    __global float* restrict partials)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t j = get_group_id(0);
    const index_t c = get_group_id(1);
    const index_t chunks = get_num_groups(0);
    const index_t M = N * S;
    const float origin = stats_origin(x[x_off + element_index(0, C, S, c)]);
    const index_t end = min(M, (j + 1) * chunk_len);
    float sum = 0.0f, squares = 0.0f;
    for (index_t q = j * chunk_len / VEC + lid; q < end / VEC; q += GROUP_SIZE) {
        floatv d = LOADV(x, x_off + element_index(q * VEC, C, S, c)) - origin;
        sum += HSUM(d);
        squares += HSUM(d * d);
    }
    first[lid] = sum;
    second[lid] = squares;
    reduce_sum2(first, second, lid);
    if (lid == 0) {
        partials[(c * chunks + j) * 2] = first[0];
        partials[(c * chunks + j) * 2 + 1] = second[0];
    }
}

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_forward_apply(
    index_t N, index_t C, index_t S, index_t chunk_len,
    __global const float* restrict x, index_t x_off,
    __global float* restrict y, index_t y_off,
    __global const float* restrict scale, index_t scale_off,
    __global const float* restrict bias, index_t bias_off,
    __global float* restrict saved_mean, index_t saved_mean_off,
    __global float* restrict saved_inv_variance, index_t saved_inv_variance_off,
    __global float* restrict running_mean, index_t running_mean_off,
    __global float* restrict running_variance, index_t running_variance_off,
    float exp_avg_factor, float epsilon, int save_statistics, int update_running,
    __global const float* restrict partials)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t j = get_group_id(0);
    const index_t c = get_group_id(1);
    const index_t chunks = get_num_groups(0);
    const index_t M = N * S;
    float sum = 0.0f, squares = 0.0f;
    for (index_t k = lid; k < chunks; k += GROUP_SIZE) {
        sum += partials[(c * chunks + k) * 2];
        squares += partials[(c * chunks + k) * 2 + 1];
    }
    first[lid] = sum;
    second[lid] = squares;
    reduce_sum2(first, second, lid);
    const float origin = stats_origin(x[x_off + element_index(0, C, S, c)]);
    const float shifted_mean = first[0] / (float)M;
    const float mean = origin + shifted_mean;
    // Clamped at 0 against rounding; a NaN stays (fmax would make it 0): an infinity or NaN
    // in the channel makes its outputs and running variance NaN, as in torch.
    const float variance_raw = second[0] / (float)M - shifted_mean * shifted_mean;
    const float variance = variance_raw < 0.0f ? 0.0f : variance_raw;
    const float inv_std = 1.0f / sqrt(variance + epsilon);
    const float gain = scale[scale_off + c] * inv_std;
    const float shift = bias[bias_off + c] - mean * gain;

    const index_t end = min(M, (j + 1) * chunk_len);
    for (index_t q = j * chunk_len / VEC + lid; q < end / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv z = LOADV(x, x_off + e) * gain + shift;
        STOREV(y, y_off + e, ACTV(z));
    }
    if (j == 0 && lid == 0) {
        if (save_statistics) {
            saved_mean[saved_mean_off + c] = mean;
            saved_inv_variance[saved_inv_variance_off + c] = inv_std;
        }
        if (update_running) {
            float unbiased = M > 1 ? variance * (float)M / (float)(M - 1) : variance;
            running_mean[running_mean_off + c] =
                (1.0f - exp_avg_factor) * running_mean[running_mean_off + c] + exp_avg_factor * mean;
            running_variance[running_variance_off + c] =
                (1.0f - exp_avg_factor) * running_variance[running_variance_off + c]
                + exp_avg_factor * unbiased;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_backward_partial(
    index_t N, index_t C, index_t S, index_t chunk_len,
    __global const float* restrict x, index_t x_off,
    __global const float* restrict dy, index_t dy_off,
    __global const float* restrict scale, index_t scale_off,
    __global const float* restrict bias, index_t bias_off,
    __global const float* restrict saved_mean, index_t saved_mean_off,
    __global const float* restrict saved_inv_variance, index_t saved_inv_variance_off,
    __global float* restrict partials)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t j = get_group_id(0);
    const index_t c = get_group_id(1);
    const index_t chunks = get_num_groups(0);
    const index_t M = N * S;
    const float mean = saved_mean[saved_mean_off + c];
    const float inv_std = saved_inv_variance[saved_inv_variance_off + c];
    const float gamma = scale[scale_off + c];
    const float beta = bias[bias_off + c];
    const index_t end = min(M, (j + 1) * chunk_len);
    float sum_dz = 0.0f, sum_dz_xhat = 0.0f;
    for (index_t q = j * chunk_len / VEC + lid; q < end / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv x_hat = (LOADV(x, x_off + e) - mean) * inv_std;
        floatv z = x_hat * gamma + beta;
        floatv a = ACTV(z);
        floatv dz = LOADV(dy, dy_off + e) * DERV(z, a);
        sum_dz += HSUM(dz);
        sum_dz_xhat += HSUM(dz * x_hat);
    }
    first[lid] = sum_dz;
    second[lid] = sum_dz_xhat;
    reduce_sum2(first, second, lid);
    if (lid == 0) {
        partials[(c * chunks + j) * 2] = first[0];
        partials[(c * chunks + j) * 2 + 1] = second[0];
    }
}

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void bn_train_backward_apply(
    index_t N, index_t C, index_t S, index_t chunk_len,
    __global const float* restrict x, index_t x_off,
    __global const float* restrict dy, index_t dy_off,
    __global float* restrict dx, index_t dx_off,
    __global const float* restrict scale, index_t scale_off,
    __global const float* restrict bias, index_t bias_off,
    __global const float* restrict saved_mean, index_t saved_mean_off,
    __global const float* restrict saved_inv_variance, index_t saved_inv_variance_off,
    __global float* restrict scale_diff, index_t scale_diff_off,
    __global float* restrict bias_diff, index_t bias_diff_off,
    __global const float* restrict partials)
{
    __local float first[GROUP_SIZE];
    __local float second[GROUP_SIZE];
    const int lid = get_local_id(0);
    const index_t j = get_group_id(0);
    const index_t c = get_group_id(1);
    const index_t chunks = get_num_groups(0);
    const index_t M = N * S;
    float sum_dz = 0.0f, sum_dz_xhat = 0.0f;
    for (index_t k = lid; k < chunks; k += GROUP_SIZE) {
        sum_dz += partials[(c * chunks + k) * 2];
        sum_dz_xhat += partials[(c * chunks + k) * 2 + 1];
    }
    first[lid] = sum_dz;
    second[lid] = sum_dz_xhat;
    reduce_sum2(first, second, lid);
    const float total_dz = first[0];
    const float total_dz_xhat = second[0];
    const float mean = saved_mean[saved_mean_off + c];
    const float inv_std = saved_inv_variance[saved_inv_variance_off + c];
    const float gamma = scale[scale_off + c];
    const float beta = bias[bias_off + c];
    const float factor = gamma * inv_std / (float)M;
    const index_t end = min(M, (j + 1) * chunk_len);
    for (index_t q = j * chunk_len / VEC + lid; q < end / VEC; q += GROUP_SIZE) {
        index_t e = element_index(q * VEC, C, S, c);
        floatv x_hat = (LOADV(x, x_off + e) - mean) * inv_std;
        floatv z = x_hat * gamma + beta;
        floatv a = ACTV(z);
        floatv dz = LOADV(dy, dy_off + e) * DERV(z, a);
        STOREV(dx, dx_off + e, factor * ((float)M * dz - total_dz - x_hat * total_dz_xhat));
    }
    if (j == 0 && lid == 0) {
        scale_diff[scale_diff_off + c] = total_dz_xhat;
        bias_diff[bias_diff_off + c] = total_dz;
    }
}
