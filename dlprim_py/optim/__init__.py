"""torch.optim for dp.Tensor parameters: SGD, Adam, AdamW, and ``lr_scheduler``.

Updates are fused. An OpenCL kernel cannot take an array of buffers, and moving parameters
into one flat buffer would change where the caller's tensors live (a module's parameters, a
view someone holds), so each update kernel (``kernels/optim.cl.mako``) takes a fixed number of
slots, each one parameter with its gradient and state buffers, their element offsets and its
element count; one launch updates a chunk of up to ``slots`` parameters (8 where the device's
CL_DEVICE_MAX_PARAMETER_SIZE allows, which every full-profile device's 1024 bytes does), so a
group of n parameters costs ceil(n / 8) launches instead of several per parameter. Each work
item walks every slot's elements with a grid-stride loop. Slot k of a launch past the chunk's
parameters has count 0.

What changes from step to step is a scalar kernel argument: the learning rate (which a
scheduler writes into ``param_groups``), momentum and betas (OneCycleLR cycles them), and per
slot Adam's step size lr / (1 - beta1^t) and sqrt(1 - beta2^t) from the parameter's own step
count t (passed once per launch where all its parameters share t, the usual case); SGD's
first-step momentum buffers are a bit mask argument. The template parameters are
only the slot count, the index type and the code paths (weight decay or not, momentum,
nesterov, amsgrad, maximize, decoupled decay). Every chunk position keeps a kernel object of
its own (``dlprim_py.optim.fused``), whose arguments are set only where they changed, so a
repeated step renders no template, builds no program and creates no kernel object.
"""
from . import lr_scheduler  # noqa: F401
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
