"""Graph breaks: close the partial graph, run the instruction natively, continue in resume functions.

When the captured frame meets an instruction capture cannot model,
:class:`~kiln.capture.breaks.rollback.BreakTracer` rolls the symbolic state back
to just before it. This module then builds the frame's new code: call the
graph compiled from the ops so far, replay the pending side effects, rebuild
the stack values and live locals from the graph's outputs, run the
instruction itself in Python, and return the result of a ``resume_at_<offset>``
continuation (two for a conditional jump), which the frontend's
``wrap_callable`` compiles in turn when first called.

Grad-mode ``with`` blocks open at the break are entered again natively (an
exception at the instruction leaves them). Inside a ``try`` (or another
``with``), a call or truth test that raises runs again in an uncompiled
continuation starting at it (which keeps the exception table) with a
:class:`~kiln.capture.breaks.frame.Reraise` in its place, so the user's handlers
see the exception; other instructions there run in that continuation directly, as does,
anywhere, an instruction without a Python equivalent to call here. Where the
frame cannot be resumed soundly the original
:class:`~kiln.capture.errors.Unsupported` is raised again and the frame runs
eagerly.
"""

from __future__ import annotations

import dis
import functools
import logging
import operator
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import counters, dispatch, parallel_modules, user_words
from kiln.capture.breaks.frame import (
    MAX_RESUME_NESTING,
    Continuations,
    Frame,
    Named,
    NotResumable,
    Reraise,
    cannot,
    check_shared_iterators,
    flat_values,
    live_values,
)
from kiln.capture.breaks.rollback import BreakState, break_state
from kiln.capture.bytecode.versions import VERSION
from kiln.capture.contexts import AutocastValue, ExitValue
from kiln.capture.emit import _replay, _Writer, assemble, graph_outputs
from kiln.capture.errors import CaptureError, Unsupported
from kiln.capture.result import (
    CaptureResult,
    CompileGraph,
    GraphBreak,
    close_capture,
    compile_partial,
    split_method,
)
from kiln.capture.tracer import CO_GENERATOR_LIKE
from kiln.capture.values.base import NULL, Value, callable_and_args
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.functions import (
    BoundMethodValue,
    UserFunctionValue,
)
from kiln.capture.values.iterators import IteratorValue
from kiln.capture.values.objects import ObjectValue

__all__ = ["MAX_RESUME_NESTING", "capture_after_break"]

log = logging.getLogger(__name__)
graph_log = logging.getLogger("kiln.capture.graph")
breaks_log = logging.getLogger("kiln.capture.graph_breaks")

_JUMPS_IF = {
    "POP_JUMP_IF_TRUE": "{}",
    "POP_JUMP_FORWARD_IF_TRUE": "{}",
    "POP_JUMP_BACKWARD_IF_TRUE": "{}",
    "POP_JUMP_IF_FALSE": "not {}",
    "POP_JUMP_FORWARD_IF_FALSE": "not {}",
    "POP_JUMP_BACKWARD_IF_FALSE": "not {}",
    "POP_JUMP_IF_NONE": "{} is None",
    "POP_JUMP_FORWARD_IF_NONE": "{} is None",
    "POP_JUMP_BACKWARD_IF_NONE": "{} is None",
    "POP_JUMP_IF_NOT_NONE": "{} is not None",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "{} is not None",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "{} is not None",
}
_JUMPS_OR_POP = {"JUMP_IF_TRUE_OR_POP": "{}", "JUMP_IF_FALSE_OR_POP": "not {}"}
# The natively-run binary and compare ops: the same symbol tables the evaluator uses.
_BINARY = {**dispatch.BINARY, **dispatch.COMPARE}
_UNARY = {
    "UNARY_NEGATIVE": operator.neg,
    "UNARY_POSITIVE": operator.pos,
    "UNARY_INVERT": operator.invert,
    "UNARY_NOT": operator.not_,
    "GET_ITER": iter,
}


def _in(a: Any, b: Any) -> bool:
    return a in b


def _not_in(a: Any, b: Any) -> bool:
    return a not in b


def _import(name: str, f_globals: dict[str, Any], level: int, fromlist: Any) -> Any:
    return __import__(name, f_globals, None, fromlist, level)


def _slice(container: Any, start: Any, stop: Any) -> Any:
    return container[start:stop]


@functools.cache
def _bool_of(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], bool]:
    """``bool(fn(a, b))``: one function per operator, so the emitted code's constant is shared."""

    def truth(a: Any, b: Any) -> bool:
        return bool(fn(a, b))

    return truth


def _format_value(conversion: int, value: Any, spec: str = "") -> str:
    if conversion:
        value = (str, repr, ascii)[conversion - 1](value)
    return format(value, spec)


_RAISING_JUMPS = frozenset(name for name, test in _JUMPS_IF.items() if "None" not in test)


def _raising_stack(state: BreakState, w: _Writer) -> list[Value] | None:
    """The stack to run a call or truth test again with, so that it raises ``__kiln_exc``.

    None for other instructions (they run in an uncompiled continuation).
    """
    raiser = Named(f"{w.const(Reraise)}(__kiln_exc)")
    stack = list(state.stack)
    parts = _call_parts(state)
    if parts is not None:
        at = len(stack) - parts[0]
        stack[at + 1 if stack[at] is NULL else at] = raiser
        return stack
    ins = state.instruction
    if ins.opname == "CALL_FUNCTION_EX":
        fn_at = _star_callable(stack, 4 if (ins.arg or 0) & 1 else 3)
        if fn_at is not None:
            stack[fn_at] = raiser  # f(*args, **kwargs): ``func`` is compiled on its own
            return stack
        return None
    if ins.opname in _RAISING_JUMPS:
        stack[-1] = raiser
        return stack
    return None


def _grad_mode_exits(state: BreakState) -> list[ExitValue] | None:
    """The grad-mode ``with`` blocks around the instruction, if nothing else catches there.

    None when a ``try`` (or another kind of ``with``) handles an exception raised
    at the instruction: then it has to run inside the original code.
    """
    tr = state.tracer
    exits = [v for v in state.stack if isinstance(v, ExitValue)]
    blocks = 0
    entry = tr._handler_for(state.instruction.offset)
    while entry is not None:
        at = tr.index_of[entry[2]]
        ops = [ins.opname for ins in tr.instructions[at : at + 2]]
        if ops != ["PUSH_EXC_INFO", "WITH_EXCEPT_START"]:
            return None
        blocks += 1
        cleanup = tr._handler_for(entry[2])  # the with-handler's own cleanup
        entry = tr._handler_for(cleanup[2]) if cleanup is not None else None
    return exits if blocks == len(exits) else None


def _check_grad_mode(state: BreakState) -> None:
    """The innermost grad-mode ``with`` block open at the break must explain the mode there."""
    if state.contexts_entered:
        raise cannot("a graph break inside an autocast block")
    mode = state.grad_enabled
    for v in state.stack:
        if isinstance(v, ExitValue):
            if isinstance(v.ctx, AutocastValue):
                raise cannot("a graph break inside an autocast block")
            mode = v.ctx.target
    if mode != state.grad_enabled:
        raise cannot("grad mode was switched inside a `with` block before the break")


def _unwind_mode(state: BreakState) -> bool:
    """The grad mode an exception raised before the break leaves: the mode before the
    outermost grad-mode block open at the break, else the break's own mode."""
    for v in state.stack:
        if isinstance(v, ExitValue) and v.ctx.previous:
            return v.ctx.previous[0]
    return state.grad_enabled


def _call_parts(
    state: BreakState,
) -> tuple[int, Value, list[Value], list[Value], tuple[str, ...]] | None:
    """For CALL (and 3.13's CALL_KW): how many stack items it takes, the callable,
    positional and keyword values, and the keywords' names."""
    ins, stack = state.instruction, state.stack
    argc = ins.arg or 0
    names = state.kw_names
    if ins.opname == "CALL_KW" and len(stack) >= argc + 3 and stack[-1].is_constant():
        names, stack = tuple(stack[-1].as_constant()), stack[:-1]
    elif ins.opname != "CALL":
        return None
    if len(stack) < argc + 2:
        return None
    first, second, *args = stack[len(stack) - argc - 2 :]
    fn, args = callable_and_args(first, second, args)
    nkw = len(names)
    taken = argc + 2 + (ins.opname == "CALL_KW")
    return taken, fn, args[: len(args) - nkw], args[len(args) - nkw :], names


def _star_callable(stack: list[Value], n: int) -> int | None:
    """Where CALL_FUNCTION_EX's callable sits among its ``n`` items: beside a NULL (below
    it before 3.13, above it from 3.13 on); None for a method call's stack."""
    if len(stack) < n:
        return None
    if stack[-n] is NULL:
        return len(stack) - n + 1
    if stack[-n + 1] is NULL:
        return len(stack) - n
    return None


def _user_function(v: Value) -> types.FunctionType | None:
    """The real Python function ``v`` calls, when it is a plain (non-generator) function."""
    if not isinstance(v, UserFunctionValue) or not isinstance(v.real, types.FunctionType):
        return None
    if v.real.__code__.co_flags & CO_GENERATOR_LIKE:
        return None
    return v.real


_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _wrapper_runner(v: Value, rest: Continuations) -> parallel_modules.CompiledForward | None:
    """The call of a DDP or FSDP2 module ``v`` with its wrapped forward compiled, or None."""
    m = v.obj if isinstance(v, ObjectValue) else None
    return parallel_modules.native_call(m, rest.wrap_callable) if m is not None else None


def _plain_forward(v: Value) -> types.FunctionType | None:
    """``type(m).forward`` when calling the module ``v`` is just calling it (no hooks)."""
    m = v.obj if isinstance(v, ObjectValue) else None
    if not isinstance(m, torch.nn.Module) or "forward" in vars(m):
        return None
    cls = type(m)
    if (
        cls.__call__ is not torch.nn.Module.__call__
        or cls._call_impl is not torch.nn.Module._call_impl
    ):
        return None
    if any(getattr(m, name, None) for name in _MODULE_HOOKS):
        return None
    module_impl = torch.nn.modules.module
    if any(getattr(module_impl, name, None) for name in _GLOBAL_HOOKS):
        return None
    forward = cls.forward
    if not isinstance(forward, types.FunctionType) or forward.__code__.co_flags & CO_GENERATOR_LIKE:
        return None
    return forward


def _native(state: BreakState, frame: Frame, rest: Continuations) -> list[str]:
    """Lines running the failing instruction in Python, then the continuation(s).

    Values they use are bound in ``frame.lines`` (read before the replay) and
    the instruction's result in ``frame.after``.
    """
    ins, stack = state.instruction, state.stack
    w = frame.writer
    instructions = state.tracer.instructions
    follow = instructions[state.index + 1].offset if state.index + 1 < len(instructions) else -1
    parts = _call_parts(state)
    if parts is not None:
        n, fn, args, kwargs, kw_names = parts
        if isinstance(fn, BoundMethodValue) and _user_function(fn.func) is not None:
            args = [fn.self_value, *args]
            fn = fn.func
        runner, forward = _wrapper_runner(fn, rest), _plain_forward(fn)
        if runner is not None:  # DDP/FSDP2: its own Python, the forward under it compiled
            args = [fn, *args]
            fn = Named(w.const(runner))
        elif forward is not None:  # the module's forward is compiled on its own
            args = [fn, *args]
            fn = Named(w.const(rest.wrap_callable(forward)))
        texts = [frame.expr(a) for a in args]
        user = _user_function(fn)
        if user is not None:  # a function that could not be inlined is compiled on its own
            fn = Named(w.const(rest.wrap_callable(user)))
        texts.extend(
            f"**{{{name!r}: {frame.expr(v)}}}" for name, v in zip(kw_names, kwargs, strict=True)
        )
        result = frame.temp(f"{frame.expr(fn)}({', '.join(texts)})", after=True)
        call = rest.call(follow, [*stack[:-n], Named(result)])
        return [call]
    if ins.opname == "CALL_FUNCTION_EX":
        n = 4 if (ins.arg or 0) & 1 else 3
        fn_at = _star_callable(stack, n)
        if fn_at is None:
            raise cannot("CALL_FUNCTION_EX without a NULL beside the callable")
        kw = f", **{frame.expr(stack[-1])}" if n == 4 else ""
        fn, star_args = stack[fn_at], f"*{frame.expr(stack[-n + 2])}"
        runner = _wrapper_runner(fn, rest)
        forward, user = _plain_forward(fn), _user_function(fn)
        if runner is not None:
            star_args = f"{frame.expr(fn)}, {star_args}"
            fn = Named(w.const(runner))
        elif forward is not None:  # the module's forward is compiled on its own
            star_args = f"{frame.expr(fn)}, {star_args}"
            fn = Named(w.const(rest.wrap_callable(forward)))
        elif user is not None:
            fn = Named(w.const(rest.wrap_callable(user)))
        star = f"{frame.expr(fn)}({star_args}{kw})"
        result = frame.temp(star, after=True)
        call = rest.call(follow, [*stack[:-n], Named(result)])
        return [call]
    if ins.opname == "FOR_ITER":  # a Python iterator: one item, then the body or the exit
        done = w.const(_EXHAUSTED)
        item = frame.temp(f"{w.const(next)}({frame.expr(stack[-1])}, {done})", after=True)
        exhausted = rest.call(_loop_exit(state), stack[:-1])
        body = rest.call(follow, [*stack, Named(item)])
        return [f"if {item} is {done}:", f"    {exhausted}", body]
    if ins.opname in _JUMPS_IF or ins.opname in _JUMPS_OR_POP:
        cond = (_JUMPS_IF | _JUMPS_OR_POP)[ins.opname].format(frame.expr(stack[-1]))
        keep = stack if ins.opname in _JUMPS_OR_POP else stack[:-1]
        taken = rest.call(ins.argval, keep)
        not_taken = rest.call(follow, stack[:-1])
        truth = frame.temp(f"True if {cond} else False", after=True)
        return [f"if {truth}:", f"    {taken}", not_taken]
    fn_text, n = _operator(ins, w, state.tracer.f_globals)
    if fn_text is None:
        if stack and isinstance(stack[-1], IteratorValue):
            # rebuilt as a ResumeIterator, which has no generator methods (send, close, ...)
            raise cannot(f"{ins.opname} on an iterator capture unrolled")
        # no Python equivalent to call: the rest of the frame runs as written from here
        return [rest.call(ins.offset, stack, compiled=False)]
    operands = [frame.expr(v) for v in stack[len(stack) - n :]]
    result = frame.temp(f"{fn_text}({', '.join(operands)})", after=True)
    call = rest.call(follow, [*stack[: len(stack) - n], Named(result)])
    return [call]


_EXHAUSTED = object()  # what ``next(it, default)`` returns at the end of a loop's iterator


def _callee_reports(e: Unsupported, state: BreakState) -> bool:
    """Whether ``e`` was raised inside the callee of the failing call, and the continuation
    compiles that callee on its own: its capture meets the same break and reports it, so
    this frame's split does not count it again."""
    at, ins = e.frame, state.instruction
    line = ins.positions.lineno if ins.positions is not None else None
    if at is None or (at.filename, at.lineno) == (state.tracer.code.co_filename, line):
        return False
    parts = _call_parts(state)
    fn: Value | None = parts[1] if parts is not None else None
    if ins.opname == "CALL_FUNCTION_EX":
        at_fn = _star_callable(state.stack, 4 if (ins.arg or 0) & 1 else 3)
        fn = state.stack[at_fn] if at_fn is not None else None
    if isinstance(fn, BoundMethodValue):
        fn = fn.func
    callee = (_plain_forward(fn) or _user_function(fn)) if fn is not None else None
    # a function wrapping a generator (``@contextmanager``) hands the generator back: its
    # own capture does not run the generator's body, where capture here met the break
    wrapped = getattr(callee, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType) and wrapped.__code__.co_flags & CO_GENERATOR_LIKE:
        return False
    return callee is not None


def _loop_exit(state: BreakState) -> int:
    """Where FOR_ITER goes when its iterator is exhausted (3.12+: past the END_FOR it
    targets, and on 3.13 the POP_TOP after it)."""
    tr = state.tracer
    at = tr.index_of[state.instruction.argval]
    if tr.instructions[at].opname == "END_FOR":
        at += VERSION.for_iter_skips
    return tr.instructions[at].offset


def _operator(
    ins: dis.Instruction, w: _Writer, f_globals: dict[str, Any]
) -> tuple[str | None, int]:
    if ins.opname == "COMPARE_OP" and ins.argrepr.startswith("bool("):
        # 3.13 makes the result a bool here: the jump after it takes only True or False
        fn = _BINARY.get(ins.argrepr[5:-1])
        return (w.const(_bool_of(fn)), 2) if fn is not None else (None, 0)
    if ins.opname in ("BINARY_OP", "COMPARE_OP"):
        fn = _BINARY.get(str(ins.argrepr))
        return (w.const(fn), 2) if fn is not None else (None, 0)
    if ins.opname == "BINARY_SUBSCR":
        return w.const(operator.getitem), 2
    if ins.opname == "CONTAINS_OP":
        return w.const(_not_in if ins.arg else _in), 2
    if ins.opname in _UNARY:
        return w.const(_UNARY[ins.opname]), 1
    if ins.opname == "IMPORT_NAME":  # a first import: (level, fromlist) -> module
        return w.const(functools.partial(_import, ins.argval, f_globals)), 2
    if ins.opname == "BINARY_SLICE":
        return w.const(_slice), 3
    if ins.opname == "FORMAT_VALUE":  # f-string piece: value (and its format spec)
        arg = ins.arg or 0
        return w.const(functools.partial(_format_value, arg & 3)), 2 if arg & 4 else 1
    if ins.opname == "CONVERT_VALUE":  # 3.13's f-string pieces: !s, !r, !a ...
        return w.const((str, repr, ascii)[(ins.arg or 1) - 1]), 1
    if ins.opname in ("FORMAT_SIMPLE", "FORMAT_WITH_SPEC"):  # ... then the formatting
        return w.const(format), 1 if ins.opname == "FORMAT_SIMPLE" else 2
    return None, 0


def _break_record(e: Unsupported) -> GraphBreak:
    return GraphBreak(e.kind, e.explanation, e.hint, e.frame)


def capture_after_break(
    e: Unsupported,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    compile_graph: CompileGraph,
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    started: float,
) -> CaptureResult:
    """The capture of a frame split at ``e``'s instruction; re-raises ``e`` if it cannot be."""
    state = break_state(e)
    if state is None:
        raise e
    try:
        return _split(e, state, fn, args, compile_graph, wrap_callable, started)
    except (NotResumable, Unsupported) as why:
        log.info("cannot resume after the graph break (%s); the frame runs eagerly", why)
        raise e from None
    except Exception:  # a bug here must not change the program: run the frame eagerly
        log.exception("internal error while splitting the graph; the frame runs eagerly")
        counters.bump("capture", "internal_error")
        raise e from None


def _split(
    e: Unsupported,
    state: BreakState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    compile_graph: CompileGraph,
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    started: float,
) -> CaptureResult:
    func, _ = split_method(fn, args)
    tr = state.tracer
    out = tr.out
    _check_grad_mode(state)
    writer = _Writer(func, [])
    frame = Frame(state, func, writer)
    rest = Continuations(state, func, frame, wrap_callable)
    rest.eager_random = rest.eager_random or e.kind == "rng_reseeded"
    in_block = tr._handler_for(state.instruction.offset) is not None
    exits = _grad_mode_exits(state) if in_block else None
    live = list(live_values(state).values())
    check_shared_iterators([*state.stack, *live])
    effects = out.side_effects
    outputs = graph_outputs(TupleValue(flat_values([*state.stack, *live])), effects, out)
    writer.set_outputs(outputs)
    traced_at = time.perf_counter()
    raising = _raising_stack(state, writer) if in_block and exits is None else None
    tail: list[str] = []
    if in_block and exits is None and raising is None:
        # the instruction must run under the enclosing try: the continuation starts at it
        tail = [rest.call(state.instruction.offset, state.stack, compiled=False)]
    reported_later = False  # (the uncompiled rest above calls the callee eagerly)
    native = not tail
    if native:
        tail = _native(state, frame, rest)
        reported_later = _callee_reports(e, state)
    body_lines = ["    " + line for line in frame.after]
    if exits:
        # an exception leaves the grad-mode blocks the way their `with` statements would
        leave = [f"    {frame.expr(v)}(None, None, None)" for v in reversed(exits)]
        frame.after[:] = ["try:", *body_lines, "except BaseException:", *leave, "    raise"]
    elif raising is not None:
        # an exception is raised again at the instruction, inside the user's try
        again = rest.call(state.instruction.offset, raising, compiled=False)
        frame.after[:] = [
            "try:",
            *body_lines,
            "except BaseException as __kiln_exc:",
            f"    {again}",
        ]
    # values are read as the frame held them; then the pending writes happen, then the rest
    replay = _replay(writer, effects)
    # after every other expression (they may name cells); contents alias the frame's values
    make_cells, fill_cells = writer.cell_lines(frame.expr)
    # the text is complete (nothing left to refuse): now the graph is worth compiling
    emitted_at = time.perf_counter()
    head: list[str] = []
    if state.grad_enabled != torch.is_grad_enabled():  # (the frame's mode, restored after tracing)
        # the graph leaves the mode of the break (open blocks are also entered again natively)
        args = (state.grad_enabled,)
        out.create_node("call_function", torch._C._set_grad_enabled, args, {}, None)
    graph = compile_partial(out, outputs, func, compile_graph, " (before a break)")
    if graph.compiled is not None:
        unwind: bool | None = _unwind_mode(state)
        if graph.grad_mode_after is None and unwind == torch.is_grad_enabled():
            unwind = None  # the graph switches no mode, and the one it runs in is the right one
        call = writer.graph_call(graph.compiled, out.inputs, graph.grad_mode_after, unwind)
        head.extend(call)
    compiled_at = time.perf_counter()
    body = [*head, *make_cells, *frame.lines, *fill_cells, *replay, *frame.after, *tail]
    code = _assemble(func, writer, body)
    # a frame that only calls a DDP/FSDP2 module hands over to the forward compiled under it:
    # no graph is split (torch.compile skips such a frame)
    skipped = native and e.kind == "distributed_module"
    skipped = skipped and graph.compiled is None and not rest.compiles
    if skipped:
        breaks_log.debug("%s calls a distributed wrapper module", func.__qualname__)
    elif reported_later:  # one break, one report: the callee's, in its own words
        breaks_log.debug("%s breaks inside a callee compiled on its own", func.__qualname__)
    else:
        where = user_words.function_name(func.__code__)
        breaks_log.info("graph break in %s: %s: %s\n%s", where, e.kind, e.explanation, e.frame)
        counters.bump("graph_breaks", e.kind)
    timings = {
        "trace": traced_at - started,
        "compile": compiled_at - emitted_at,
        "emit": emitted_at - traced_at + time.perf_counter() - compiled_at,
    }
    records = [] if reported_later or skipped else [_break_record(e)]
    passes = (reported_later or skipped) and graph.compiled is None
    return close_capture(fn, func, code, out, graph.graphs, records, timings, passes_through=passes)


def _assemble(fn: types.FunctionType, writer: _Writer, body: list[str]) -> types.CodeType:
    """Compile ``body`` as a function with ``fn``'s signature; a failure runs the frame eagerly."""
    try:
        return assemble(fn.__code__, writer, body)
    except CaptureError as e:
        raise cannot(str(e)) from e
