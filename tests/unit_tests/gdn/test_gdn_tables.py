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


def test_chunk_table_one_dtype_per_table():
    """H200 regression (eighth session): a caller's int64 chunk_indices gave the autotuned dqkwg kernel a
    tuning of its own (Triton keys on argument dtypes), another config and a dg differing in the last bits
    from the same call with the built int32 table. The launch tables now have one dtype whatever the
    caller passes: int64 offsets, int32 chunk table, contiguous."""
    cu_host = [0, 37, 70, 71, 100]
    want = build_chunk_indices(torch.tensor(cu_host), 32)
    for cu_dt in (torch.int32, torch.int64):
        cu = torch.tensor(cu_host, dtype=cu_dt)
        strided = torch.stack([cu, -cu], 1).reshape(-1)[::2]
        for idx in (None, want.long(), torch.stack([want.long(), -want.long()], 1)[:, 0], want):
            for offsets in (cu, strided):
                nt, cu_k, idx_k = common.chunk_table("op", cu_host, offsets, 1, 100, 32, idx)
                assert nt == want.shape[0]
                assert cu_k.dtype == torch.int64 and cu_k.is_contiguous() and cu_k.tolist() == cu_host
                assert idx_k.dtype == torch.int32 and idx_k.is_contiguous() and torch.equal(idx_k, want)
