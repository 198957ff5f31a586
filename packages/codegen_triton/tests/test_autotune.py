"""Candidate configs from size hints, and the on-disk winner cache."""

import dataclasses

import torch

from kiln.codegen_triton.autotune import Autotuner, Config, candidate_configs, next_power_of_2
from kiln.codegen_triton.kernel import KernelSource


def _ks(numel, rnumel=1, persistent=True, tile=0):
    return KernelSource(
        "k", "src", rnumel != 1, persistent and rnumel != 1, numel, rnumel, False, tile
    )


def test_pointwise_configs_fit_the_size():
    small = candidate_configs(_ks(100))
    assert small[0] == Config(128, 1, 1) and all(c.XBLOCK <= 1024 for c in small)
    big = candidate_configs(_ks(1 << 20))
    assert big[0].XBLOCK == 1024 and len(big) == 2
    wide = candidate_configs(_ks(1 << 20), max_autotune=True)
    assert len(wide) > len(big) and {c.num_warps for c in wide} == {2, 4, 8}


def test_persistent_reduction_holds_the_whole_row():
    cfgs = candidate_configs(_ks(512, 300))
    assert all(c.RBLOCK == 512 for c in cfgs)
    assert all(c.XBLOCK * c.RBLOCK <= 4096 for c in cfgs)


def test_looped_and_tiled_configs():
    looped = candidate_configs(_ks(64, 100_000, persistent=False))
    assert all(c.RBLOCK <= 2048 for c in looped) and len(looped) >= 2
    tiled = candidate_configs(_ks(64 * 4096, tile=64))
    assert tiled[0].constexprs("tiled") == {"XBLOCK": 32, "YBLOCK": 32}
    assert tiled[0].grid(_ks(64 * 4096, tile=64)) == (2, 128)


def test_outer_reductions_take_wide_short_tiles():
    ks = dataclasses.replace(_ks(2048, 3136, persistent=False), outer=True)
    cfgs = candidate_configs(ks)
    assert cfgs[0] == Config(64, 16, 4)
    assert all(c.XBLOCK >= 8 for c in cfgs)


def test_next_power_of_2():
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 1000, 1024)] == [1, 1, 2, 4, 1024, 1024]


def test_cpu_picks_the_heuristic_and_the_cache_round_trips(tmp_path):
    cfgs = [Config(64), Config(128)]
    tuner = Autotuner("source", cfgs, tmp_path, [])
    ran = []
    assert tuner.choose(lambda c, a: ran.append(c), [1, 2]) == Config(64)
    assert ran == []  # no benchmark without a GPU
    tuner._save(Config(128))
    again = Autotuner("source", cfgs, tmp_path, [])
    assert again.load_cached() == Config(128)
    other = Autotuner("other source", cfgs, tmp_path, [])
    assert other.load_cached() is None
    stale = Autotuner("source", [dataclasses.replace(c, num_warps=8) for c in cfgs], tmp_path, [])
    assert stale.load_cached() is None  # a cached config no longer offered is ignored


def test_damaged_or_foreign_autotune_record_is_ignored(tmp_path):
    cfgs = [Config(64), Config(128)]
    tuner = Autotuner("source", cfgs, tmp_path, [])
    tuner._save(Config(128))
    record = tuner._cache_file()
    for text in ('{"block": 12', '{"unknown_field": 1}', "[1, 2]", ""):
        record.write_text(text)
        assert Autotuner("source", cfgs, tmp_path, []).load_cached() is None


def test_benchmark_scratch_outputs_keep_their_layout(tmp_path, monkeypatch):
    """A written tensor with gaps (a graph output ``h[:, 0]``) is benchmarked through a scratch
    copy laid out as it is: a contiguous clone would be smaller than the kernel's indexing."""
    from kiln.codegen_triton import autotune

    monkeypatch.setattr(autotune, "bench_ms", lambda fn: fn() or 1.0)
    out = torch.full((4, 16, 8), 3.0)[:, 0]
    inp = torch.ones(4, 8)
    seen = []
    tuner = Autotuner("source", [Config(64), Config(128)], tmp_path, [0])
    tuner._benchmark(lambda cfg, args: seen.append(args), [out, inp])
    scratch, read = seen[0]
    assert read is inp and scratch.data_ptr() != out.data_ptr()
    assert scratch.stride() == out.stride() == (128, 1)
    assert scratch.untyped_storage().nbytes() >= (3 * 128 + 8) * 4
    assert torch.equal(scratch, out)
