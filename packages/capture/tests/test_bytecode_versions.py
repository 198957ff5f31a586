"""The running Python's version table against what its compiler and interpreter do."""

import dis

from kiln.capture.bytecode import VERSION, Instr, assemble, decode
from kiln.capture.bytecode.build import make_function
from kiln.capture.bytecode.optable import compare_from_oparg, compare_oparg
from kiln.capture.bytecode.versions import TABLES


def test_the_tables_name_real_opcodes_of_their_version():
    assert VERSION in TABLES.values()
    for name in [*VERSION.name_flag_bits, *VERSION.superinstructions]:
        assert name in dis.opmap, name


def compares(a, b):
    c = a < b
    if a >= b:
        return c
    return not c


def test_compare_opargs_round_trip_and_match_the_compiler():
    for op in dis.cmp_op:
        assert compare_from_oparg(compare_oparg(op)) == op
    found = [ins.arg for ins in decode(compares.__code__).instrs if ins.opname == "COMPARE_OP"]
    branch = "bool(>=)" if VERSION.compare_bool_bit else ">="
    assert found == ["<", branch]
    assert compare_from_oparg(compare_oparg(branch)) == branch


def pairs(a, b):
    x, y = a, b
    return x * 10 + y


def test_a_pair_whose_local_index_needs_more_than_four_bits_is_split():
    body = decode(pairs.__code__)
    assert body.varnames == ["a", "b", "x", "y"]
    # twenty locals before x and y push their indices past what a pair's 4 bits hold
    body.varnames = ["a", "b", *(f"pad{i}" for i in range(20)), "x", "y"]
    fn = make_function(assemble(body), {})
    assert fn(3, 4) == 34
    ops = {ins.opname for ins in decode(fn.__code__).instrs}
    assert "STORE_FAST_STORE_FAST" not in ops


def test_superinstructions_decode_to_their_two_names():
    body = decode(pairs.__code__)
    fused = [ins for ins in body.instrs if ins.opname in VERSION.superinstructions]
    assert all(isinstance(ins.arg, tuple) and len(ins.arg) == 2 for ins in fused)
    assert bool(fused) == bool(VERSION.superinstructions)
    assert all(isinstance(ins, Instr) for ins in fused)
