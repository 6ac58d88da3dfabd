"""mindspeed_ops.integrations.fla_compat: with the shim installed, transformers' modeling code binds our
chunk_gated_delta_rule where it probes flash-linear-attention (a fresh interpreter each: the probe
runs when the modeling module is imported); a real fla is never shadowed."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]


def _python(code: str, extra_path: str = "") -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         timeout=300, cwd=str(ROOT))
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    return out.stdout


def test_transformers_binds_our_kernels():
    out = _python("""
        import importlib.util, inspect, torch
        from mindspeed_ops.integrations import fla_compat
        if importlib.util.find_spec("transformers.models.qwen3_next") is None:
            print("SKIP"); raise SystemExit
        assert fla_compat.install() is True and fla_compat.install() is True
        import fla
        assert fla_compat.is_shim(fla) and fla.__version__ == fla_compat.SHIM_VERSION
        from mindspeed_ops import api
        from transformers.models.qwen3_next import modeling_qwen3_next as mq

        def probe(fn):
            # (the implementation transformers bound where it probes fla, its own PyTorch function); from 5.25 the
            # probing wrapper sits inside a `kernels` Func module, which keeps CPU inputs on the PyTorch function
            if not inspect.isfunction(fn):
                fn = inspect.getclosurevars(type(fn).forward).nonlocals["func"]
            return inspect.getclosurevars(fn).nonlocals["implementation"], fn.__wrapped__

        bound, torch_fn = probe(mq.torch_chunk_gated_delta_rule)
        assert bound is api.chunk_gated_delta_rule, bound
        from transformers.utils import is_flash_linear_attention_available
        assert not is_flash_linear_attention_available()
        # the bound call takes HF's keywords and matches HF's own PyTorch function
        torch.manual_seed(0)
        q, k = torch.randn(1, 20, 2, 16), torch.randn(1, 20, 2, 16)
        v, g, b = torch.randn(1, 20, 4, 16), -torch.rand(1, 20, 4), torch.rand(1, 20, 4)
        kw = dict(g=g, beta=b, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=None)
        o_ref, s_ref = torch_fn(q, k, v, **kw)
        for o, s in (bound(q, k, v, **kw), mq.torch_chunk_gated_delta_rule(q, k, v, **kw)):
            assert (o - o_ref).abs().max() < 1e-4 and (s - s_ref).abs().max() < 1e-4
        # chunk_kda: ours when this build has it, else transformers keeps its PyTorch function
        if importlib.util.find_spec("transformers.models.kimi_linear") is not None:
            from transformers.models.kimi_linear import modeling_kimi_linear as mk
            impl, kda_torch_fn = probe(mk.chunk_kimi_delta_attention)
            has = callable(getattr(api, "chunk_kda", None))
            assert (impl is getattr(api, "chunk_kda", None)) == has, impl
            assert (impl is kda_torch_fn) != has
        fla_compat.uninstall()
        assert "fla" not in __import__("sys").modules
        print("OK")
    """)
    assert out.strip().splitlines()[-1] in ("OK", "SKIP")


def test_real_fla_is_never_shadowed(tmp_path):
    pkg = tmp_path / "fla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '0.4.0'\nREAL = True\n")
    out = _python("""
        from mindspeed_ops.integrations import fla_compat
        assert fla_compat.fla_installed()
        assert fla_compat.install() is False
        import sys
        sys.meta_path.append(fla_compat._ShimFinder())  # even a hook put there by hand must not serve
        import fla
        assert getattr(fla, "REAL", False) and not fla_compat.is_shim(fla)
        try:
            import fla.ops.gated_delta_rule  # the real package has no such module: the shim must not add it
        except ModuleNotFoundError:
            print("OK")
    """, extra_path=str(tmp_path))
    assert out.strip() == "OK"
