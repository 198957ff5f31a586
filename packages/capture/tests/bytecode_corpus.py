"""Functions whose bytecode the bytecode layer must round-trip (decode → assemble → run).

Each entry of ``CASES`` is ``(function, args, kwargs)``; the function is run on
them before and after the round trip and the outcomes compared (generators
are drained, exceptions compared by type and message). The functions cover
the shapes CPython 3.11/3.12 compile differently: loops, comprehensions,
cells, exception handling, ``with``, generators, calls, f-strings, ``match``,
and bodies large enough to need EXTENDED_ARG.
"""

import contextlib
import functools
import math
import operator

GLOBAL_COUNTER = 0


def arith(a, b):
    return (a + b) * (a - b) // 3 % 7**2 - (-a) + (~b) + (a << 2) + (b >> 1) + (a & b | a ^ b)


def float_ops(x, y):
    return x / y, x // y, x % y, abs(x - y), round(x * y, 3), -0.0, 0.0, 1.0, 1, True


def for_loop(xs):
    total = 0
    for x in xs:
        if x % 2:
            continue
        if x > 50:
            break
        total += x
    else:
        total -= 1
    return total


def while_loop(n):
    i, acc = 0, []
    while i < n:
        i += 1
        if i == 3:
            continue
        acc.append(i * i)
        if len(acc) > 10:
            break
    else:
        acc.append(-1)
    return acc


def nested_loops(n):
    out = []
    for i in range(n):
        for j in range(i):
            if (i + j) % 3 == 0:
                out.append((i, j))
            elif j > 4:
                break
    return out


def comprehensions(xs):
    a = [x * 2 for x in xs if x]
    b = {x: x**2 for x in xs}
    c = {x % 3 for x in xs}
    d = sum(x for x in xs if x > 1)
    e = [[y for y in range(x)] for x in xs]
    return a, b, c, d, e


def closure_counter(n):
    count = 0

    def bump(k):
        nonlocal count
        count += k
        return count

    for i in range(n):
        bump(i)
    return count, bump(100)


def cell_argument(x, y):
    def inner():
        return x + y

    x = x * 10
    return inner()


def closure_factory(k):
    def make(m):
        return lambda z: z * k + m

    return [make(i)(2) for i in range(4)]


def try_except(x):
    try:
        r = 10 / x
    except ZeroDivisionError as e:
        r = str(e)
    except (TypeError, ValueError):
        r = "type"
    else:
        r = r * 2
    finally:
        r = (r, "finally")
    return r


def nested_try(xs):
    out = []
    for x in xs:
        try:
            try:
                out.append(1 / x)
            finally:
                out.append("inner")
        except ZeroDivisionError:
            out.append("zero")
            continue
        except TypeError:
            break
    return out


def raise_from(x):
    try:
        try:
            raise KeyError(x)
        except KeyError as e:
            raise ValueError("wrapped") from e
    except ValueError as e:
        return type(e.__cause__).__name__, str(e)


def reraise(x):
    try:
        if x:
            raise RuntimeError("boom")
    except RuntimeError:
        raise
    return "no raise"


def finally_return(x):
    try:
        return x * 2
    finally:
        x = -1


def break_in_finally(xs):
    out = []
    for x in xs:
        try:
            if x == 3:
                raise ValueError
            out.append(x)
        except ValueError:
            out.append("v")
        finally:
            if x > 4:
                break
    return out


def except_star(x):
    try:
        raise ExceptionGroup("g", [ValueError(x), TypeError(x)])
    except* ValueError as eg:
        v = len(eg.exceptions)
    except* TypeError as eg:
        t = len(eg.exceptions)
    return v, t


class Suppress:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", exc[0] is not None))
        return True


def with_statement(x):
    log = []
    with Suppress(log) as s:
        log.append(s is not None)
        if x:
            raise ValueError(x)
        log.append("body")
    with Suppress(log), Suppress(log):
        log.append("two")
    return log


def with_contextlib(x):
    out = []
    with contextlib.suppress(KeyError):
        out.append({}[x])
    with contextlib.ExitStack() as stack:
        stack.callback(out.append, "cb")
        out.append("in")
    return out


def with_return_in_loop(xs):
    log = []
    for x in xs:
        with Suppress(log):
            if x == 2:
                return log
            log.append(x)
    return log


def generator(n):
    for i in range(n):
        if i % 2:
            yield i
    yield from range(3)
    return "done"


def generator_send(n):
    def gen():
        total = 0
        while True:
            got = yield total
            if got is None:
                return total
            total += got

    g = gen()
    next(g)
    out = [g.send(i) for i in range(n)]
    try:
        g.send(None)
    except StopIteration as stop:
        out.append(stop.value)
    return out


def generator_finally(n):
    log = []

    def gen():
        try:
            yield from range(n)
        finally:
            log.append("closed")

    g = gen()
    first = next(g)
    g.close()
    return first, log


def keyword_calls(a, b=2, *args, c, d=4, **kw):
    return a, b, args, c, d, sorted(kw.items())


def call_shapes(xs):
    r1 = keyword_calls(1, c=3)
    r2 = keyword_calls(*xs, c=5, e=6)
    r3 = keyword_calls(**{"a": 1, "c": 2, "z": 3})
    r4 = max(xs, key=lambda v: -v, default=None)
    r5 = sorted(xs, reverse=True)
    return r1, r2, r3, r4, r5


def posonly(a, b, /, c, *, d=1):
    return a - b + c * d


def star_unpack(xs):
    a, *b, c = xs
    (d, e), f = (1, 2), 3
    return a, b, c, d, e, f, [*xs, *b], {**{"k": a}, "j": c}


def fstrings(x, y):
    w = 8
    return f"{x}|{x!r}|{x:>{w}}|{y:.3f}|{x!s:^10}|{'lit'}|{x + 1:05d}"


def slicing(xs):
    xs = list(xs)
    xs[1:3] = [9, 9]
    del xs[0]
    return xs[::-1], xs[1:], xs[:-1], xs[::2]


def match_literal(x):
    match x:
        case 0:
            return "zero"
        case 1 | 2:
            return "small"
        case str() as s if len(s) > 2:
            return "long str " + s
        case None:
            return "none"
        case _:
            return "other"


def match_structure(p):
    match p:
        case (0, 0):
            return "origin"
        case (x, 0) | (0, x):
            return f"axis {x}"
        case [x, y, *rest]:
            return f"seq {x} {y} {rest}"
        case {"kind": "pt", "x": x, **extra}:
            return f"map {x} {extra}"
        case {"kind": k}:
            return f"kind {k}"
        case _:
            return "?"


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y


def match_class(p):
    match p:
        case Point(0, y=0):
            return "origin"
        case Point(x, y) if x == y:
            return "diag"
        case Point(x=x):
            return x
        case int(n):
            return -n
    return None


def walrus(xs):
    out = []
    if (n := len(xs)) > 2:
        out.append(n)
    while (v := xs.pop() if xs else None) is not None:
        out.append(v)
    return out, [y for x in range(5) if (y := x * x) > 3]


def short_circuit(a, b, c):
    x = a and b or c
    y = a or b and c
    z = not a
    w = a if b else c
    return x, y, z, w, (a is None), (b is not None), a < b < c


def none_checks(x):
    out = []
    if x is None:
        out.append("none")
    if x is not None:
        out.append("some")
    return out


def nested_functions(n):
    def outer(a):
        def middle(b):
            def inner(c):
                return a + b + c + n

            return inner

        return middle

    return outer(1)(2)(3)


def decorated(n):
    def deco(f):
        @functools.wraps(f)
        def wrapper(*a, **k):
            return f(*a, **k) * 2

        return wrapper

    @deco
    def f(x, y=1):
        return x + y

    return f(n), f(n, y=n), f.__name__


def use_global(n):
    global GLOBAL_COUNTER
    GLOBAL_COUNTER += n
    return GLOBAL_COUNTER > 0, math.floor(2.5), operator.add(n, 1)


def delete_locals(x):
    y = x + 1
    del x
    try:
        return x  # noqa: F821
    except UnboundLocalError:
        return ("unbound", y)


def assert_stmt(x):
    try:
        assert x > 0, f"bad {x}"
    except AssertionError as e:
        return str(e)
    return "ok"


def attributes(n):
    class Box:
        pass

    b = Box()
    b.v = n
    b.v += 1
    d = {"k": [1, 2]}
    d["k"][0] += n
    del b.v
    return hasattr(b, "v"), d


def local_import(x):
    import json
    from os import path as p

    return json.dumps({"x": x}), p.join("a", "b")


def recursion(n):
    return 1 if n <= 1 else n * recursion(n - 1)


def dict_literals(a):
    return {"a": a, "b": 2, "c": 3}, {a: 1, 2: a}, dict(x=a, **{"y": 1}), {1, 2, a}


def conditional_expr(x):
    return "pos" if x > 0 else "neg" if x < 0 else "zero"


def string_ops(s):
    return s.upper(), s[::-1], s * 2, s in "abcdef", " ".join([s, s]), "%s-%d" % (s, 3)  # noqa: UP031 (BINARY_OP % on a str)


def augmented_assign(x):
    x += 1
    x -= 2
    x *= 3
    x //= 2
    x **= 2
    x %= 1000
    x |= 1
    x &= 0xFF
    x ^= 3
    x <<= 2
    x >>= 1
    return x


def chained_comparison(a, b, c):
    return a < b <= c, a == b != c, a is b, a in (b, c), a not in [b]


def yield_in_try(n):
    for i in range(n):
        try:
            if i == 2:
                raise KeyError(i)
            yield i
        except KeyError:
            yield "caught"
        finally:
            yield "fin"


def lambda_defaults(n):
    fs = [lambda x, i=i: x + i for i in range(n)]
    return [f(10) for f in fs]


def genexpr_closure(xs, k):
    return list(x * k for x in xs if x != k)


def loop_else_search(xs, target):
    for i, x in enumerate(xs):
        if x == target:
            found = i
            break
    else:
        found = -1
    return found


def exception_in_loop_with(xs):
    log = []
    for x in xs:
        with Suppress(log):
            try:
                1 / x
            except ZeroDivisionError:
                log.append("zero")
                raise
    return log


def unpack_iter(d):
    out = []
    for k, (a, b) in sorted(d.items()):
        out.append(k * a + b)
    return out


def try_finally_continue(xs):
    total = 0
    for x in xs:
        try:
            if x < 0:
                continue
            total += x
        finally:
            total += 100
    return total


def builtins_use(xs):
    return (
        len(xs),
        min(xs),
        max(xs),
        list(zip(xs, xs[1:])),
        list(map(str, xs)),
        any(xs),
        isinstance(xs, list),
    )


def bytes_and_sets(b):
    return b + b"x", frozenset({1, 2}), bytes(b[::-1]), bytearray(b).hex()


def method_calls(xs):
    xs = list(xs)
    xs.sort(key=lambda v: -v)
    xs.append(len(xs))
    xs.extend(range(2))
    return xs.index(len(xs) - 3 if len(xs) > 3 else 0) if xs else None, xs


class Base:
    def describe(self, x):
        return f"base {x}"


class Child(Base):
    def describe(self, x):
        return "child " + super().describe(x * 2)


def uses_super(x):
    return Child().describe(x)


def many_constants_source():
    lines = ["def many_constants(k):", "    t = 0"]
    lines += [f"    t += {i}.5 * k + {i * 1000}" for i in range(300)]
    lines.append("    return t")
    return "\n".join(lines)


def many_locals_source():
    names = [f"v{i}" for i in range(300)]
    lines = ["def many_locals(k):"]
    lines += [f"    {n} = k + {i}" for i, n in enumerate(names)]
    lines.append("    return " + " + ".join(names[::7]))
    return "\n".join(lines)


def long_jumps_source():
    lines = ["def long_jumps(k):", "    total = 0", "    for i in range(k):", "        if i % 2:"]
    lines += [f"            total += i * {j} + {j}" for j in range(200)]
    lines += ["        else:", "            total -= 1", "    return total"]
    return "\n".join(lines)


def _generated():
    space = {}
    for src in (many_constants_source(), many_locals_source(), long_jumps_source()):
        exec(compile(src, "<bytecode_corpus_generated>", "exec"), space)
    return space["many_constants"], space["many_locals"], space["long_jumps"]


many_constants, many_locals, long_jumps = _generated()


def big_try_loop(n):
    out = 0
    for i in range(n):
        try:
            out += i
            out += i * 2
            out += i * 3
            out += i * 4
            out += i * 5
            out += i * 6
            out += i * 7
            out += i * 8
            out += i * 9
            out += i * 10
            out += i * 11
            out += i * 12
            out += i * 13
            out += i * 14
            out += i * 15
            out += i * 16
            out += i * 17
            out += i * 18
            out += i * 19
            out += i * 20
            out += i * 21
            out += i * 22
            out += i * 23
            out += i * 24
            out += i * 25
            out += i * 26
            out += i * 27
            out += i * 28
            out += i * 29
            out += i * 30
            out += i * 31
            out += i * 32
            out += i * 33
            out += i * 34
            out += i * 35
            out += i * 36
            out += i * 37
            out += i * 38
            out += i * 39
            out += i * 40
            if i == 3:
                raise ValueError
        except ValueError:
            out = -out
    return out


def docstring_only(x):
    """A docstring that must stay the function's __doc__."""
    return x


def empty_body():
    pass


def multiple_targets(n):
    a = b = [n]
    a.append(1)
    x, (y, *z) = n, (1, 2, 3)
    return a is b, b, x, y, z


def call_ex(xs, kw):
    def f(*args, **kwargs):
        return args, sorted(kwargs.items())

    return f(*xs, **kw), f(1, *xs, 2, k=3, **kw), f(*xs)


def while_true(n):
    i = 0
    while True:
        i += 1
        if i > n:
            break
        if i % 2:
            continue
    return i


def import_fallback():
    try:
        import not_a_module_kiln  # noqa: F401

        return "imported"
    except ImportError:
        import json as fallback

        return fallback.__name__


def elif_chain(x):
    if x == 0:
        r = "a"
    elif x == 1:
        r = "b"
    elif x == 2:
        r = "c"
    elif x in (3, 4):
        r = "d"
    elif isinstance(x, str):
        r = "e"
    else:
        r = "f"
    return r


class Mat:
    def __init__(self, v):
        self.v = v

    def __matmul__(self, other):
        return Mat(self.v * other.v)


def matmul_and_delete(a, b):
    d = {"k": 1, "j": 2}
    del d["k"]
    m = Mat(a) @ Mat(b)
    box = Mat(0)
    del box.v
    return m.v, d, hasattr(box, "v")


def fstring_debug(x, name):
    return f"{x=}", f"{name!r:>12}", f"{f'{x:03d}'}"


def self_recursive_closure(n):
    def fact(k):
        return 1 if k <= 1 else k * fact(k - 1)

    return fact(n)


def generator_context(n):
    log = []

    @contextlib.contextmanager
    def cm(tag):
        log.append(("in", tag))
        try:
            yield tag * 2
        finally:
            log.append(("out", tag))

    with cm(n) as v, cm(n + 1) as w:
        log.append(v + w)
    return log


def raise_from_none(x):
    try:
        try:
            return {}[x]
        except KeyError:
            raise ValueError(x) from None
    except ValueError as e:
        return e.__cause__ is None, e.__suppress_context__


def returns_everywhere(x):
    try:
        if x == 0:
            return "try"
        1 / (x - 1)
    except ZeroDivisionError:
        return "except"
    else:
        return "else"
    finally:
        x = None


def comprehension_mix(xs):
    pairs = {(a, b) for a in xs for b in xs if a < b}
    table = {a: [b for b in xs if b % a == 0] for a in xs if a}
    return sorted(pairs), table, all(a < 10 for a in xs), any(b > 3 for b in xs)


CASES = [
    (arith, (7, 3), {}),
    (float_ops, (7.5, 2.0), {}),
    (for_loop, (list(range(20)),), {}),
    (for_loop, ([1, 3],), {}),
    (while_loop, (6,), {}),
    (while_loop, (30,), {}),
    (nested_loops, (9,), {}),
    (comprehensions, ([0, 1, 2, 3],), {}),
    (closure_counter, (5,), {}),
    (cell_argument, (2, 3), {}),
    (closure_factory, (3,), {}),
    (try_except, (0,), {}),
    (try_except, (4,), {}),
    (try_except, ("s",), {}),
    (nested_try, ([1, 0, 2, "x", 3],), {}),
    (raise_from, (1,), {}),
    (reraise, (True,), {}),
    (reraise, (False,), {}),
    (finally_return, (3,), {}),
    (break_in_finally, (list(range(8)),), {}),
    (except_star, (1,), {}),
    (with_statement, (0,), {}),
    (with_statement, (1,), {}),
    (with_contextlib, ("k",), {}),
    (with_return_in_loop, ([0, 1, 2, 3],), {}),
    (generator, (7,), {}),
    (generator_send, (4,), {}),
    (generator_finally, (5,), {}),
    (keyword_calls, (1, 2, 3), {"c": 4, "z": 5}),
    (call_shapes, ([3, 1, 2],), {}),
    (posonly, (5, 2, 3), {"d": 4}),
    (star_unpack, ([1, 2, 3, 4, 5],), {}),
    (fstrings, (42, 3.14159), {}),
    (slicing, (range(10),), {}),
    (match_literal, (0,), {}),
    (match_literal, (2,), {}),
    (match_literal, ("hello",), {}),
    (match_literal, (None,), {}),
    (match_literal, (3.5,), {}),
    (match_structure, ((0, 0),), {}),
    (match_structure, ((5, 0),), {}),
    (match_structure, ([1, 2, 3, 4],), {}),
    (match_structure, ({"kind": "pt", "x": 1, "y": 2},), {}),
    (match_structure, ({"kind": "other"},), {}),
    (match_structure, (7,), {}),
    (match_class, (Point(0, 0),), {}),
    (match_class, (Point(2, 2),), {}),
    (match_class, (Point(1, 5),), {}),
    (match_class, (4,), {}),
    (walrus, ([1, 2, 3],), {}),
    (short_circuit, (0, 2, 3), {}),
    (short_circuit, (1, 0, None), {}),
    (none_checks, (None,), {}),
    (none_checks, (0,), {}),
    (nested_functions, (4,), {}),
    (decorated, (3,), {}),
    (use_global, (2,), {}),
    (delete_locals, (1,), {}),
    (assert_stmt, (-1,), {}),
    (assert_stmt, (1,), {}),
    (attributes, (5,), {}),
    (local_import, (1,), {}),
    (recursion, (6,), {}),
    (dict_literals, ("a",), {}),
    (conditional_expr, (-2,), {}),
    (conditional_expr, (0,), {}),
    (string_ops, ("abc",), {}),
    (augmented_assign, (17,), {}),
    (chained_comparison, (1, 2, 2), {}),
    (yield_in_try, (4,), {}),
    (lambda_defaults, (4,), {}),
    (genexpr_closure, ([1, 2, 3, 2], 2), {}),
    (loop_else_search, ([4, 5, 6], 5), {}),
    (loop_else_search, ([4, 5, 6], 9), {}),
    (exception_in_loop_with, ([1, 0, 2],), {}),
    (unpack_iter, ({1: (2, 3), 0: (5, 6)},), {}),
    (try_finally_continue, ([1, -2, 3],), {}),
    (builtins_use, ([3, 1, 2],), {}),
    (bytes_and_sets, (b"ab",), {}),
    (method_calls, ([5, 3, 8],), {}),
    (uses_super, (2,), {}),
    (many_constants, (3,), {}),
    (many_locals, (2,), {}),
    (long_jumps, (9,), {}),
    (big_try_loop, (6,), {}),
    (docstring_only, (1,), {}),
    (empty_body, (), {}),
    (multiple_targets, (4,), {}),
    (call_ex, ([1, 2], {"a": 1}), {}),
    (while_true, (7,), {}),
    (import_fallback, (), {}),
    (elif_chain, (3,), {}),
    (elif_chain, ("s",), {}),
    (elif_chain, (9,), {}),
    (matmul_and_delete, (3, 4), {}),
    (fstring_debug, (7, "kiln"), {}),
    (self_recursive_closure, (6,), {}),
    (generator_context, (2,), {}),
    (raise_from_none, ("k",), {}),
    (returns_everywhere, (0,), {}),
    (returns_everywhere, (1,), {}),
    (returns_everywhere, (3,), {}),
    (comprehension_mix, ([1, 2, 3, 4, 6],), {}),
]
