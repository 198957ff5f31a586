"""Helpers the bytecode and resume tests share: load the corpus, round-trip, compare outcomes.

Test files load this module by path (the tests folder is not a package).
"""

import copy
import importlib.util
import inspect
import sys
import types
from pathlib import Path

from kiln.capture.bytecode import assemble, decode
from kiln.capture.bytecode.build import make_function


def load_sibling(stem):
    """Import ``<stem>.py`` from this folder once, under a private module name."""
    name = f"kiln_test_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def roundtrip_code(code):
    """Decode and assemble ``code`` and every code object nested in its constants."""
    body = decode(code)
    new = {id(c): roundtrip_code(c) for c in body.consts if isinstance(c, types.CodeType)}
    body.consts = [new.get(id(c), c) for c in body.consts]
    for ins in body.instrs:
        if isinstance(ins.arg, types.CodeType):
            ins.arg = new[id(ins.arg)]
    return assemble(body)


def roundtrip(fn):
    """``fn`` rebuilt from its round-tripped code, with the same globals, closure and defaults."""
    return make_function(
        roundtrip_code(fn.__code__),
        fn.__globals__,
        closure=fn.__closure__,
        defaults=fn.__defaults__,
        kwdefaults=fn.__kwdefaults__,
        name=fn.__name__,
        qualname=fn.__qualname__,
    )


def outcome(fn, args, kwargs, repeat=1):
    """What calling ``fn`` on copies of the arguments does: result, drained generator or error.

    With ``repeat`` > 1 the call is made that many times and the outcomes must agree:
    CPython specializes instructions after a few runs, and some mistakes only show then.
    """
    seen = [_outcome_once(fn, args, kwargs) for _ in range(repeat)]
    assert all(o == seen[0] for o in seen), seen
    return seen[0]


def _outcome_once(fn, args, kwargs):
    args, kwargs = copy.deepcopy((args, kwargs))
    try:
        result = fn(*args, **kwargs)
        if inspect.isgenerator(result):
            return ("gen", list(result))
        return ("ok", result)
    except Exception as e:  # compared, not swallowed
        return ("raise", type(e), str(e))
