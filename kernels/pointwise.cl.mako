## Pointwise and broadcast kernels generated from a C statement.
##
## Each work item computes output elements i = get_global_id(0), stepping by the global size
## (grid-stride loop). The output index space has NDIM dimensions (after the caller merged
## every pair of dimensions that is contiguous for all operands); each input reads at
## off + sum_k coord_k * stride_k, with stride 0 along broadcast dimensions. Outputs are dense.
##
## Template parameters:
##   name        kernel name
##   ndim        number of dimensions of the index space (>= 1)
##   inputs      list of (name, OpenCL C type) read before the statement
##   outputs     list of (name, OpenCL C type) the statement assigns
##   scalars     list of (name, OpenCL C type) passed by value
##   statement   C statement(s) that assign every output from inputs and scalars
##   index_t     "int" when every index fits in 31 bits, else "long" (integer division is
##               several times cheaper in 32 bits on GPUs)
##   preamble    extra C code placed before the kernel (helper functions), may be ""
<%
    dims = range(ndim)
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
    for (${index_t} i = get_global_id(0); i < total; i += get_global_size(0)) {
% if ndim == 1:
    % for nm, ty in inputs:
        ${ty} ${nm} = ${nm}_buf[${nm}_off + i * ${nm}_stride0];
    % endfor
% else:
        ${index_t} rest = i;
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
        ${ty} ${nm} = ${nm}_buf[${nm}_index];
    % endfor
% endif
% for nm, ty in outputs:
        ${ty} ${nm};
% endfor
        { ${statement} }
% for nm, ty in outputs:
        ${nm}_buf[${nm}_off + i] = ${nm};
% endfor
    }
}
