"""The fla chunked GDN / KDA baselines pass the case's arguments through by keyword (fla's positional order
differs from ours after beta) and refuse chunk sizes other than 64; checked against a stand-in module (the
real fla kernels do not run under the interpreter)."""
import sys
import types

import pytest

from mindspeed_ops.atk import baselines as bl


@pytest.mark.parametrize("name,module,fn", [("fla_chunk_kda", "fla.ops.kda", "chunk_kda"),
                                            ("fla_chunk_gated_delta_rule", "fla.ops.gated_delta_rule",
                                             "chunk_gated_delta_rule")])
def test_fla_chunked_adapters(monkeypatch, name, module, fn):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return "o", "state"

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{fn: fake}))
    ctx = bl.Context(case=None, dims={}, kwargs={"chunk_size": 64}, dtype=None, device="cpu", reference=None,
                     call=None)
    impl = bl.REGISTRY[name].build(ctx)
    assert impl.fn("q", "k", "v", "g", "b", scale=0.5, initial_state="h0", output_final_state=True,
                     use_qk_l2norm_in_kernel=True, cu_seqlens="cu", chunk_size=64) == ("o", "state")
    assert seen["args"] == ("q", "k", "v", "g", "b")
    assert seen["kwargs"] == dict(scale=0.5, initial_state="h0", output_final_state=True,
                                  use_qk_l2norm_in_kernel=True, cu_seqlens="cu")
    ctx.kwargs["chunk_size"] = 32
    with pytest.raises(bl.Skip, match="chunk_size 64"):
        bl.REGISTRY[name].build(ctx)
