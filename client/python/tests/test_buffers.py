"""tessera/_buffers.py: the recycled memory of large download results is reused only once no
array views it, and never more of it is kept than the cap."""
from __future__ import annotations

import gc

import numpy as np

from tessera import _buffers

MIB = 1 << 20


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_small_arrays_are_numpys_own() -> None:
    a = _buffers.empty(MIB)
    assert a.dtype == np.uint8 and a.size == MIB and a.flags.owndata


def test_memory_is_reused_only_when_no_array_views_it() -> None:
    pool = _buffers._Pool(256 * MIB)
    a = pool.take(40 * MIB)
    assert a.flags.writeable and a.flags.c_contiguous and a.size == 40 * MIB
    a[:] = 7
    where = address(a)
    view = a[10:20].view(np.int8)
    del a
    gc.collect()
    b = pool.take(40 * MIB)  # the first mapping is still viewed: a new one
    other = address(b)
    assert other != where
    assert (view == 7).all()
    del view, b
    gc.collect()
    assert len(pool._free) == 2
    # Between the size and twice it: both are reused, and nothing new is mapped.
    c, d = pool.take(35 * MIB), pool.take(40 * MIB)
    assert {address(c), address(d)} == {where, other} and not pool._free
    assert (c[:10] == 7).all() or (d[:10] == 7).all()  # not zeroed again: the same pages


def test_no_more_than_the_cap_is_kept() -> None:
    pool = _buffers._Pool(100 * MIB)
    arrays = [pool.take(40 * MIB) for _ in range(3)]
    del arrays
    gc.collect()
    assert sum(len(m) for m in pool._free) <= 100 * MIB and len(pool._free) == 2
    big = pool.take(200 * MIB)  # larger than the cap: never kept
    del big
    gc.collect()
    assert sum(len(m) for m in pool._free) <= 100 * MIB
    assert pool.take(80 * MIB).size == 80 * MIB  # 40 MiB mappings are too small for it


def test_a_cap_of_zero_turns_it_off(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_buffers, "_pool", _buffers._Pool(0))
    assert _buffers.empty(64 * MIB).flags.owndata
