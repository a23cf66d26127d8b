## Definitions shared by the GEMM kernels (gemm_tiled.cl.mako with gemm_splitk.cl.mako,
## gemm_small.cl.mako, gemm_subgroup.cl.mako: one file per kernel, as CLBlast splits xgemm);
## not a kernel family of its own. Import with
##     <%namespace name="common" file="gemm_common.cl.mako"/>
## and render header() first. Python helpers for the kernels' own code generation:
## common.attr.fold (a column's element offset) and common.attr.hoists_chain.
##
## The template parameters every GEMM kernel takes are documented in header(), which renders
## them into the source.
<%namespace name="links" file="fusion_fold.cl.mako"/>
<%namespace name="access" file="memory_access.cl.mako"/>
<%!
def hoists_chain(chain, channel, epilogue):
    """Whether gemm_tiled computes a per-channel chain once per register-block row (channels on
    rows); its split-K pass (raw sums, the epilogue in gemm_splitk_reduce) does not."""
    return (bool(chain) and epilogue == "conv" and channel == 2
            and not any(per_position for _, per_position in chain))


def fold(mode, op, j):
    """Expression for the element offset of column ``j`` of operand ``op`` ("a", "b", "c")."""
    if mode == 0:
        return f"((long)({j}))"
    if mode == 1:
        return f"fold_dense({j}, f{op}_p, f{op}_img)"
    return f"fold_strided({j}, f{op}_p, f{op}_img, f{op}_w, f{op}_row, f{op}_col)"
%>
<%def name="header()">
// GEMM family: C = act(alpha * op(A) @ op(B) + beta * C + bias), float32, row-major; or, in
// the convolution's order, C = act(alpha * op(A) @ op(B) * scale + bias + ra * R) + beta * C.
//
// Every matrix is a (buffer, element offset, leading dimension) triple; a batch adds an element
// stride per operand (0 broadcasts one matrix over the batch). op(A) is M x K, op(B) is K x N,
// C is M x N. Sizes, offsets, leading dimensions, strides, alpha and beta are run-time
// arguments; beta == 0 never reads C (C may hold NaN).
//
// Template parameters of every GEMM kernel (each kernel's own follow):
//   TRANS_A       1: A is stored K x M (op(A) = A^T); 0: stored M x K
//   TRANS_B       1: B is stored N x K (op(B) = B^T); 0: stored K x N
//   BIAS          0: none; 1: bias[N] added to every row ("n", linear layers);
//                 2: bias[M] added to every column ("m", convolution: M = output channels);
//                 3: one value per row and column of an image ("position": bias[row * Q + q],
//                 q the column within its image, Q the columns per image: P when C is folded,
//                 else N), "conv" order only
//   EPILOGUE      "gemm": act(alpha * acc + beta * C + bias); "conv": the convolution's
//                 act(alpha * acc * scale + bias + residual_alpha * R) + beta * C
//   SCALE         like BIAS, for the factor scale ("conv" order only; 0: none)
//   RESIDUAL      1: add residual_alpha * R, R laid out exactly like C (its own buffer and
//                 offset; C's leading dimension, fold and batch stride), "conv" order only
//   CHAIN         list of (kind, per_position), kind "bias" or "bn": a fusion plan's bias /
//                 batch-norm-inference chain ("conv" order only, with SCALE = BIAS = 0). Every
//                 kernel then takes the chain's parameters last (fusion_fold.cl.mako's
//                 chain_params) and the epilogue computes the chain's scale and shift from them
//                 (per channel, or per position as BIAS 3 addresses it for per_position links);
//                 gemm_tiled computes a per-channel chain once per register-block row.
//   CHAIN_CHANNEL 2: the channel is the row (NCHW convolution), 1: the column (NHWC)
//   ACTIVATION    OpenCL C expression of act(x) in the variable x, or "" for none
//   AB_TYPE       storage of A and B: "float"; "half" (float16) or "bfloat16", 16-bit values
//                 (gemm_small and gemm_mma only) held as ushort bit patterns, products summed
//                 in float32. No cl_khr_fp16 is needed: a half is read by vload_half at a
//                 `half *` cast from a ushort address (no arithmetic on half pointers)
//   C_TYPE        storage of C and of the bias: "float", or AB_TYPE's 16-bit type (then the
//                 "gemm" order only); a result stored in 16 bits rounds to nearest even
//   FOLD_A, FOLD_B, FOLD_C  how the operand's contiguous (stored column) dimension j is
//                 addressed: 0 plainly (j); 1 folded, j = n * P + p at n * img + p; 2 folded
//                 and strided (A and B only), at n * img + (p / fw) * frow + (p % fw) * fcol.
//                 P, img, fw, frow, fcol are run-time arguments (f{a,b,c}_*). A folded
//                 operand is a batch of NCHW images seen as one matrix: a 1x1 convolution's
//                 x (C x N*H*W), y (K x N*Ho*Wo), or its stride-2 input sampled in place. A may
//                 be folded only along K (not TRANS_A), B along N (not TRANS_B) or K (TRANS_B),
//                 C along N. The division by P runs once per tile load or store, not per FMA.

<%
    storage = {"float": "float", "half": "ushort", "bfloat16": "ushort"}
%>
% if "bfloat16" in (AB_TYPE, C_TYPE):
${access.bfloat16_conversions()}
% endif
// Element i of a matrix of AB_TYPE (A and B) or C_TYPE (C, bias) as a float, and a float
// stored into one of C_TYPE.
#define AB_T ${storage[AB_TYPE]}
#define C_T ${storage[C_TYPE]}
% for prefix, kind in (("AB", AB_TYPE), ("C", C_TYPE)):
%   if kind == "float":
#define LOAD_${prefix}(p, i) ((p)[i])
%   elif kind == "half":
#define LOAD_${prefix}(p, i) vload_half(0, (__global const half *)((p) + (i)))
%   else:
#define LOAD_${prefix}(p, i) bf16_to_float((p)[i])
%   endif
% endfor
% if C_TYPE == "float":
#define STORE_C(p, i, v) ((p)[i] = (v))
% elif C_TYPE == "half":
#define STORE_C(p, i, v) vstore_half_rte((v), 0, (__global half *)((p) + (i)))
% else:
#define STORE_C(p, i, v) ((p)[i] = float_to_bf16(v))
% endif

// Element offset of column j of a folded operand (FOLD 1, then FOLD 2).
inline long fold_dense(int j, int P, long img)
{
    const int n = j / P;
    return n * img + (j - n * P);
}

inline long fold_strided(int j, int P, long img, int fw, int frow, int fcol)
{
    const int n = j / P;
    const int p = j - n * P;
    const int h = p / fw;
    return n * img + (long)h * frow + (long)(p - h * fw) * fcol;
}
</%def>

<%def name="chain_params()">
% if EPILOGUE == "conv" and CHAIN:
${links.chain_params(CHAIN)}
% endif
</%def>

<%def name="epilogue(value, row, col, index, i=None)">
<%
    # Only gemm_tiled passes i, the register-block row whose chain it computed up front.
    chain_hoisted = i is not None and hoists_chain(CHAIN, CHAIN_CHANNEL, EPILOGUE)
    def at(kind):
        if kind == 1:
            return f"({col})"
        if kind == 2:
            return f"({row})"
        if FOLD_C:
            return f"((long)({row}) * fc_p + ({col}) % fc_p)"
        return f"((long)({row}) * N + ({col}))"
%>
        {
            float x = alpha * (${value});
% if EPILOGUE == "conv":
%   if CHAIN and chain_hoisted:
            x = x * ep_scale${i} + ep_shift${i};
%   elif CHAIN:
            ${links.apply_chain(row if CHAIN_CHANNEL == 2 else col, at(3), CHAIN, "ep_scale", "ep_shift")}
            x = x * ep_scale + ep_shift;
%   endif
%   if SCALE:
            x *= scale[scale_off + ${at(SCALE)}];
%   endif
%   if BIAS:
            x += LOAD_C(bias, bias_off + ${at(BIAS)});
%   endif
%   if RESIDUAL:
            x += residual_alpha * R[${index}];
%   endif
%   if ACTIVATION:
            x = ${ACTIVATION};
%   endif
            if (beta != 0.0f)
                x += beta * LOAD_C(C, ${index});
% else:
            if (beta != 0.0f)
                x += beta * LOAD_C(C, ${index});
%   if BIAS:
            x += LOAD_C(bias, bias_off + ${at(BIAS)});
%   endif
%   if ACTIVATION:
            x = ${ACTIVATION};
%   endif
% endif
            STORE_C(C, ${index}, x);
        }
</%def>
