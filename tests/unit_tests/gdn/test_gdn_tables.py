"""The varlen tables of the GDN/KDA pipelines are built once per packing (gdn.common.device_tables,
sequence_chunks): the same offsets give the same tensors, other offsets or chunk sizes their own, and
the contents are those of the uncached builders."""
import torch

from mindspeed_ops.ops.gdn import common
from mindspeed_ops.varlen import build_chunk_indices


def test_same_packing_same_tables():
    cu = [0, 3, 70, 70, 200]
    a, b = common.device_tables(cu, 64, torch.device("cpu")), common.device_tables(list(cu), 64, "cpu")
    assert a[0] is b[0] and a[1] is b[1]
    assert a[0].tolist() == cu and a[1].tolist() == build_chunk_indices(torch.tensor(cu), 64).tolist()
    c = common.device_tables(cu, 32, "cpu")
    assert c[1] is not a[1] and c[1].tolist() == build_chunk_indices(torch.tensor(cu), 32).tolist()
    d = common.device_tables([0, 3, 71, 71, 200], 64, "cpu")
    assert d[0].tolist() == [0, 3, 71, 71, 200]


def test_sequence_chunks_cached_and_correct():
    cu = [0, 1, 65, 65, 300]
    nt, x, off = common.sequence_chunks(cu, 300, 64, "cpu")
    nt2, x2, off2 = common.sequence_chunks(cu, 300, 64, torch.device("cpu"))
    assert (nt, x, off) == (nt2, x2, off2) and x is x2
    assert nt == 1 + 1 + 0 + 4 and x.tolist() == cu and off.tolist() == [0, 1, 2, 2, 6]
    assert common.sequence_chunks(None, 300, 64, "cpu") == (5, None, None)
