## Pointwise and broadcast kernels generated from a C statement.
##
## Each work item computes output elements i = base + u * global_size for u < UNROLL, then moves
## base on by UNROLL * global_size (grid-stride loop). All UNROLL elements' inputs are loaded
## before any is used, so that each work item keeps several independent loads in flight: one
## load at a time leaves a GPU's memory system idle (about 70% of copy bandwidth on an H200).
## The output index space has NDIM dimensions (after the caller merged every pair of
## dimensions that is contiguous for all operands); each input reads at
## off + sum_k coord_k * stride_k, with stride 0 along broadcast dimensions. Outputs are dense.
##
## Template parameters:
##   name        kernel name
##   ndim        number of dimensions of the index space (>= 1)
##   unroll      elements per work item and loop step (>= 1)
##   inputs      list of (name, OpenCL C type) read before the statement
##   outputs     list of (name, OpenCL C type) the statement assigns
##   scalars     list of (name, OpenCL C type) passed by value
##   statement   C statement(s) that assign every output from inputs and scalars; it may use
##               i, the output element's index (so <out>_buf[<out>_off + i] is its old value)
##   index_t     "int" when every index (including base + unroll * global size) fits in 31 bits,
##               else "long" (integer division is several times cheaper in 32 bits on GPUs)
##   preamble    extra C code placed before the kernel (helper functions), may be ""
<%
    dims = range(ndim)
    lanes = range(unroll)
%>
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
${preamble}

__kernel void ${name}(
    ${index_t} total
% for k in dims:
    , ${index_t} size${k}
% endfor
% for nm, ty in inputs:
    , __global const ${ty}* restrict ${nm}_buf, ${index_t} ${nm}_off
  % for k in dims:
    , ${index_t} ${nm}_stride${k}
  % endfor
% endfor
% for nm, ty in outputs:
    , __global ${ty}* restrict ${nm}_buf, ${index_t} ${nm}_off
% endfor
% for nm, ty in scalars:
    , ${ty} ${nm}
% endfor
    )
{
    const ${index_t} step = get_global_size(0);
    for (${index_t} base = get_global_id(0); base < total; base += ${unroll} * step) {
% for u in lanes:
        const ${index_t} i${u} = base + ${u} * step;
    % for nm, ty in inputs:
        ${ty} ${nm}${u} = 0;
    % endfor
        if (i${u} < total) {
    % if ndim == 1:
        % for nm, ty in inputs:
            ${nm}${u} = ${nm}_buf[${nm}_off + i${u} * ${nm}_stride0];
        % endfor
    % else:
            ${index_t} rest = i${u};
        % for nm, ty in inputs:
            ${index_t} ${nm}_index = ${nm}_off;
        % endfor
        % for k in reversed(list(dims)):
            {
            % if k > 0:
                ${index_t} coord = rest % size${k};
                rest /= size${k};
            % else:
                ${index_t} coord = rest;
            % endif
            % for nm, ty in inputs:
                ${nm}_index += coord * ${nm}_stride${k};
            % endfor
            }
        % endfor
        % for nm, ty in inputs:
            ${nm}${u} = ${nm}_buf[${nm}_index];
        % endfor
    % endif
        }
% endfor
% for u in lanes:
        if (i${u} < total) {
            const ${index_t} i = i${u};
    % for nm, ty in inputs:
            ${ty} ${nm} = ${nm}${u};
    % endfor
    % for nm, ty in outputs:
            ${ty} ${nm};
    % endfor
            { ${statement} }
    % for nm, ty in outputs:
            ${nm}_buf[${nm}_off + i${u}] = ${nm};
    % endfor
        }
% endfor
    }
}
