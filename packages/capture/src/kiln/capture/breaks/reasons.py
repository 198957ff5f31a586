"""Every kind of graph break, with the explanation and hint a user sees.

Capture raises :class:`~kiln.capture.errors.Unsupported` through :func:`unsupported`
with a kind from this registry, so ``explain`` and the graph-break machinery
can group and describe breaks by kind. Add a kind here before raising it.
"""

from __future__ import annotations

import dataclasses

from kiln.capture.errors import Unsupported, UserFrame

__all__ = ["REASONS", "BreakReason", "UserException", "raised", "unsupported"]


@dataclasses.dataclass(frozen=True)
class BreakReason:
    """Why a kind of construct cannot be captured, and what the user can do."""

    explanation: str
    hint: str


REASONS: dict[str, BreakReason] = {
    "data_dependent_branch": BreakReason(
        "control flow depends on the value of a tensor",
        "use torch.where or torch.cond-style tensor ops, or move the branch out of the "
        "compiled function",
    ),
    "data_dependent_value": BreakReason(
        "a Python value is computed from tensor data",
        "keep the computation in tensors (avoid .item(), .tolist(), int(t), bool(t))",
    ),
    "unsupported_opcode": BreakReason(
        "Kiln cannot model this bytecode instruction",
        "move the construct (async code, code compiled for exec) out of the compiled function",
    ),
    "class_statement": BreakReason(
        "a class statement makes a new class object on every call, so Kiln runs it in Python "
        "between two graphs",
        "define the class at module level (or outside the compiled function) to keep one graph",
    ),
    "unsupported_call": BreakReason(
        "Kiln cannot trace into this callable",
        "call it outside the compiled function, or use a pure-Python or torch equivalent",
    ),
    "rng_reseeded": BreakReason(
        "the frame reseeds torch's random generator: the seeding and every random op after it "
        "run eagerly, so they draw the numbers eager draws",
        "seed outside the compiled function where eager's exact random numbers are not needed",
    ),
    "side_effect": BreakReason(
        "the function mutates state that outlives the call (a global, an attribute or a "
        "container passed in)",
        "return the new value instead of mutating, or mutate outside the compiled function",
    ),
    "user_exception": BreakReason(
        "the traced code raises an exception",
        "Kiln runs the function eagerly so Python raises it as usual",
    ),
    "unsupported_tensor": BreakReason(
        "Kiln compiles dense tensors only, not sparse, nested or quantized ones",
        "pass a dense tensor (to_dense(), dequantize(), unbind()) to the compiled function, "
        "or call this part outside it",
    ),
    "unsupported_value": BreakReason(
        "a value of this kind cannot be tracked or returned from a graph",
        "return tensors, constants and containers of them",
    ),
    "unsupported_attribute": BreakReason(
        "Kiln cannot read or write this attribute symbolically",
        "read the attribute outside the compiled function and pass it in",
    ),
    "unsupported_operator": BreakReason(
        "this operator is not supported on these operand types",
        "use torch ops on tensors or plain Python constants",
    ),
    "tensor_op_failed": BreakReason(
        "a torch operation failed on fake tensors (it may need data or lack a meta kernel)",
        "check the shapes and dtypes; call the op outside the compiled function",
    ),
    "inline_limit": BreakReason(
        "the call stack or the loop is too deep to unroll",
        "reduce recursion depth or the number of loop iterations",
    ),
    "unsupported_context": BreakReason(
        "this context manager cannot be entered inside a graph",
        "enter it outside the compiled function",
    ),
    "internal_error": BreakReason(
        "Kiln failed on this frame (a bug in Kiln; the frame runs eagerly)",
        "please report it with the traceback logged under kiln.capture",
    ),
    # raised by kiln.capture.meta while evaluating ops on fake tensors
    "data-dependent operator": BreakReason(
        "an operator's result depends on tensor data",
        "use tensor ops instead of reading values (torch.where instead of `if t:`)",
    ),
    "operator without meta kernel": BreakReason(
        "PyTorch cannot run this operator on fake tensors",
        "call it outside the compiled function",
    ),
    "in-place metadata change": BreakReason(
        "an in-place op changes a tensor's sizes or strides",
        "use the out-of-place op (x = x.t() instead of x.t_())",
    ),
    "autograd_function": BreakReason(
        "a custom torch.autograd.Function's forward or backward cannot be traced soundly (Kiln "
        "traces both to check them before the call becomes one graph node)",
        "keep forward and backward to tensor code on apply's arguments and ctx, without side "
        "effects",
    ),
    "control_flow": BreakReason(
        "a torch.cond or torch.while_loop call Kiln cannot trace into subgraphs (each "
        "function is traced on the operands; its outputs' shapes and dtypes must agree)",
        "keep the branches to tensor code on the operands and closed-over tensors, without "
        "side effects, returning tensors of the same shapes and dtypes",
    ),
    "functorch": BreakReason(
        "a torch.func transform (vmap, grad, vjp, jvp, jacrev, functional_call ...) whose "
        "function Kiln cannot trace into a subgraph",
        "keep the transformed function to tensor code on its arguments and closed-over "
        "tensors, without side effects, and pass the transform's options as constants",
    ),
    "module_hooks": BreakReason(
        "the module has hooks Kiln cannot inline",
        "remove the hooks, or make them plain Python functions",
    ),
    "distributed_module": BreakReason(
        "a DistributedDataParallel or FSDP2 (fully_shard) module runs its own Python (DDP's "
        "gradient-bucket bookkeeping, FSDP's unshard and reshard hooks) as in eager, as "
        "TorchDynamo skips it too; the forward of the module it wraps is compiled on its own",
        "nothing is lost for a model compiled whole (kiln.compile(DDP(model))); inside a "
        "larger function, each such call splits the graph around it",
    ),
}


def unsupported(kind: str, detail: str = "") -> Unsupported:
    """An :class:`Unsupported` of a registered ``kind``; ``detail`` names the culprit."""
    reason = REASONS[kind]
    explanation = f"{reason.explanation}: {detail}" if detail else reason.explanation
    return Unsupported(kind, explanation, reason.hint)


class UserException(Unsupported):
    """A Python exception the traced code raises; handlers in the traced code may catch it.

    Uncaught, it is a ``user_exception`` break: the frame runs eagerly and
    Python raises the exception itself.
    """

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        reason = REASONS["user_exception"]
        super().__init__("user_exception", f"{reason.explanation}: {exc!r}", reason.hint)

    def with_frame(self, frame: UserFrame) -> Unsupported:
        located = UserException(self.exc)
        located.frame = frame
        located.args = (located._message(),)
        return located


def raised(exc: BaseException) -> UserException:
    """The capture-time form of ``raise exc`` inside the traced program."""
    return UserException(exc)
